package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/verifyerr"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// adminFlags locate the authority and the operator identity of an admin
// command: flags first, then MUSTER_AUTHORITY / MUSTER_IDENTITY, then what
// the data directory holds (DIR/operator.pem and the address the running
// authority recorded).
type adminFlags struct {
	data      string
	authority string
	identity  string
	timeout   time.Duration

	// idPath and id are the operator identity dial loaded: admin renew
	// replaces that file, status reports its expiry.
	idPath string
	id     *identity.Identity
	// quiet: no expiry warning (shell completion prints nothing).
	quiet bool
	// warnAfter: dial leaves the expiry warning to warn, which call runs
	// once the authority has answered, so the warning names what works
	// for an identity the authority no longer accepts.
	warnAfter bool
	warn      func(untrusted bool)
}

func (a *adminFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&a.data, "data", "", "authority data directory (env MUSTER_DATA, default ./muster-data)")
	f.StringVar(&a.authority, "authority", "", "authority address HOST:PORT (env MUSTER_AUTHORITY)")
	f.StringVar(&a.identity, "identity", "", "operator identity file (env MUSTER_IDENTITY)")
	f.DurationVar(&a.timeout, "timeout", 30*time.Second, "how long to wait for the authority")
}

// The listings the NOT_FOUND of a node or token name (notFoundHint): the
// authority's bare "no node" and "no join token" named no way on.
const (
	unknownNodeHint  = "the enrolled nodes: muster agents list"
	unknownTokenHint = "the tokens and their IDs: muster token list"
)

// notFoundHint adds to the authority's NOT_FOUND for a name the operator
// gave (a typo, or one deleted already) the listing that names what there
// is, with the flags that reached this authority, which the authority
// cannot name: hint ends with that listing's command. Other errors pass
// unchanged.
func (a *adminFlags) notFoundHint(err error, hint string) error {
	s, ok := status.FromError(err)
	if !ok || s.Code() != codes.NotFound {
		return err
	}
	p := s.Proto()
	// The flags are appended to the formatted text, as the expiry
	// warning's are, so the command reads as one to the hint checker.
	p.Message = p.Message + "; " + hint + a.callArgs()
	return status.FromProto(p).Err()
}

// callArgs are the flags an admin command a hint names needs to reach the
// authority this command reached, with the identity it used: the ones
// given on this command line (--data, --authority, --identity). Without
// them a pasted `muster admin renew` would renew the data directory's
// operator.pem, another operator's identity, or find no authority, and a
// pasted `muster lock list` ask another authority. The variables need
// nothing: the shell that pastes it has them.
func (a *adminFlags) callArgs() string {
	var b strings.Builder
	for _, f := range []struct{ name, val string }{{"data", a.data}, {"authority", a.authority}, {"identity", a.identity}} {
		if f.val != "" {
			fmt.Fprintf(&b, " --%s %s", f.name, shellword.Quote(f.val))
		}
	}
	return b.String()
}

type adminClient struct {
	musterv1.AdminServiceClient
	conn *grpc.ClientConn
}

func (c *adminClient) Close() error { return c.conn.Close() }

func (a *adminFlags) dial(env *Env) (*adminClient, error) {
	// A deadline already passed would be reported as the authority's
	// DEADLINE_EXCEEDED.
	if a.timeout <= 0 {
		return nil, fmt.Errorf("--timeout %s: give a positive duration, e.g. --timeout 30s", a.timeout)
	}
	data := firstOf(a.data, env.Getenv("MUSTER_DATA"), "muster-data")
	dir := datadir.Dir(data)
	idPath := firstOf(a.identity, env.Getenv("MUSTER_IDENTITY"))
	if idPath == "" {
		idPath = dir.OperatorFile()
	}
	id, err := identity.Load(idPath)
	if err != nil {
		return nil, fmt.Errorf("%w (give an operator identity with --identity or MUSTER_IDENTITY)", err)
	}
	me, err := id.ID()
	if err != nil {
		return nil, err
	}
	a.idPath, a.id = idPath, id
	a.warn = func(untrusted bool) {
		if !a.quiet {
			warnExpiry(env, idPath, id, me.Name, firstOf(a.data, env.Getenv("MUSTER_DATA")), a.callArgs(), untrusted, time.Now())
		}
	}
	if !a.warnAfter {
		a.warn(false)
	}
	addr, from := a.authority, "--authority"
	if addr == "" {
		addr, from = env.Getenv("MUSTER_AUTHORITY"), "MUSTER_AUTHORITY"
	}
	// Without a port the dialer would try 443 and report only that
	// nothing answered there.
	if addr != "" {
		if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
			return nil, fmt.Errorf("%s %q is not HOST:PORT: give the authority's address with its port, e.g. --authority %s",
				from, addr, shellword.Quote(net.JoinHostPort(strings.Trim(addr, "[]"), "7443")))
		}
	}
	if addr == "" {
		rec, err := dir.ReadAddress()
		if err != nil {
			return nil, err
		}
		addr = rec.Address
	}
	// The authority is whoever holds an authority certificate of our trust
	// domain under the root our identity was issued with.
	// A call refused because the authority's certificate did not verify
	// carries that refusal, typed (untrustedAuthorityHint).
	tc, watched := verifyerr.Watch(identity.ClientTLS(id, id.RootPool(), identity.MatchRole(me.TrustDomain, spiffeid.RoleAuthority)))
	conn, err := grpc.NewClient(addr, append(watched,
		grpc.WithTransportCredentials(credentials.NewTLS(tc)),
		grpc.WithChainUnaryInterceptor(withCorrelationID),
	)...)
	if err != nil {
		return nil, err
	}
	return &adminClient{AdminServiceClient: musterv1.NewAdminServiceClient(conn), conn: conn}, nil
}

// withCorrelationID sends one ID per call, which the authority puts in the
// audit records the call causes.
func withCorrelationID(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	ctx = metadata.AppendToOutgoingContext(ctx, "x-correlation-id", uuid.NewString())
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (a *adminFlags) context(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, a.timeout)
}

func firstOf(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// call dials the authority, runs f with a deadline, and closes the
// connection; errors are prefixed with the command's name.
func (a *adminFlags) call(cmd *cobra.Command, env *Env, name string, f func(ctx context.Context, c *adminClient) error) error {
	a.warnAfter = true
	c, err := a.dial(env)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	defer c.Close()
	ctx, cancel := a.context(cmd.Context())
	defer cancel()
	err = f(ctx, c)
	a.warn(refusedIdentity(err))
	if err != nil {
		return fmt.Errorf("%s: %w", name, a.lockedHint(a.untrustedAuthorityHint(err)))
	}
	return nil
}

// refusedIdentity reports whether err says the authority does not accept
// the operator identity used: its certificate did not chain to the
// identity's roots (the typed *identity.UntrustedRootError), or the
// authority refused the identity's certificate (UNAUTHENTICATED: with a
// certificate, one under a root it no longer trusts or another it does
// not accept), either way one admin renew cannot renew.
func refusedIdentity(err error) bool {
	if untrusted := (*identity.UntrustedRootError)(nil); errors.As(err, &untrusted) {
		return true
	}
	return status.Code(err) == codes.Unauthenticated
}

// untrustedAuthorityHint adds to err, when the authority's certificate did
// not chain to the roots of the operator identity used, the way out. The
// usual cause is a root rotation that went to standby while this identity
// was left under the old root (a copy of the data directory on another
// replica, or an operator who did not run muster admin renew in time):
// it can neither reach the authority nor renew, and the transport's
// UNAVAILABLE said only that the authority could not be reached. The
// status code is kept. The case is the *identity.UntrustedRootError the
// CLI's verification of the authority returned, carried past gRPC by
// verifyerr, never an error's text, which a server could send.
func (a *adminFlags) untrustedAuthorityHint(err error) error {
	if untrusted := (*identity.UntrustedRootError)(nil); a.id == nil || !errors.As(err, &untrusted) {
		return err
	}
	name := "NAME"
	if me, idErr := a.id.ID(); idErr == nil {
		name = me.Name
	}
	data := firstOf(a.data, "DIR")
	// Named with the binary that opens the directory's keys: muster-pkcs11
	// where they are in a token, which the static muster cannot open.
	bin, where := breakGlassBin(a.data)
	hint := fmt.Sprintf("the authority's certificate does not chain to the roots in %s: if the authority's root was rotated to standby after this identity was issued, get a new one where the authority's data directory is: %s admin add %s --offline --data %s --out %s%s (add --config FILE where the authority is started with one, as the packaged unit is with /etc/muster/authority.yaml, or --store URL), then use it with --identity (docs/ca-lifecycle.md, \"Root rotation\")",
		a.idPath, bin, name, shellword.Quote(data), shellword.Quote(name+"-new.pem"), where)
	s, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%w; %s", err, hint)
	}
	p := s.Proto()
	p.Message += "; " + hint
	return status.FromProto(p).Err()
}

// lockedHint adds to the authority's bare "locked" (DESIGN.md's word; the
// audit record names the lock) whose lock it is and who lifts it: a
// locked operator cannot, and was told nothing it could act on.
func (a *adminFlags) lockedHint(err error) error {
	s, ok := status.FromError(err)
	if !ok || s.Code() != codes.PermissionDenied || s.Message() != "locked" || a.id == nil {
		return err
	}
	me, idErr := a.id.ID()
	if idErr != nil {
		return err
	}
	p := s.Proto()
	p.Message += fmt.Sprintf("; a lock on the operator %s (%s) refuses its every call: another operator finds it with muster lock list and lifts it with muster lock delete LOCK-ID", me.Name, a.idPath)
	return status.FromProto(p).Err()
}

// callAdmin is call for a single RPC whose response the command prints.
func callAdmin[T any](cmd *cobra.Command, env *Env, af *adminFlags, name string, f func(ctx context.Context, c *adminClient) (T, error)) (T, error) {
	var resp T
	err := af.call(cmd, env, name, func(ctx context.Context, c *adminClient) error {
		var err error
		resp, err = f(ctx, c)
		return err
	})
	return resp, err
}

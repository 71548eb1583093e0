// Package agent is the machine side of muster (DESIGN.md "Join methods",
// "Renewal" and "Agent data directory"): it joins an authority with a join
// token, keeps the identity it gets in a data directory, and renews it over
// mTLS at about half its lifetime.
//
// Trust comes before secrets: the agent sends a token's secret only to a
// server whose certificate chains to a root it pinned and carries the
// authority's SPIFFE ID (spiffe://TD/authority/AUTHORITY_ID). It pins the
// root from the trust bundle signed with the token (kubeadm's cluster-info
// signing), and additionally checks the bundle against a CA fingerprint
// when one is given.
//
// Keys are written to disk before they are sent in a request, so a lost
// reply is retried with the same key and answered with the certificate the
// authority already issued; a failed join leaves no certificate files.
package agent

import (
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/errinfo"
	"github.com/muster-dev/muster/internal/h2window"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/verifyerr"
)

// DefaultTimeout bounds each RPC.
const DefaultTimeout = 30 * time.Second

// skew is the allowance for another machine's clock (DESIGN.md: ±2 min).
const skew = 2 * time.Minute

// maxChainSize bounds the PEM chain the agent parses from a reply.
const maxChainSize = 64 << 10

var (
	// ErrIdentityExists refuses a join over an identity without Force.
	ErrIdentityExists = errors.New("the data directory already holds an identity: use --force to join again (the old identity stays until the new join succeeds)")
	// ErrTrustBundle reports a trust bundle that does not verify with the
	// token: the authority answers every token ID, and only the holder
	// of the right secret can verify its answer.
	ErrTrustBundle = errors.New("unknown join token or wrong secret")
	// ErrFingerprint reports a trust bundle without a root of the pinned
	// CA fingerprint.
	ErrFingerprint = errors.New("no root of the authority's trust bundle matches the CA fingerprint")
)

// OpError says which operation (join or renewal) failed.
type OpError struct {
	Op  string
	Err error
}

func (e *OpError) Error() string { return e.Op + " failed: " + e.Err.Error() }
func (e *OpError) Unwrap() error { return e.Err }

// ExpiredError refuses to renew a certificate past its NotAfter: the
// authority would refuse it, and only a new join can help. Dir and Node,
// when known, name that join as a command for this machine. Bound is a
// bound-keypair agent's, which needs none: agent run recovers with the
// bound key.
type ExpiredError struct {
	NotAfter time.Time
	Dir      Dir
	Node     string
	Bound    bool
}

func (e *ExpiredError) Error() string {
	if e.Bound {
		return fmt.Sprintf("certificate expired at %s; muster agent run recovers it with the bound key", e.NotAfter.UTC().Format(time.RFC3339))
	}
	msg := fmt.Sprintf("certificate expired at %s; join again with a new token", e.NotAfter.UTC().Format(time.RFC3339))
	if e.Dir != "" && e.Node != "" {
		msg += ": " + RejoinCommand(e.Dir, e.Node)
	}
	return msg
}

// RejoinCommand is the way back for a machine whose identity the
// authority no longer renews: a join over it, bound to its node.
func RejoinCommand(dir Dir, node string) string {
	return fmt.Sprintf("muster agent join --force --data %s --node %s with a joining URI from muster token create --node %s", shellword.Quote(string(dir)), node, node)
}

// refusal is a verdict the agent reaches without asking, classed with the
// gRPC code the authority gives the same verdict, so it prints (and is
// treated as permanent) like one.
type refusal struct {
	code codes.Code
	err  error
}

func (r *refusal) Error() string              { return r.err.Error() }
func (r *refusal) Unwrap() error              { return r.err }
func (r *refusal) GRPCStatus() *status.Status { return status.New(r.code, r.err.Error()) }

// Options configure an Agent.
type Options struct {
	Dir Dir
	// Log receives one record per join, renewal and failure; nil
	// discards them.
	Log *slog.Logger
	// Metrics, if set, is updated by every join and renewal.
	Metrics *Metrics
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Timeout bounds each RPC; zero means DefaultTimeout.
	Timeout time.Duration
	// Authority, if set, is the address renewals use instead of the one
	// in agent.yaml or state.json (the authority moved).
	Authority string
	// StaticVerifiers is MUSTER_TASK_SIGNING_PUBKEYS: a transition list of
	// task verifiers accepted besides the verifier set.
	StaticVerifiers string
	// OnIdentity, if set, is called after every join, renewal, refresh
	// or recovery this agent attempts, failed ones too (they may have
	// written part of a new identity): the Workload API reloads the
	// files and pushes what changed to its streams.
	OnIdentity func()
}

// Agent joins and renews for one data directory. Its methods are safe
// for concurrent use: they serialise on a lock of the directory, which
// also keeps other processes out.
type Agent struct {
	dir       Dir
	log       *slog.Logger
	metrics   *Metrics
	now       func() time.Time
	timeout   time.Duration
	authority string
	// staticVerifiers is Options.StaticVerifiers.
	staticVerifiers string

	failuresMu sync.Mutex
	// failures counts refused tasks by the signer version they named,
	// for heartbeats.
	failures map[string]int64

	// trustChanged is signalled (without blocking) whenever the agent
	// takes a new verifier set, so the stream sends a heartbeat at once.
	trustChanged chan struct{}
	// standingRefused is signalled (without blocking) when the authority
	// refuses the stream for the node's standing (locked, deleted,
	// superseded): Run renews at once, and a renewal refused the same way
	// stops the agent, instead of its reconnecting for hours until the
	// renewal was due.
	standingRefused chan struct{}
	// streamWake is signalled (without blocking) when a renewal, refresh
	// or recovery succeeds, to end the stream's wait to reconnect.
	streamWake chan struct{}
	// retryWake is signalled (without blocking) when a stream to the
	// authority opens, to end a renewal's, refresh's or recovery's wait
	// after a transient failure: the authority is reachable again.
	retryWake chan struct{}

	onIdentity func()
	jwts       jwtCache
	authConn   authorityConn
}

// wake signals ch (one of the agent's wake channels, buffered by one)
// without blocking: a wake already pending stands for this one.
func wake(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// drainWake discards a wake pending on ch: one signalled before the
// caller's wait began says nothing of what happens during it.
func drainWake(ch <-chan struct{}) {
	select {
	case <-ch:
	default:
	}
}

// New returns an agent for o.Dir.
func New(o Options) *Agent {
	a := &Agent{dir: o.Dir, log: o.Log, metrics: o.Metrics, now: o.Now, timeout: o.Timeout, authority: o.Authority,
		staticVerifiers: o.StaticVerifiers, trustChanged: make(chan struct{}, 1),
		standingRefused: make(chan struct{}, 1), streamWake: make(chan struct{}, 1), retryWake: make(chan struct{}, 1), onIdentity: o.OnIdentity}
	if a.log == nil {
		a.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if a.now == nil {
		a.now = time.Now
	}
	if a.timeout <= 0 {
		a.timeout = DefaultTimeout
	}
	return a
}

// identityWritten tells Options.OnIdentity that the identity files may
// have changed.
func (a *Agent) identityWritten() {
	if a.onIdentity != nil {
		a.onIdentity()
	}
}

func dial(addr string, tc *tls.Config) (*grpc.ClientConn, error) {
	// A call that fails because tc refused the authority's certificate
	// carries that refusal, typed (untrustedAuthorityHint).
	tc, watched := verifyerr.Watch(tc)
	conn, err := grpc.NewClient(addr, append(append(h2window.DialOptions(), watched...), grpc.WithTransportCredentials(credentials.NewTLS(tc)))...)
	if err != nil {
		return nil, fmt.Errorf("agent: authority address %q: %w", addr, err)
	}
	return conn, nil
}

// csrFor is a proof of possession of key: the authority takes its public
// key and ignores every other field.
func csrFor(key crypto.Signer) ([]byte, error) {
	return x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
}

// verifyIssued checks a certificate chain an authority answered with: its
// leaf certifies key, chains to roots for client authentication, and names
// want. It returns the chain without any root.
func verifyIssued(chainPEM string, key crypto.Signer, roots []*x509.Certificate, want spiffeid.ID, now time.Time) ([]*x509.Certificate, error) {
	if len(chainPEM) > maxChainSize {
		return nil, fmt.Errorf("the authority's certificate chain is larger than %d bytes", maxChainSize)
	}
	certs, err := ca.ParseCertsPEM([]byte(chainPEM))
	if err != nil {
		return nil, fmt.Errorf("the authority's certificate chain: %v", err)
	}
	var chain []*x509.Certificate
	for _, c := range certs {
		if identity.IsRoot(c) {
			continue // a root: ours are pinned, not taken from a reply
		}
		chain = append(chain, c)
	}
	if len(chain) == 0 {
		return nil, errors.New("the authority answered without a certificate")
	}
	leaf := chain[0]
	if leaf.IsCA {
		return nil, errors.New("the authority issued a CA certificate, not an agent certificate")
	}
	if !identity.SamePublicKey(key.Public(), leaf.PublicKey) {
		return nil, errors.New("the authority certified a different key than ours")
	}
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	// The authority's clock may run ahead of ours, within the allowance.
	if now.Before(leaf.NotBefore) && leaf.NotBefore.Sub(now) <= skew {
		now = leaf.NotBefore
	}
	if err := identity.VerifyPeer(chain, pool, identity.MatchID(want), x509.ExtKeyUsageClientAuth, now); err != nil {
		return nil, fmt.Errorf("the authority's certificate: %w", err)
	}
	return chain, nil
}

func serialOf(c *x509.Certificate) string { return fmt.Sprintf("%x", c.SerialNumber) }

// resultOf labels an outcome for metrics: ok, the gRPC code, or error.
func resultOf(err error) string {
	if err == nil {
		return "ok"
	}
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return errinfo.CodeWord(se.GRPCStatus().Code())
	}
	return "error"
}

// untrustedAuthorityHint adds to err, when the authority's certificate did
// not chain to a root this agent trusts, the way out an operator runs from
// the agent's data directory. The usual cause is a root rotation that
// went to standby while this agent was stopped: it trusts only the old
// root, which the authority no longer presents nor accepts, so nothing
// the authority sends can vouch for the new root (a bundle is taken only
// over a connection verified by a root held). The status code is kept, so
// the agent keeps retrying (an attacker in the path must not be able to
// stop it) and every retry's warning says what to do. The case is the
// *identity.UntrustedRootError the agent's verification of the authority
// returned (over gRPC, carried by verifyerr), never an error's text.
func untrustedAuthorityHint(err error, st *State, dir Dir) error {
	if untrusted := (*identity.UntrustedRootError)(nil); !errors.As(err, &untrusted) {
		return err
	}
	how := fmt.Sprintf("muster agent join --force --data %s --node %s with a joining URI from muster token create --node %s (or --ca-fingerprint set to the root muster ca root status names)",
		shellword.Quote(string(dir)), st.NodeID, st.NodeID)
	if st.JoinMethod == JoinMethodBoundKeypair {
		// The agent cannot know the root to pin: the one the authority
		// presents did not verify, and taking it would pin whoever
		// answered. The operator reads it where it is trusted, and the
		// command takes it from the environment, so it pastes as printed.
		how = fmt.Sprintf("on the authority, muster ca root status prints the root to pin (\"Joining URIs pin\"); set %s to it here and run muster agent join --force --data %s --node %s --bound-keypair %s %s (a recovery with the bound key)",
			EnvCAFingerprint, shellword.Quote(string(dir)), st.NodeID, shellword.Quote(st.BoundKeypair), rejoinTarget(st, dir))
	}
	hint := fmt.Sprintf("the authority's certificate does not chain to the roots in %s: if the authority's root was rotated while this agent was stopped, join again over this identity, pinned to the current root: %s (docs/ca-lifecycle.md)",
		dir.CAFile(), how)
	return withHint(err, hint)
}

// rejoinTarget is how a join again reaches the authority, as flags: the
// address the state records; for a state from before the address was
// recorded there, the one agent.yaml keeps from the join, else the
// discovery service that join went through and the authority it looked
// up; and only when none is known, a placeholder and where to read it.
func rejoinTarget(st *State, dir Dir) string {
	if st.Authority != "" {
		return "--authority " + shellword.Quote(st.Authority)
	}
	cfg, err := dir.ReadConfig()
	switch {
	case err == nil && cfg.Authority != "":
		return "--authority " + shellword.Quote(cfg.Authority)
	case err == nil && cfg.Discovery != "" && firstNonEmpty(cfg.AuthorityID, st.AuthorityID) != "":
		via := "--discovery " + shellword.Quote(cfg.Discovery)
		if cfg.DiscoveryFingerprint != "" {
			via += " --discovery-fingerprint " + shellword.Quote(cfg.DiscoveryFingerprint)
		}
		return via + " --authority-id " + shellword.Quote(firstNonEmpty(cfg.AuthorityID, st.AuthorityID))
	}
	return "--authority ADDR (ADDR: the authority's API address, its advertise setting, which muster authority --data DIR --check-config prints on the authority's machine)"
}

// withHint adds hint, the way out of err, to err: to a status's message,
// where the CLI prints it, keeping its code and details (the reason word
// tools and retries match on); to any other error's text.
func withHint(err error, hint string) error {
	s, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%w; %s", err, hint)
	}
	p := s.Proto()
	p.Message += "; " + hint
	return status.FromProto(p).Err()
}

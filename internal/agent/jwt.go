package agent

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// jwtCacheSize bounds the JWT-SVIDs kept for reuse, one per audience set.
const jwtCacheSize = 64

// jwtCache keeps minted JWT-SVIDs until half their lifetime is left, so
// workloads that ask often cost the authority one mint per audience set
// every few minutes.
type jwtCache struct {
	mu   sync.Mutex
	toks map[string]cachedJWT
}

type cachedJWT struct {
	token          string
	issued, expiry time.Time
}

// authorityConn is the connection JWT-SVID calls share: dialled once for
// an address, authority, certificate and set of roots, so a mint costs no
// TLS handshake. Each call reads the identity on disk; when it differs
// from the one the connection was made with (a renewal swapped the
// certificate, a rotation the roots), the call dials anew and the old
// connection is closed as soon as the calls in flight on it have ended.
// (It used to be closed a fixed grace of two call timeouts later: an
// agent renewing more often than that held one connection per renewal,
// and with short certificates reached the authority's cap on one agent's
// connections, which then refused its renewals.)
type authorityConn struct {
	mu  sync.Mutex
	key string
	cur *sharedConn
}

// sharedConn is one connection and the calls in flight on it.
type sharedConn struct {
	conn     *grpc.ClientConn
	inflight int
	// retired: no longer handed out; closed once inflight is 0.
	retired bool
}

// get returns the connection for key, dialling it with tc if it is not
// the one held, and counts a call on it until release.
func (c *authorityConn) get(key, addr string, tc func() *tls.Config) (_ *sharedConn, release func(), _ error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil || c.key != key {
		conn, err := dial(addr, tc())
		if err != nil {
			return nil, nil, err
		}
		c.retireLocked()
		c.key, c.cur = key, &sharedConn{conn: conn}
	}
	sc := c.cur
	sc.inflight++
	return sc, sync.OnceFunc(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if sc.inflight--; sc.retired && sc.inflight == 0 {
			sc.conn.Close()
		}
	}), nil
}

// retireLocked stops handing out the held connection and closes it now
// if no call is on it, else when its last call ends. c.mu is held.
func (c *authorityConn) retireLocked() {
	sc := c.cur
	c.key, c.cur = "", nil
	if sc == nil {
		return
	}
	sc.retired = true
	if sc.inflight == 0 {
		sc.conn.Close()
	}
}

// drop stops sharing sc, if it is still the one held, so the next call
// dials anew: a call on it timed out or found the authority unreachable.
// A half-open TCP connection (the authority's host gone without a reset,
// a NAT that forgot the flow) would otherwise make every later call wait
// out its deadline until the kernel gives up on it, many minutes later,
// and gRPC's reconnect backoff (up to two minutes) would fail calls after
// an authority restart. Calls in flight on it finish first, as after a
// renewal.
func (c *authorityConn) drop(sc *sharedConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == sc {
		c.retireLocked()
	}
}

// close closes the held connection (the agent stops).
func (c *authorityConn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.retireLocked()
}

// connKey names what a connection was made with.
func connKey(addr string, authorityID spiffeid.ID, id *identity.Identity) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00", addr, authorityID)
	h.Write(id.Leaf().Raw)
	for _, r := range id.Roots {
		h.Write(r.Raw)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// withAuthority runs f over an mTLS connection to the authority with the
// current identity (the shared authorityConn); it reads the files without
// the directory's lock (a renewal in flight holds it), as the Workload
// API does.
func (a *Agent) withAuthority(ctx context.Context, f func(context.Context, grpc.ClientConnInterface) error) error {
	st, id, err := a.load(false)
	if err != nil {
		return err
	}
	if !a.now().Before(id.Leaf().NotAfter) {
		return &ExpiredError{NotAfter: id.Leaf().NotAfter, Dir: a.dir, Node: st.NodeID, Bound: st.JoinMethod == JoinMethodBoundKeypair}
	}
	authorityID, err := spiffeid.New(st.TrustDomain, spiffeid.RoleAuthority, st.AuthorityID)
	if err != nil {
		return fmt.Errorf("state.json: %w", err)
	}
	addr := a.address(st)
	sc, release, err := a.authConn.get(connKey(addr, authorityID, id), addr,
		func() *tls.Config { return identity.ClientTLS(id, id.RootPool(), identity.MatchID(authorityID)) })
	if err != nil {
		return err
	}
	defer release()
	cctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	err = f(cctx, sc.conn)
	if c := status.Code(err); (c == codes.DeadlineExceeded || c == codes.Unavailable) && ctx.Err() == nil {
		// Not the caller giving up: the connection may be stale.
		a.authConn.drop(sc)
	}
	return err
}

// JWTSVID returns a JWT-SVID of this agent for the audiences, minted by
// the authority (AgentService.MintJWTSVID) or reused while more than half
// of its lifetime is left.
func (a *Agent) JWTSVID(ctx context.Context, audience []string) (string, time.Time, error) {
	aud := slices.Clone(audience)
	slices.Sort(aud)
	key := strings.Join(aud, "\x00")
	now := a.now()
	a.jwts.mu.Lock()
	if c, ok := a.jwts.toks[key]; ok && now.Before(c.issued.Add(c.expiry.Sub(c.issued)/2)) {
		a.jwts.mu.Unlock()
		return c.token, c.expiry, nil
	}
	a.jwts.mu.Unlock()
	var resp *musterv1.MintJWTSVIDResponse
	err := a.withAuthority(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		var err error
		resp, err = musterv1.NewAgentServiceClient(conn).MintJWTSVID(ctx, &musterv1.MintJWTSVIDRequest{Audience: audience})
		return err
	})
	if err != nil {
		return "", time.Time{}, err
	}
	exp := resp.GetExpiresAt().AsTime()
	a.jwts.mu.Lock()
	if a.jwts.toks == nil || len(a.jwts.toks) >= jwtCacheSize {
		a.jwts.toks = map[string]cachedJWT{}
	}
	a.jwts.toks[key] = cachedJWT{token: resp.GetToken(), issued: now, expiry: exp}
	a.jwts.mu.Unlock()
	return resp.GetToken(), exp, nil
}

// JWTBundle returns the authority's JWKS of JWT-SVID keys and, by key
// ID, how long from now the authority keeps publishing each (nil from an
// authority that does not say).
func (a *Agent) JWTBundle(ctx context.Context) ([]byte, map[string]time.Duration, error) {
	var resp *musterv1.GetJWTBundleResponse
	err := a.withAuthority(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		var err error
		resp, err = musterv1.NewAgentServiceClient(conn).GetJWTBundle(ctx, &musterv1.GetJWTBundleRequest{})
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	var pf map[string]time.Duration
	for kid, d := range resp.GetPublishedFor() {
		if pf == nil {
			pf = map[string]time.Duration{}
		}
		pf[kid] = d.AsDuration()
	}
	return resp.GetJwks(), pf, nil
}

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

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// jwtCacheSize bounds the JWT-SVIDs kept for reuse, one per audience set
// (each at most jwtsvid.MaxAudiences of jwtsvid.MaxAudienceLen bytes, as
// the authority mints them: a few KiB an entry).
const jwtCacheSize = 64

// jwtCache keeps minted JWT-SVIDs until half their lifetime is left, so
// workloads that ask often cost the authority one mint per audience set
// every few minutes. Full, it makes room by dropping the tokens no longer
// handed out, then the one asked for least recently: emptying it whole
// (as it did) let one local workload asking for ever new audience sets
// throw away every other workload's tokens each 64 mints, so each of
// their next calls was a mint too.
type jwtCache struct {
	mu   sync.Mutex
	toks map[string]*cachedJWT
	// seq orders the entries by their last use.
	seq uint64
}

type cachedJWT struct {
	token  string
	expiry time.Time
	// reuse is until when the token is handed out again: half its
	// lifetime after it was asked for, on this agent's clock
	// (reuseUntil).
	reuse time.Time
	// used is c.seq at the entry's last use.
	used uint64
}

// get returns the token for key while it is reused at now.
func (c *jwtCache) get(key string, now time.Time) (*cachedJWT, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.toks[key]
	if !ok || !now.Before(e.reuse) {
		return nil, false
	}
	c.seq++
	e.used = c.seq
	return e, true
}

// put keeps e for key, making room first when the cache is full.
func (c *jwtCache) put(key string, e *cachedJWT, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.toks == nil {
		c.toks = map[string]*cachedJWT{}
	}
	if _, ok := c.toks[key]; !ok && len(c.toks) >= jwtCacheSize {
		for k, old := range c.toks {
			if !now.Before(old.reuse) {
				delete(c.toks, k)
			}
		}
		for len(c.toks) >= jwtCacheSize {
			var lru string
			for k, old := range c.toks {
				if lru == "" || old.used < c.toks[lru].used {
					lru = k
				}
			}
			delete(c.toks, lru)
		}
	}
	c.seq++
	e.used = c.seq
	c.toks[key] = e
}

// reuseUntil is until when a token asked for at asked (this agent's
// clock) and answered with expiry exp (the authority's) is reused: half
// its lifetime later, the lifetime the token's own exp less its iat, both
// the authority's clock. Comparing exp with this agent's clock made a
// clock minutes behind the authority's hand out tokens with little or no
// time left (relying parties refuse them), one ahead mint on every call.
// A token that does not say (not a JWT, no iat) falls back on exp.
func reuseUntil(tok string, asked, exp time.Time) time.Time {
	life := exp.Sub(asked)
	if t, err := jwt.ParseSigned(tok, []jose.SignatureAlgorithm{jose.ES256}); err == nil {
		var c jwt.Claims
		if err := t.UnsafeClaimsWithoutVerification(&c); err == nil && c.IssuedAt != nil && c.Expiry != nil {
			life = c.Expiry.Time().Sub(c.IssuedAt.Time())
		}
	}
	return asked.Add(life / 2)
}

// authorityConn is the connection JWT-SVID calls share: dialled once for
// an address, authority, certificate and set of roots, so a mint costs no
// TLS handshake. Each call reads the identity on disk; when it differs
// from the one the connection was made with (a renewal swapped the
// certificate, a rotation the roots), the call dials anew and the old
// connection is closed when the last call on it ends.
//
// Closed then, not after a time: a timer long enough for any call (the
// call timeout, which bounds each) held every connection given up that
// long, and with a long --timeout an agent whose calls kept finding the
// authority unavailable (each dropping the connection: drop) held one
// connection per call, each reconnecting in the background, for minutes.
type authorityConn struct {
	mu  sync.Mutex
	key string
	cur *sharedConn
	// stopped is set by close: a call after it (a workload's, served
	// while agent run shuts down) dialled a connection nothing closed.
	stopped bool
}

// sharedConn is one connection of authorityConn with its calls in flight
// (guarded by authorityConn.mu).
type sharedConn struct {
	conn  *grpc.ClientConn
	calls int
	// retired: no longer shared, closed by the release of its last
	// call (or at once without one). It is reached once: a retired
	// connection is never handed out again.
	retired bool
}

// get returns the connection for key, dialling it with tc if it is not
// the one held, and counts a call on it: the caller releases it when the
// call ends.
func (c *authorityConn) get(key, addr string, tc func() *tls.Config) (*sharedConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil, status.Error(codes.Unavailable, "the agent is stopping: it makes no more calls to the authority")
	}
	if c.cur != nil && c.key == key {
		c.cur.calls++
		return c.cur, nil
	}
	conn, err := dial(addr, tc())
	if err != nil {
		return nil, err
	}
	c.retire(c.cur)
	c.key, c.cur = key, &sharedConn{conn: conn, calls: 1}
	return c.cur, nil
}

// release ends a call on sc, closing sc if it was the last and sc is no
// longer shared.
func (c *authorityConn) release(sc *sharedConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sc.calls--
	c.closeIdle(sc)
}

// retire stops sharing sc: closed at once without calls in flight, else
// by the release of the last. Called with mu held.
func (c *authorityConn) retire(sc *sharedConn) {
	if sc == nil {
		return
	}
	sc.retired = true
	c.closeIdle(sc)
}

func (c *authorityConn) closeIdle(sc *sharedConn) {
	if sc.retired && sc.calls == 0 {
		sc.conn.Close()
	}
}

// drop stops sharing sc, if it is still the one held, so the next call
// dials anew: a call on it timed out or found the authority unreachable.
// A half-open TCP connection (the authority's host gone without a reset,
// a NAT that forgot the flow) would otherwise make every later call wait
// out its deadline until the kernel gives up on it, many minutes later,
// and gRPC's reconnect backoff (up to two minutes) would fail calls after
// an authority restart. Calls in flight on it end first, as after a
// renewal.
func (c *authorityConn) drop(sc *sharedConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != sc {
		return
	}
	c.key, c.cur = "", nil
	c.retire(sc)
}

// close closes the held connection (the agent stops); calls in flight on
// it fail, and connections given up before close as their calls end. No
// call dials after it.
func (c *authorityConn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	if c.cur != nil {
		// Never retired (it is the one held): its calls' releases leave
		// it alone.
		c.cur.conn.Close()
	}
	c.key, c.cur = "", nil
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
	sc, err := a.authConn.get(connKey(addr, authorityID, id), addr,
		func() *tls.Config { return identity.ClientTLS(id, id.RootPool(), identity.MatchID(authorityID)) })
	if err != nil {
		return err
	}
	defer a.authConn.release(sc)
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
	if c, ok := a.jwts.get(key, now); ok {
		return c.token, c.expiry, nil
	}
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
	a.jwts.put(key, &cachedJWT{token: resp.GetToken(), expiry: exp, reuse: reuseUntil(resp.GetToken(), now, exp)}, now)
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

package workload

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/jwtsvid"
)

// keysJWT serves the JWKS of the keys it is given, or fails, and counts
// the fetches.
type keysJWT struct {
	mu      sync.Mutex
	jwks    []byte
	pf      map[string]time.Duration
	err     error
	fetches int
	// during, if set, runs while a fetch waits for its answer.
	during func()
}

func (k *keysJWT) JWTSVID(context.Context, []string) (string, time.Time, error) {
	return "", time.Time{}, status.Error(codes.Unimplemented, "not minted here")
}

func (k *keysJWT) JWTBundle(context.Context) ([]byte, map[string]time.Duration, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.fetches++
	if k.during != nil {
		k.during()
	}
	if k.err != nil {
		return nil, nil, k.err
	}
	return k.jwks, k.pf, nil
}

// publish sets how long the authority says it keeps publishing each key.
func (k *keysJWT) publish(pf map[string]time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pf = pf
}

func (k *keysJWT) set(t *testing.T, err error, keys ...jwtsvid.Key) {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	k.err = err
	if len(keys) == 0 {
		return
	}
	iss, err := jwtsvid.NewIssuer(keys...)
	if err != nil {
		t.Fatal(err)
	}
	if k.jwks, err = iss.JWKS(); err != nil {
		t.Fatal(err)
	}
}

func (k *keysJWT) count() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.fetches
}

func newKey(t *testing.T, id string) jwtsvid.Key {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return jwtsvid.Key{ID: id, Priv: priv}
}

func mintWith(t *testing.T, k jwtsvid.Key, aud string) string {
	t.Helper()
	iss, err := jwtsvid.NewIssuer(k)
	if err != nil {
		t.Fatal(err)
	}
	tok, _, err := iss.Mint("spiffe://td/agent/web-2", []string{aud}, time.Now(), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// jwtServer is a Workload API server of trust domain td whose JWT keys
// come from the keysJWT it returns, which holds none yet.
func jwtServer(t *testing.T) (*Server, *keysJWT) {
	t.Helper()
	h := &holder{id: newIdentity(t, "td", 1)}
	src := NewSource(h.load, slog.New(slog.DiscardHandler))
	src.Reload()
	keys := &keysJWT{}
	return NewServer(src, Config{JWT: keys}), keys
}

// TestValidateFetchesAKeyItDoesNotHold: a token signed with a key the
// JWKS held lacks (published since: the agent's copy is up to a minute
// old, or older when the authority was unreachable through rotations)
// makes ValidateJWTSVID fetch the JWKS again and validate with it; the
// authority unreachable then, the answer is UNAVAILABLE, not the
// INVALID_ARGUMENT of a token known to be bad; a key the fresh JWKS lacks
// too is INVALID_ARGUMENT, and asks the authority at most once per
// jwksRetry. Before, a valid token was refused INVALID_ARGUMENT ("no JWT
// authority") until the copy was a minute old and the authority back.
func TestValidateFetchesAKeyItDoesNotHold(t *testing.T) {
	s, keys := jwtServer(t)
	v1, v2, v3 := newKey(t, "v1-a"), newKey(t, "v2-b"), newKey(t, "v3-c")
	keys.set(t, nil, v1)
	ctx := context.Background()
	validate := func(token string) error {
		_, err := s.ValidateJWTSVID(ctx, &workloadpb.ValidateJWTSVIDRequest{Audience: "db", Svid: token})
		return err
	}

	if err := validate(mintWith(t, v1, "db")); err != nil {
		t.Fatalf("a token of the key held: %v", err)
	}
	// jwksRetry later, the JWKS (held for a minute) is still the first.
	ago := func() {
		s.jwksMu.Lock()
		s.jwksAsked = time.Now().Add(-jwksRetry)
		s.jwksMu.Unlock()
	}
	ago()
	keys.set(t, nil, v2, v1)
	if err := validate(mintWith(t, v2, "db")); err != nil {
		t.Fatalf("a token of a key published since the JWKS was fetched: %v", err)
	}
	fetches := keys.count()
	if err := validate(mintWith(t, v3, "db")); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a token of a key the authority does not publish: %v, want INVALID_ARGUMENT", err)
	}
	if got := keys.count(); got != fetches {
		t.Fatalf("%d fetches for a key not held within jwksRetry of the last, want none", got-fetches)
	}

	// The authority unreachable: a key not held cannot be looked up.
	keys.set(t, status.Error(codes.Unavailable, "connection refused"))
	ago()
	if err := validate(mintWith(t, v3, "db")); status.Code(err) != codes.Unavailable {
		t.Fatalf("a key not held, the authority unreachable: %v, want UNAVAILABLE", err)
	}
	if err := validate(mintWith(t, v1, "db")); err != nil {
		t.Fatalf("a token of a key held, the authority unreachable: %v", err)
	}
}

// TestValidateStopsWhenAKeyMayBeUnpublished: an agent that cannot reach
// the authority (down, or refusing the node) validates with a key of its
// copy only as long as the authority said, when the copy was fetched, it
// keeps publishing it (the rotation schedule), or the minimum rotation
// period for a key it said nothing of; after that, UNAVAILABLE naming
// since when the agent has not reached the authority. Back, the fresh
// copy validates again. Before, the copy held was used forever,
// including keys the authority had unpublished (an agent held v6 after
// v6 left the JWKS).
func TestValidateStopsWhenAKeyMayBeUnpublished(t *testing.T) {
	s, keys := jwtServer(t)
	prev, cur, next, old := newKey(t, "v5-a"), newKey(t, "v6-b"), newKey(t, "v7-c"), newKey(t, "v1-d")
	keys.set(t, nil, cur, next, prev, old)
	keys.publish(map[string]time.Duration{"v5-a": 10 * time.Minute, "v6-b": 70 * time.Minute, "v7-c": 130 * time.Minute})
	var mu sync.Mutex
	clock := time.Now()
	s.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	ctx := context.Background()
	validate := func(k jwtsvid.Key) error {
		_, err := s.ValidateJWTSVID(ctx, &workloadpb.ValidateJWTSVIDRequest{Audience: "db", Svid: mintWith(t, k, "db")})
		return err
	}
	for _, k := range []jwtsvid.Key{prev, cur, next, old} {
		if err := validate(k); err != nil {
			t.Fatalf("%s, just fetched: %v", k.ID, err)
		}
	}

	for _, down := range []error{
		status.Error(codes.Unavailable, "connection refused"),
		status.Error(codes.PermissionDenied, "node web-2 is locked"),
	} {
		t.Run(status.Code(down).String(), func(t *testing.T) {
			keys.set(t, nil, cur, next, prev, old)
			advance(jwksMaxAge)
			if err := validate(cur); err != nil { // fetched again
				t.Fatalf("the authority answering: %v", err)
			}
			start := clock
			keys.set(t, down)
			for _, c := range []struct {
				at     time.Duration
				usable map[string]bool
			}{
				{time.Minute, map[string]bool{"v5-a": true, "v6-b": true, "v7-c": true, "v1-d": true}},
				{minKeyPublished + time.Second, map[string]bool{"v5-a": true, "v6-b": true, "v7-c": true}},
				{10*time.Minute + time.Second, map[string]bool{"v6-b": true, "v7-c": true}},
				{70*time.Minute + time.Second, map[string]bool{"v7-c": true}},
				{130*time.Minute + time.Second, map[string]bool{}},
			} {
				mu.Lock()
				clock = start.Add(c.at)
				mu.Unlock()
				for _, k := range []jwtsvid.Key{prev, cur, next, old} {
					err := validate(k)
					if c.usable[k.ID] {
						if err != nil {
							t.Errorf("%s %s after the last fetch: %v, want it validated", k.ID, c.at, err)
						}
						continue
					}
					if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "has not reached the authority since") ||
						!strings.Contains(err.Error(), status.Convert(down).Message()) {
						t.Errorf("%s %s after the last fetch: %v, want UNAVAILABLE naming since when and why", k.ID, c.at, err)
					}
				}
			}
			// Back: the copy fetched again validates.
			keys.set(t, nil, cur, next, prev, old)
			advance(jwksRetry)
			if err := validate(prev); err != nil {
				t.Fatalf("the authority back: %v", err)
			}
		})
	}
}

// TestJWKSFetchedAgainAfterAFailure: with a JWKS held, a failed fetch is
// tried again jwksRetry after it, not at every call (each caller queued
// on jwksMu waiting for a fetch of its own) nor only jwksMaxAge later;
// an answered one is reused for jwksMaxAge.
func TestJWKSFetchedAgainAfterAFailure(t *testing.T) {
	keys := &keysJWT{}
	keys.set(t, nil, newKey(t, "v1-a"))
	s := NewServer(NewSource((&holder{}).load, slog.New(slog.DiscardHandler)), Config{JWT: keys})
	clock := time.Now()
	s.now = func() time.Time { return clock }
	ctx := context.Background()
	fetchesAt := func(d time.Duration, want int) {
		t.Helper()
		clock = clock.Add(d)
		if _, err := s.jwksNow(ctx); err != nil {
			t.Fatalf("with a JWKS held: %v", err)
		}
		if got := keys.count(); got != want {
			t.Fatalf("%d fetches, want %d", got, want)
		}
	}
	fetchesAt(0, 1)
	fetchesAt(jwksMaxAge-time.Second, 1)
	keys.set(t, status.Error(codes.Unavailable, "connection refused"))
	fetchesAt(time.Second, 2) // failed: the copy held
	fetchesAt(jwksRetry-time.Second, 2)
	fetchesAt(time.Second, 3)
	keys.set(t, nil, newKey(t, "v1-a"))
	fetchesAt(jwksRetry, 4)
	fetchesAt(jwksMaxAge-time.Second, 4)
	fetchesAt(time.Second, 5)
}

// jwtBundlesStream is a FetchJWTBundles stream whose messages the test
// reads, as the JWKS of the trust domain td.
type jwtBundlesStream struct {
	grpc.ServerStream
	ctx  context.Context
	sent chan []byte
}

func (s *jwtBundlesStream) Context() context.Context { return s.ctx }

func (s *jwtBundlesStream) Send(m *workloadpb.JWTBundlesResponse) error {
	select {
	case s.sent <- m.GetBundles()["spiffe://td"]:
		return nil
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

// TestFetchJWTBundlesStopsSendingKeysPastTheirTime: a FetchJWTBundles
// stream holds the keys ValidateJWTSVID validates with. The agent cut off
// from the authority, each key past its time (published_for from the last
// fetch that answered) leaves the JWKS streamed, the stream sending a JWKS
// without it, an empty one when none is left (go-spiffe's source replaces
// the JWKS it holds with each message, and keeps it through a stream
// error); the authority back, the stream sends the fresh JWKS at once.
// Before, the stream kept the JWKS it had sent, every key in it, for as
// long as the agent stayed cut off.
func TestFetchJWTBundlesStopsSendingKeysPastTheirTime(t *testing.T) {
	s, keys := jwtServer(t)
	prev, cur, old := newKey(t, "v5-a"), newKey(t, "v6-b"), newKey(t, "v1-d")
	keys.set(t, nil, cur, prev, old)
	keys.publish(map[string]time.Duration{"v5-a": 10 * time.Minute, "v6-b": 70 * time.Minute})
	var mu sync.Mutex
	clock := time.Now()
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	// The stream's timers: wake fires them whatever they wait for, after
	// the test moved the clock.
	wake := make(chan time.Time)
	s.now, s.after = now, func(time.Duration) <-chan time.Time { return wake }
	ctx, cancel := context.WithCancel(t.Context())
	stream := &jwtBundlesStream{ctx: ctx, sent: make(chan []byte)}
	done := make(chan error, 1)
	go func() { done <- s.FetchJWTBundles(&workloadpb.JWTBundlesRequest{}, stream) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the stream ended: %v", err)
		}
	})
	td := spiffeid.RequireTrustDomainFromString("td")
	recv := func(what string, want ...string) {
		t.Helper()
		var raw []byte
		select {
		case raw = <-stream.sent:
		case err := <-done:
			t.Fatalf("%s: the stream ended: %v", what, err)
		case <-time.After(time.Minute):
			t.Fatalf("%s: nothing sent, want a JWKS with %v", what, want)
		}
		b, err := jwtbundle.Parse(td, raw)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		var got []string
		for kid := range b.JWTAuthorities() {
			got = append(got, kid)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("%s: a JWKS with %v, want %v", what, got, want)
		}
	}
	at := func(d time.Duration) {
		mu.Lock()
		clock = clock.Add(d)
		mu.Unlock()
		select {
		case wake <- clock:
		case err := <-done:
			t.Fatalf("the stream ended: %v", err)
		case <-time.After(time.Minute):
			t.Fatal("the stream waits for no timer")
		}
	}
	recv("just fetched", "v1-d", "v5-a", "v6-b")

	keys.set(t, status.Error(codes.Unavailable, "connection refused"))
	at(minKeyPublished + time.Second)
	recv("the key with no time, past the minimum period", "v5-a", "v6-b")
	at(10 * time.Minute)
	recv("the previous key past its time", "v6-b")
	at(time.Hour)
	recv("every key past its time")

	// The authority back: a fetch (this one, a validation's) sends the
	// fresh JWKS on every stream.
	keys.set(t, nil, cur, prev, old)
	mu.Lock()
	clock = clock.Add(jwksRetry)
	mu.Unlock()
	if _, err := s.ValidateJWTSVID(ctx, &workloadpb.ValidateJWTSVIDRequest{Audience: "db", Svid: mintWith(t, cur, "db")}); err != nil {
		t.Fatalf("the authority back: %v", err)
	}
	recv("the authority back", "v1-d", "v5-a", "v6-b")
}

// TestKeyTimeCountedFromTheRequest: the time the authority says it keeps
// publishing a key (from its answer) is counted from when the agent asked
// for the JWKS, so an answer long in transit shortens it, never lengthens
// it; the agent's clock is hours off the authority's here, which the
// durations do not see. Before, it was counted from the answer's
// arrival: a 30-second answer gave the key 30 seconds past the
// authority's schedule.
func TestKeyTimeCountedFromTheRequest(t *testing.T) {
	s, keys := jwtServer(t)
	cur := newKey(t, "v6-b")
	keys.set(t, nil, cur)
	keys.publish(map[string]time.Duration{"v6-b": 10 * time.Minute})
	var mu sync.Mutex
	clock := time.Now().Add(-7 * time.Hour)
	asked := clock
	s.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	set := func(at time.Time) { mu.Lock(); clock = at; mu.Unlock() }
	keys.during = func() { set(asked.Add(30 * time.Second)) }
	ctx := context.Background()
	validate := func() error {
		_, err := s.ValidateJWTSVID(ctx, &workloadpb.ValidateJWTSVIDRequest{Audience: "db", Svid: mintWith(t, cur, "db")})
		return err
	}
	if err := validate(); err != nil {
		t.Fatalf("just fetched: %v", err)
	}
	keys.during = nil
	keys.set(t, status.Error(codes.Unavailable, "connection refused"))
	set(asked.Add(10*time.Minute - time.Second))
	if err := validate(); err != nil {
		t.Fatalf("within the key's time from the request: %v", err)
	}
	set(asked.Add(10 * time.Minute))
	if err := validate(); status.Code(err) != codes.Unavailable {
		t.Fatalf("the key's time from the request passed (not from the answer's arrival): %v, want UNAVAILABLE", err)
	}
}

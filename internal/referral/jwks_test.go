package referral

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/google/go-cmp/cmp"
)

func jwksOf(t testing.TB, keys ...PublicKey) []byte {
	t.Helper()
	doc, err := PublicJWKS(keys)
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// jwk is one key as JSON, written by go-jose.
func jwk(t testing.TB, k jose.JSONWebKey) json.RawMessage {
	t.Helper()
	raw, err := json.Marshal(k)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func TestJWKSRoundTrip(t *testing.T) {
	pub1, _ := newKey(t)
	pub2, _ := newKey(t)
	for _, tc := range []struct {
		name string
		keys []PublicKey
		want map[string]ed25519.PublicKey
	}{
		{"none", nil, map[string]ed25519.PublicKey{}},
		{"one", []PublicKey{{"k1", pub1}}, map[string]ed25519.PublicKey{"k1": pub1}},
		{"rotation overlap", []PublicKey{{"k1", pub1}, {"k2", pub2}}, map[string]ed25519.PublicKey{"k1": pub1, "k2": pub2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := jwksOf(t, tc.keys...)
			got, err := ParseJWKS(doc)
			if err != nil {
				t.Fatalf("ParseJWKS(%s): %v", doc, err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("keys (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("published form", func(t *testing.T) {
		var set struct {
			Keys []map[string]string `json:"keys"`
		}
		if err := json.Unmarshal(jwksOf(t, PublicKey{"k1", pub1}), &set); err != nil {
			t.Fatal(err)
		}
		want := []map[string]string{{"kty": "OKP", "crv": "Ed25519", "kid": "k1", "alg": "EdDSA", "use": "sig",
			"x": base64.RawURLEncoding.EncodeToString(pub1)}}
		if diff := cmp.Diff(want, set.Keys); diff != "" {
			t.Errorf("JWKS (-want +got):\n%s", diff)
		}
	})
	t.Run("empty set is a list", func(t *testing.T) {
		if got := string(jwksOf(t)); got != `{"keys":[]}` {
			t.Errorf("PublicJWKS(nil) = %s", got)
		}
	})
}

func TestParseJWKSKeepsOnlyEd25519SigningKeys(t *testing.T) {
	good, _ := newKey(t)
	other, otherPriv := newKey(t)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	x := base64.RawURLEncoding.EncodeToString(other)
	for _, tc := range []struct {
		name string
		key  json.RawMessage
	}{
		{"RSA", jwk(t, jose.JSONWebKey{Key: &rsaKey.PublicKey, KeyID: "rsa", Algorithm: "RS256", Use: "sig"})},
		{"RSA without alg", jwk(t, jose.JSONWebKey{Key: &rsaKey.PublicKey, KeyID: "rsa"})},
		{"EC", jwk(t, jose.JSONWebKey{Key: &ecKey.PublicKey, KeyID: "ec", Algorithm: "ES256", Use: "sig"})},
		{"EC without alg", jwk(t, jose.JSONWebKey{Key: &ecKey.PublicKey, KeyID: "ec"})},
		{"symmetric", jwk(t, jose.JSONWebKey{Key: []byte(other), KeyID: "oct", Algorithm: "HS256"})},
		{"Ed25519 with another alg", jwk(t, jose.JSONWebKey{Key: other, KeyID: "k-es", Algorithm: "ES256", Use: "sig"})},
		{"Ed25519 for encryption", jwk(t, jose.JSONWebKey{Key: other, KeyID: "k-enc", Algorithm: "EdDSA", Use: "enc"})},
		{"Ed25519 without kid", jwk(t, jose.JSONWebKey{Key: other, Algorithm: "EdDSA", Use: "sig"})},
		{"Ed25519 private key", jwk(t, jose.JSONWebKey{Key: otherPriv, KeyID: "k-priv", Algorithm: "EdDSA", Use: "sig"})},
		{"X25519", json.RawMessage(`{"kty":"OKP","crv":"X25519","kid":"x","use":"enc","x":"` + x + `"}`)},
		{"unknown kty", json.RawMessage(`{"kty":"PQC","kid":"pq","alg":"EdDSA","x":"` + x + `"}`)},
		{"Ed25519 of the wrong length", json.RawMessage(`{"kty":"OKP","crv":"Ed25519","kid":"short","alg":"EdDSA","x":"AAAA"}`)},
		{"Ed25519 low-order point", json.RawMessage(`{"kty":"OKP","crv":"Ed25519","kid":"weak","alg":"EdDSA","x":"` +
			base64.RawURLEncoding.EncodeToString(make([]byte, 32)) + `"}`)},
		{"not an object", json.RawMessage(`"key"`)},
		{"no kty", json.RawMessage(`{"kid":"none","x":"` + x + `"}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The odd key sits between two good ones: it must cost
			// neither.
			doc := fmt.Sprintf(`{"keys":[%s,%s,%s]}`, jwk(t, jose.JSONWebKey{Key: good, KeyID: "a", Algorithm: "EdDSA", Use: "sig"}),
				tc.key, jwk(t, jose.JSONWebKey{Key: good, KeyID: "b"}))
			got, err := ParseJWKS([]byte(doc))
			if err != nil {
				t.Fatalf("ParseJWKS: %v", err)
			}
			want := map[string]ed25519.PublicKey{"a": good, "b": good}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("keys (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseJWKSRefuses(t *testing.T) {
	pub, _ := newKey(t)
	var big []PublicKey // about 100 bytes a key
	for i := range MaxJWKSBytes / 50 {
		big = append(big, PublicKey{fmt.Sprintf("key-%d", i), pub})
	}
	for _, tc := range []struct {
		name, doc, wantErr string
	}{
		{"too large", string(jwksOf(t, big...)), "larger than 65536 bytes"},
		{"not JSON", "keys", "referral: JWKS"},
		{"keys not a list", `{"keys":{}}`, "referral: JWKS"},
		{"a list", `[]`, "referral: JWKS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseJWKS([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseJWKS = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// jwksServer is a Fetch function over a JWKS that can change, counting
// its calls.
type jwksServer struct {
	mu    sync.Mutex
	docs  [][]byte // served in turn; the last one from then on
	err   error
	calls int
}

func (s *jwksServer) Fetch(context.Context) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.err != nil {
		return nil, s.err
	}
	return s.docs[min(s.calls, len(s.docs))-1], nil
}

func (s *jwksServer) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

func TestKeyCacheRefetchesOnUnknownKID(t *testing.T) {
	pub1, _ := newKey(t)
	pub2, _ := newKey(t)
	srv := &jwksServer{docs: [][]byte{
		jwksOf(t, PublicKey{"k1", pub1}),
		jwksOf(t, PublicKey{"k1", pub1}, PublicKey{"k2", pub2}),
	}}
	clock := &fakeClock{now: testNow}
	var refreshes []error
	c := &KeyCache{Fetch: srv.Fetch, now: clock.Now, OnRefresh: func(err error) { refreshes = append(refreshes, err) }}
	ctx := context.Background()

	for _, step := range []struct {
		name      string
		advance   time.Duration
		kid       string
		want      ed25519.PublicKey // nil: wantErr
		wantErr   error
		wantCalls int
	}{
		{"first use fetches, and k2 is not there yet", 0, "k2", nil, ErrUnknownKey, 1},
		{"a known key never fetches", 0, "k1", pub1, nil, 1},
		// Not fetched again, so not known to be unpublished: k2 may be
		// a key a replica published after the fetch (retry, not refuse).
		{"an unknown key soon after does not fetch", RefetchAfter - time.Second, "k2", nil, ErrKeyNotFetched, 1},
		{"nor does a made-up one", 0, "made-up", nil, ErrKeyNotFetched, 1},
		{"once RefetchAfter has passed, an unknown key fetches and finds k2", time.Second, "k2", pub2, nil, 2},
		{"k2 is now known", time.Hour, "k2", pub2, nil, 2},
		{"a made-up key fetches once", 0, "made-up", nil, ErrUnknownKey, 3},
		{"and not again for RefetchAfter", RefetchAfter - time.Nanosecond, "made-up", nil, ErrKeyNotFetched, 3},
		{"then again", time.Nanosecond, "made-up", nil, ErrUnknownKey, 4},
	} {
		clock.Advance(step.advance)
		got, err := c.TicketKey(ctx, step.kid)
		if step.want == nil {
			if !errors.Is(err, step.wantErr) {
				t.Errorf("%s: TicketKey(%q) = %v, want %v", step.name, step.kid, err, step.wantErr)
			}
		} else if err != nil || !got.Equal(step.want) {
			t.Errorf("%s: TicketKey(%q) = %v, %v, want the key", step.name, step.kid, got, err)
		}
		if n := srv.Calls(); n != step.wantCalls {
			t.Errorf("%s: %d fetches, want %d", step.name, n, step.wantCalls)
		}
	}
	if len(refreshes) != 4 || refreshes[0] != nil {
		t.Errorf("OnRefresh told %v, want 4 successes", refreshes)
	}
}

func TestKeyCacheFetchFailure(t *testing.T) {
	pub, _ := newKey(t)
	srv := &jwksServer{docs: [][]byte{jwksOf(t, PublicKey{"k1", pub})}}
	clock := &fakeClock{now: testNow}
	var told error
	c := &KeyCache{Fetch: srv.Fetch, now: clock.Now, OnRefresh: func(err error) { told = err }}
	ctx := context.Background()
	if err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}

	srv.mu.Lock()
	srv.err = errors.New("connection refused")
	srv.mu.Unlock()
	clock.Advance(RefetchAfter)
	_, err := c.TicketKey(ctx, "k2")
	if err == nil || errors.Is(err, ErrUnknownKey) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("TicketKey during an outage = %v, want the fetch error", err)
	}
	if told == nil {
		t.Error("OnRefresh was not told of the failure")
	}
	// The keys held survive the failure.
	if got, err := c.TicketKey(ctx, "k1"); err != nil || !got.Equal(pub) {
		t.Errorf("TicketKey(k1) after a failed fetch = %v, %v", got, err)
	}
	// A failed attempt counts against RefetchAfter too.
	_, err = c.TicketKey(ctx, "k2")
	if !errors.Is(err, ErrKeyNotFetched) || srv.Calls() != 2 {
		t.Errorf("TicketKey right after a failed fetch = %v after %d fetches, want ErrKeyNotFetched after 2", err, srv.Calls())
	}

	// A JWKS that does not parse keeps the keys too.
	srv.mu.Lock()
	srv.err, srv.docs = nil, [][]byte{[]byte("not JSON")}
	srv.mu.Unlock()
	if err := c.Refresh(ctx); err == nil {
		t.Error("Refresh accepted a JWKS that is not JSON")
	}
	if got, err := c.TicketKey(ctx, "k1"); err != nil || !got.Equal(pub) {
		t.Errorf("TicketKey(k1) after a bad JWKS = %v, %v", got, err)
	}

	if _, err := (&KeyCache{}).TicketKey(ctx, "k1"); err == nil || errors.Is(err, ErrUnknownKey) {
		t.Errorf("TicketKey without Fetch = %v, want an error saying so", err)
	}
}

// A fetch must not hold up tickets signed by a key the cache holds: the
// fetch goes to the network and may take its whole timeout.
func TestKeyCacheFetchDoesNotBlockKnownKeys(t *testing.T) {
	pub, _ := newKey(t)
	doc := jwksOf(t, PublicKey{"k1", pub})
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	var calls int
	var mu sync.Mutex
	c := &KeyCache{Fetch: func(ctx context.Context) ([]byte, error) {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if n > 1 {
			started <- struct{}{}
			<-release
		}
		return doc, nil
	}}
	ctx := context.Background()
	if err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	c.now = func() time.Time { return time.Now().Add(time.Hour) } // every unknown kid is due

	done := make(chan error, 1)
	go func() {
		_, err := c.TicketKey(ctx, "unknown")
		done <- err
	}()
	<-started
	known := make(chan error, 1)
	go func() {
		_, err := c.TicketKey(ctx, "k1")
		known <- err
	}()
	select {
	case err := <-known:
		if err != nil {
			t.Errorf("TicketKey(k1) = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("TicketKey of a known key waited for a fetch")
	}
	close(release)
	if err := <-done; !errors.Is(err, ErrUnknownKey) {
		t.Errorf("TicketKey(unknown) = %v, want ErrUnknownKey", err)
	}
}

func TestKeyCacheConcurrentUnknownKIDsFetchOnce(t *testing.T) {
	pub, _ := newKey(t)
	srv := &jwksServer{docs: [][]byte{jwksOf(t, PublicKey{"k1", pub})}}
	clock := &fakeClock{now: testNow}
	c := &KeyCache{Fetch: srv.Fetch, now: clock.Now}
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = c.TicketKey(context.Background(), fmt.Sprintf("made-up-%d", i))
		}()
	}
	wg.Wait()
	if n := srv.Calls(); n != 1 {
		t.Errorf("%d fetches for 20 concurrent unknown key IDs, want 1", n)
	}
}

func TestKeyCacheRun(t *testing.T) {
	pub, _ := newKey(t)
	srv := &jwksServer{docs: [][]byte{jwksOf(t, PublicKey{"k1", pub})}}
	fetched := make(chan struct{}, 10)
	c := &KeyCache{Fetch: srv.Fetch, OnRefresh: func(error) { fetched <- struct{}{} }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	<-fetched // Run fetches at once, not after RefreshEvery
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
	if got, err := c.TicketKey(context.Background(), "k1"); err != nil || !got.Equal(pub) {
		t.Errorf("TicketKey(k1) = %v, %v", got, err)
	}
}

// A ticket signed by a key discovery has just rotated in verifies once
// the cache fetches the new JWKS; until then it is not refused as
// invalid (the agent would stop) but not checked (ErrKeyNotFetched,
// which the authority answers UNAVAILABLE, so the agent retries).
func TestVerifyAfterRotation(t *testing.T) {
	pub1, _ := newKey(t)
	pub2, priv2 := newKey(t)
	srv := &jwksServer{docs: [][]byte{
		jwksOf(t, PublicKey{"k1", pub1}),
		jwksOf(t, PublicKey{"k1", pub1}, PublicKey{"k2", pub2}),
	}}
	clock := &fakeClock{now: testNow}
	c := &KeyCache{Fetch: srv.Fetch, now: clock.Now}
	if err := c.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	v := &Verifier{Keys: c, Issuer: testIssuer, AuthorityID: testAuthority, Now: clock.Now}
	tok := issue(t, priv2, "k2", nil)

	_, err := v.Verify(context.Background(), tok, testNode)
	var inv *Invalid
	if errors.As(err, &inv) || !errors.Is(err, ErrKeyNotFetched) {
		t.Fatalf("Verify right after a fetch = %v, want ErrKeyNotFetched", err)
	}
	clock.Advance(RefetchAfter)
	if _, err := v.Verify(context.Background(), tok, testNode); err != nil {
		t.Fatalf("Verify after RefetchAfter: %v", err)
	}
}

func FuzzParseJWKS(f *testing.F) {
	pub, _ := newKey(f)
	f.Add(jwksOf(f, PublicKey{"k1", pub}))
	f.Add([]byte(`{"keys":[{"kty":"OKP","crv":"X25519","kid":"x","x":"AAAA"},{"kty":"EC","crv":"P-256","x":"","y":""}]}`))
	f.Add([]byte(`{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB","x5c":["AAAA"]}]}`))
	f.Add([]byte(`{"keys":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		keys, err := ParseJWKS(data)
		if err != nil {
			return
		}
		for kid, k := range keys {
			if kid == "" || len(k) != ed25519.PublicKeySize {
				t.Fatalf("ParseJWKS kept key %q of %d bytes", kid, len(k))
			}
		}
	})
}

// A discovery that accepts the fetch and never answers must not hold the
// fetch slot for ever, whatever deadline Fetch itself sets (this one sets
// none, and the refetch outlives its caller): the fetch ends at the
// cache's own deadline, and a later unknown key ID fetches again.
func TestKeyCacheFetchHasItsOwnDeadline(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs first: srv.Close waits for the handlers
	// Calls to Fetch are counted, not requests at the server: under a
	// loaded -race run the 100 ms deadline can end a fetch before its
	// request reaches the server.
	var mu sync.Mutex
	var calls int
	fetch := func(ctx context.Context) ([]byte, error) {
		mu.Lock()
		calls++
		mu.Unlock()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		if err != nil {
			return nil, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		return io.ReadAll(resp.Body)
	}
	clock := &fakeClock{now: testNow}
	c := &KeyCache{Fetch: fetch, now: clock.Now, fetchTimeout: 100 * time.Millisecond}
	// The caller gives up at once; the fetch goes on without it.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 2 {
		done := make(chan error, 1)
		go func() {
			_, err := c.TicketKey(ctx, "k1")
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("fetch %d from a discovery that never answers = %v, want the deadline's error", i+1, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("fetch %d from a discovery that never answers still holds the fetch slot after a minute", i+1)
		}
		clock.Advance(RefetchAfter)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls != 2 {
		t.Errorf("discovery was fetched %d times, want 2 (one per due refetch)", calls)
	}
}

// TestKeyCacheRunEvery: the scheduled refresh runs every c.Every, the
// period an authority's discovery.keys_refresh sets, not RefreshEvery.
func TestKeyCacheRunEvery(t *testing.T) {
	pub, _ := newKey(t)
	srv := &jwksServer{docs: [][]byte{jwksOf(t, PublicKey{"k1", pub})}}
	fetched := make(chan struct{}, 10)
	c := &KeyCache{Fetch: srv.Fetch, Every: 10 * time.Millisecond, OnRefresh: func(error) {
		select {
		case fetched <- struct{}{}:
		default:
		}
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	// Three fetches: the first at once, then two on the schedule, long
	// before RefreshEvery (a minute) could have brought one.
	deadline := time.After(RefreshEvery / 2)
	for i := range 3 {
		select {
		case <-fetched:
		case <-deadline:
			t.Fatalf("%d fetches within %s with Every %s", i, RefreshEvery/2, c.Every)
		}
	}
}

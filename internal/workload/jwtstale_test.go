package workload

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"log/slog"
	"sync"
	"testing"
	"time"

	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/jwtsvid"
)

// keysJWT serves the JWKS of the keys it is given, or fails, and counts
// the fetches.
type keysJWT struct {
	mu      sync.Mutex
	jwks    []byte
	err     error
	fetches int
}

func (k *keysJWT) JWTSVID(context.Context, []string) (string, time.Time, error) {
	return "", time.Time{}, status.Error(codes.Unimplemented, "not minted here")
}

func (k *keysJWT) JWTBundle(context.Context) ([]byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.fetches++
	return k.jwks, k.err
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
	h := &holder{id: newIdentity(t, "td", 1)}
	src := NewSource(h.load, slog.New(slog.DiscardHandler))
	src.Reload()
	keys := &keysJWT{}
	v1, v2, v3 := newKey(t, "v1-a"), newKey(t, "v2-b"), newKey(t, "v3-c")
	keys.set(t, nil, v1)
	s := NewServer(src, Config{JWT: keys})
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

package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
)

// kidOf is the key ID in a JWT's header.
func kidOf(t *testing.T, token string) string {
	t.Helper()
	sig, err := jose.ParseSignedCompact(token, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		t.Fatal(err)
	}
	return sig.Signatures[0].Header.KeyID
}

// muster ca rotate jwt: a JWT-SVID minted before the rotation still
// validates after it (the agent's ValidateJWTSVID and the authority's
// JWKS over HTTP), one minted after is signed with the new kid and
// validates too; a second rotation at once is refused saying when; the
// rotation is audited; a period below the minimum is refused at start.
func TestJWTKeyRotationEndToEnd(t *testing.T) {
	t.Parallel()
	if line := mustFail(t, "authority", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--jwt-key-rotation-period", "1m"); !strings.Contains(line, "jwt_svid.key_rotation_period") {
		t.Errorf("a one-minute period: %q", line)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	j := newJWTEnv(t, ctx, "jwt-1")
	client := j.client

	before, err := client.FetchJWTSVID(ctx, jwtsvid.Params{Audience: "db"})
	if err != nil {
		t.Fatal(err)
	}
	oldKid := kidOf(t, before.Marshal())
	if !strings.HasPrefix(oldKid, "v1-") {
		t.Fatalf("a fresh authority signs with kid %s, want v1-…", oldKid)
	}

	var rot struct {
		Version       int64  `json:"version"`
		KeyID         string `json:"key_id"`
		PreviousKeyID string `json:"previous_key_id"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "ca", "rotate", "jwt", "--data", j.dir, "-o", "json")), &rot); err != nil {
		t.Fatal(err)
	}
	if rot.Version != 2 || rot.PreviousKeyID != oldKid || !strings.HasPrefix(rot.KeyID, "v2-") {
		t.Fatalf("ca rotate jwt: %+v (before: %s)", rot, oldKid)
	}

	// Another audience, so the agent mints rather than reuses.
	after, err := client.FetchJWTSVID(ctx, jwtsvid.Params{Audience: "cache"})
	if err != nil {
		t.Fatal(err)
	}
	if got := kidOf(t, after.Marshal()); got != rot.KeyID {
		t.Fatalf("a JWT-SVID minted after the rotation has kid %s, want %s", got, rot.KeyID)
	}
	b := j.authorityJWKS(t)
	for _, c := range []struct {
		name, token, aud string
	}{{"minted before", before.Marshal(), "db"}, {"minted after", after.Marshal(), "cache"}} {
		if _, err := client.ValidateJWTSVID(ctx, c.token, c.aud); err != nil {
			t.Errorf("ValidateJWTSVID of the token %s the rotation: %v", c.name, err)
		}
		if _, err := jwtsvid.ParseAndValidate(c.token, b, []string{c.aud}); err != nil {
			t.Errorf("the authority's JWKS does not validate the token %s the rotation: %v", c.name, err)
		}
	}

	if line := mustFail(t, "ca", "rotate", "jwt", "--data", j.dir); !strings.Contains(line, "FAILED_PRECONDITION") ||
		!strings.Contains(line, "muster ca rotate jwt` again after") {
		t.Errorf("a second rotation at once: %q", line)
	}
	if out := mustRun(t, "audit", "list", "--data", j.dir, "--action", "jwt.rotate"); !strings.Contains(out, "jwt-svid/v2") {
		t.Errorf("the rotation is not audited:\n%s", out)
	}
}

package authority

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/spiffeid"
)

// TestExpiredReason: an expired operator is told the break-glass command
// with its name; an agent (or a certificate of another trust domain) keeps
// the agent's hint.
func TestExpiredReason(t *testing.T) {
	h, err := ca.Create("test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(role spiffeid.Role, td, name string) string {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		id, _ := spiffeid.New(td, role, name)
		issuer := ca.RoleAgent
		if role == spiffeid.RoleAdmin {
			issuer = ca.RoleAdmin
		}
		c, err := h.Issuer(issuer).Issue(ca.LeafRequest{PublicKey: key.Public(), SPIFFEID: id.URL(), CommonName: name,
			ClientAuth: true, NotBefore: time.Now(), TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return expiredReason(c, "td")
	}
	if got := leaf(spiffeid.RoleAdmin, "td", "alice"); !strings.Contains(got, "muster admin add alice --offline --data DIR --out alice-new.pem") ||
		!strings.Contains(got, "from another operator with muster admin add alice --out alice-new.pem,") || strings.Contains(got, "join again") {
		t.Errorf("operator: %q", got)
	}
	if got := leaf(spiffeid.RoleAgent, "td", "node-1"); !strings.Contains(got, "must join again: muster agent join --force --data ADIR --node node-1 with a joining URI from muster token create --node node-1") ||
		!strings.Contains(got, "a bound-keypair agent recovers with its bound key instead: muster agent run does it") {
		t.Errorf("agent: %q", got)
	}
	if got := leaf(spiffeid.RoleAdmin, "other", "alice"); strings.Contains(got, "--offline") {
		t.Errorf("operator of another trust domain: %q", got)
	}
}

package identity

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/spiffeid"
)

// TestAgentServerSVIDIsNotTheAuthority: the agent intermediate allows
// serverAuth (so a --svid-usage client,server SVID verifies as a TLS server
// certificate in OpenSSL), which makes such an agent leaf verify as a
// server certificate under the trust domain's roots. It must still never
// pass as the authority: every client of the authority matches the
// authority's SPIFFE ID (MatchID) or role (MatchRole), and an agent leaf's
// ID is spiffe://TD/agent/NODE, set by the authority.
func TestAgentServerSVIDIsNotTheAuthority(t *testing.T) {
	h, err := ca.Create("roles", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	authority, _ := spiffeid.New("roles-td", spiffeid.RoleAuthority, "roles-td")
	agent, _ := spiffeid.New("roles-td", spiffeid.RoleAgent, "roles-td")
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf, err := h.Issuer(ca.RoleAgent).Issue(ca.LeafRequest{PublicKey: key.Public(), SPIFFEID: agent.URL(),
		ServerAuth: true, ClientAuth: true, NotBefore: time.Now(), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	chain := []*x509.Certificate{leaf, h.Issuer(ca.RoleAgent).Cert}
	roots := h.RootPool()
	// The chain verifies as a server certificate: the separation below is
	// the ID's, not an accident of the key usage.
	if err := VerifyPeer(chain, roots, MatchID(agent), x509.ExtKeyUsageServerAuth, time.Now()); err != nil {
		t.Fatalf("a client,server agent SVID does not verify as a server certificate: %v", err)
	}
	for name, m := range map[string]Matcher{
		"MatchID(authority)":   MatchID(authority),
		"MatchRole(authority)": MatchRole("roles-td", spiffeid.RoleAuthority),
	} {
		if err := VerifyPeer(chain, roots, m, x509.ExtKeyUsageServerAuth, time.Now()); err == nil {
			t.Errorf("%s accepted an agent's SVID as the authority", name)
		}
	}
}

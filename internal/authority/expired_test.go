package authority

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/datadir"
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
		return expiredReason(c, "td", "muster", "DIR")
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

// TestBreakGlassNamesTheTokenBuild: the break-glass admin add an expired
// or unrecorded operator is told of is named with muster-pkcs11 when the
// authority's keys are in a PKCS#11 token (the static muster, which a
// packaged install puts first on the PATH, refuses to open the token:
// the command pasted could not work), with muster when they are sealed.
// Before, it was muster either way.
func TestBreakGlassNamesTheTokenBuild(t *testing.T) {
	h, err := ca.Create("test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	id, _ := spiffeid.New("td", spiffeid.RoleAdmin, "alice")
	leaf, err := h.Issuer(ca.RoleAdmin).Issue(ca.LeafRequest{PublicKey: key.Public(), SPIFFEID: id.URL(), CommonName: "alice",
		ClientAuth: true, NotBefore: time.Now(), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		s         *Server
		want, not string
	}{
		{"sealed", &Server{}, " muster admin add alice --offline --data DIR --out alice-new.pem", "muster-pkcs11"},
		{"in a token", &Server{token: &custody.Token{}}, " muster-pkcs11 admin add alice --offline --data DIR --out alice-new.pem", " muster admin add alice --offline"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, got := range []string{
				expiredReason(leaf, "td", tc.s.breakGlassBin(), tc.s.breakGlassData()),
				unknownOperatorReason("1f", "alice", tc.s.breakGlassBin(), tc.s.breakGlassData()),
			} {
				if !strings.Contains(got, tc.want) || strings.Contains(got, tc.not) {
					t.Errorf("%q\nwant %q, not %q", got, tc.want, tc.not)
				}
			}
		})
	}
}

// TestBreakGlassNamesTheDataDirectory: the break-glass admin add an
// expired, unrecorded or distrusted operator is told of names this
// authority's own data directory (quoted for the shell) and the settings
// file it was started with where that is not the directory's own (the
// packaged unit's /etc/muster/authority.yaml), so that pasted on its
// machine it runs; before, it said --data DIR, and pasted it failed.
func TestBreakGlassNamesTheDataDirectory(t *testing.T) {
	h, err := ca.Create("test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	id, _ := spiffeid.New("td", spiffeid.RoleAdmin, "alice")
	leaf, err := h.Issuer(ca.RoleAdmin).Issue(ca.LeafRequest{PublicKey: key.Public(), SPIFFEID: id.URL(), CommonName: "alice",
		ClientAuth: true, NotBefore: time.Now(), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	dir := datadir.Dir("/var/lib/muster/my authority")
	for _, tc := range []struct {
		name string
		s    *Server
		want string
	}{
		{"its own settings", &Server{cfg: Config{Dir: dir, ConfigFile: dir.ConfigFile()}},
			" muster admin add alice --offline --data '/var/lib/muster/my authority' --out alice-new.pem"},
		{"the packaged unit's", &Server{cfg: Config{Dir: dir, ConfigFile: "/etc/muster/authority.yaml"}, token: &custody.Token{}},
			" muster-pkcs11 admin add alice --offline --data '/var/lib/muster/my authority' --config /etc/muster/authority.yaml --out alice-new.pem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, got := range []string{
				expiredReason(leaf, "td", tc.s.breakGlassBin(), tc.s.breakGlassData()),
				unknownOperatorReason("1f", "alice", tc.s.breakGlassBin(), tc.s.breakGlassData()),
			} {
				if !strings.Contains(got, tc.want) || strings.Contains(got, "DIR") {
					t.Errorf("%q\nwant %q", got, tc.want)
				}
			}
		})
	}
}

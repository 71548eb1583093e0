package cli

import (
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/joinuri"
)

// TestThroughDiscovery: bot add's discovery form keeps the name, secret and
// authority pin of the direct URI, names the discovery's address and the
// authority ID, and refuses an address the agents' parser would.
func TestThroughDiscovery(t *testing.T) {
	pin := "sha256:" + strings.Repeat("ab", 32)
	dpin := "sha256:" + strings.Repeat("cd", 32)
	direct := "muster+bound-keypair://bot-1:s3cret@authority.example:7443?fingerprint=" + pin
	for _, tc := range []struct {
		name, disc, dpin, want, err string
	}{
		{"pinned", "discovery.example:8443", dpin,
			"muster+bound-keypair://bot-1:s3cret@discovery.example:8443?fingerprint=" + pin + "&authority_id=prod-a3f2e1&discovery_fingerprint=" + dpin, ""},
		{"system roots", "discovery.example:8443", "",
			"muster+bound-keypair://bot-1:s3cret@discovery.example:8443?fingerprint=" + pin + "&authority_id=prod-a3f2e1", ""},
		{"no port", "discovery.example", "", "", "invalid joining URI"},
		{"a path", "discovery.example:8443/x", "", "", "invalid joining URI"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := throughDiscovery(direct, tc.disc, "prod-a3f2e1", tc.dpin)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("throughDiscovery = %q, %v; want an error with %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("throughDiscovery = %q, %v; want %q", got, err, tc.want)
			}
			u, err := joinuri.Parse(got)
			if err != nil || u.KeypairName != "bot-1" || u.KeypairSecret != "s3cret" || u.AuthorityID != "prod-a3f2e1" || u.Fingerprint != pin {
				t.Fatalf("parsed back: %+v, %v", u, err)
			}
		})
	}
	if _, err := throughDiscovery(placeholderURI, "discovery.example:8443", "prod-a3f2e1", ""); err != nil {
		t.Fatalf("the placeholder does not parse: %v", err)
	}
}

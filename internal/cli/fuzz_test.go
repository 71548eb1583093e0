package cli

import (
	"os"
	"path/filepath"
	"testing"

	"go.yaml.in/yaml/v3"
)

// FuzzAuthorityConfig: authority.yaml as an operator might write it. What
// readYAMLFile accepts writes back to the same settings; an unknown key
// is refused.
func FuzzAuthorityConfig(f *testing.F) {
	f.Add([]byte("listen: :7443\nstore: postgres://u@h/db\nagent_cert_ttl: 24h\ntrusted_proxies: [10.0.0.0/8]\ndiscovery:\n  address: d:7444\n"))
	f.Add([]byte("lisen: :7443\n"))
	f.Add([]byte("trusted_proxies: 3\n"))
	f.Add([]byte("&a [*a, *a, *a]"))
	path := filepath.Join(f.TempDir(), "authority.yaml")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		var c authorityConfig
		if err := readYAMLFile(path, &c); err != nil {
			return
		}
		out, err := yaml.Marshal(&c)
		if err != nil {
			t.Fatalf("an accepted config does not marshal: %v", err)
		}
		if err := os.WriteFile(path, out, 0o600); err != nil {
			t.Fatal(err)
		}
		var back authorityConfig
		if err := readYAMLFile(path, &back); err != nil {
			t.Fatalf("a config written from an accepted one is refused: %v", err)
		}
		if again, _ := yaml.Marshal(&back); string(again) != string(out) {
			t.Fatalf("config changed in a round trip:\n%s\nthen\n%s", out, again)
		}
	})
}

package cli

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/discoveryd"
)

// TestDiscoveryRotateKeySaysWhenTheNewKeySigns: after a plain rotation the
// new key signs some seconds later; after --revoke-previous it signs at
// once, and the previous key's tickets are refused from the authorities'
// next JWKS refresh, which discovery.keys_refresh sets (up to 10m). (The
// text once said "fifteen seconds later" after both, and "within a
// minute" after --revoke-previous, in its output, help and flag text.)
func TestDiscoveryRotateKeySaysWhenTheNewKeySigns(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "discovery")
	if _, err := discoveryd.Init(dir); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args          []string
		want, notWant string
	}{
		{nil, "It is the first ticket key.", "sign with it"},
		{nil, "sign with it about fifteen seconds later", "at once"},
		{[]string{"--revoke-previous"}, "stop publishing the previous key and sign with the new one at once", "fifteen seconds later"},
		{[]string{"--revoke-previous"}, "each authority's discovery.keys_refresh, at most 10m", "within a minute"},
		{[]string{"--help"}, "discovery.keys_refresh, at most 10m), and refuse", "within a minute"},
	} {
		code, stdout, stderr := runCLI(t, append([]string{"discovery", "rotate-key", "--data", dir}, tt.args...)...)
		if code != 0 {
			t.Fatalf("rotate-key %v: exit %d\n%s", tt.args, code, stderr)
		}
		if !strings.Contains(stdout, tt.want) || strings.Contains(stdout, tt.notWant) {
			t.Errorf("rotate-key %v printed:\n%s\nwant %q, not %q", tt.args, stdout, tt.want, tt.notWant)
		}
	}
}

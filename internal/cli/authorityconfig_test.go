package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRecoveriesWarnAtConfig: bound_keypair.recoveries_warn_at decodes
// from authority.yaml, absent stays nil (the default applies), and a
// misspelt key is refused by name.
func TestRecoveriesWarnAtConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(text string) string {
		p := filepath.Join(dir, "authority.yaml")
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c, err := loadAuthorityConfig(write("bound_keypair:\n  recoveries_warn_at: 3\n"))
	if err != nil || c.BoundKeypair.RecoveriesWarnAt == nil || *c.BoundKeypair.RecoveriesWarnAt != 3 {
		t.Fatalf("recoveries_warn_at: 3 read as %v, %v", c.BoundKeypair.RecoveriesWarnAt, err)
	}
	if c, err = loadAuthorityConfig(write("listen: 127.0.0.1:0\n")); err != nil || c.BoundKeypair.RecoveriesWarnAt != nil {
		t.Fatalf("absent recoveries_warn_at: %v, %v", c.BoundKeypair.RecoveriesWarnAt, err)
	}
	if _, err := loadAuthorityConfig(write("bound_keypair:\n  recovery_warn_at: 3\n")); err == nil || !strings.Contains(err.Error(), "recovery_warn_at") {
		t.Fatalf("misspelt key: %v", err)
	}
}

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
	c, err := loadAuthorityConfig(write("bound_keypair:\n  recoveries_warn_at: 3\n"), "")
	if err != nil || c.BoundKeypair.RecoveriesWarnAt == nil || *c.BoundKeypair.RecoveriesWarnAt != 3 {
		t.Fatalf("recoveries_warn_at: 3 read as %v, %v", c.BoundKeypair.RecoveriesWarnAt, err)
	}
	if c, err = loadAuthorityConfig(write("listen: 127.0.0.1:0\n"), ""); err != nil || c.BoundKeypair.RecoveriesWarnAt != nil {
		t.Fatalf("absent recoveries_warn_at: %v, %v", c.BoundKeypair.RecoveriesWarnAt, err)
	}
	if _, err := loadAuthorityConfig(write("bound_keypair:\n  recovery_warn_at: 3\n"), ""); err == nil || !strings.Contains(err.Error(), "recovery_warn_at") {
		t.Fatalf("misspelt key: %v", err)
	}
}

func TestCRLSettings(t *testing.T) {
	for _, tc := range []struct {
		url, validity string
		ok            bool
	}{
		{"", "", true},
		{"http://crl.example.com:7445", "24h", true},
		{"https://crl.example.com/base/", "10s", true},
		{"crl.example.com:7445", "24h", false},
		{"ftp://crl.example.com", "24h", false},
		{"http://crl.example.com/?x=1", "24h", false},
		{"http://user@crl.example.com", "24h", false},
		{"http://crl.example.com", "9s", false},
		{"http://crl.example.com", "soon", false},
	} {
		_, verr := parseCRLValidity(tc.validity)
		uerr := checkCRLURL(tc.url)
		if ok := verr == nil && uerr == nil; ok != tc.ok {
			t.Errorf("crl_url %q, crl_validity %q: %v, %v; want ok %v", tc.url, tc.validity, uerr, verr, tc.ok)
		}
	}
}

// TestStoreUnder: a relative SQLite path in a settings file is under the
// data directory; anything else is as written.
func TestStoreUnder(t *testing.T) {
	for _, tc := range []struct{ dir, url, want string }{
		{"/var/lib/muster/authority", "sqlite://muster.db", "sqlite:///var/lib/muster/authority/muster.db"},
		{"/var/lib/muster/authority", "sqlite://db/../muster.db", "sqlite:///var/lib/muster/authority/muster.db"},
		{"data", "sqlite://./x.db", "sqlite://data/x.db"},
		{"/var/lib/muster/authority", "sqlite:///srv/muster.db", "sqlite:///srv/muster.db"},
		{"/var/lib/muster/authority", "postgres://muster@db/muster", "postgres://muster@db/muster"},
		{"/var/lib/muster/authority", "sqlite://", "sqlite://"},
		{"/var/lib/muster/authority", "", ""},
	} {
		if got := storeUnder(tc.dir, tc.url); got != tc.want {
			t.Errorf("storeUnder(%q, %q) = %q, want %q", tc.dir, tc.url, got, tc.want)
		}
	}
}

// TestRelativeSQLiteStoreIsUnderTheDataDirectory: the settings file
// outside the data directory (the packaged /etc/muster/authority.yaml)
// with store: sqlite://muster.db is read, by muster authority and the
// offline commands alike (readAuthorityConfig), as DIR/muster.db.
func TestRelativeSQLiteStoreIsUnderTheDataDirectory(t *testing.T) {
	etc, data := t.TempDir(), t.TempDir()
	cfgPath := filepath.Join(etc, "authority.yaml")
	if err := os.WriteFile(cfgPath, []byte("store: sqlite://muster.db\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := &Env{Getenv: func(k string) string {
		return map[string]string{"MUSTER_CONFIG": cfgPath, "MUSTER_DATA": data}[k]
	}}
	od, err := loadOfflineDir(env, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if want := "sqlite://" + filepath.Join(data, "muster.db"); od.storeURL(env, "") != want {
		t.Fatalf("store read as %q, want %q", od.storeURL(env, ""), want)
	}
}

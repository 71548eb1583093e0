package workload

import (
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParseAddr: what ParseAddr accepts is an absolute, clean path
// reached only through unix:.
func FuzzParseAddr(f *testing.F) {
	for _, s := range []string{"unix:///run/muster/agent.sock", "unix:/run/a.sock", "tcp://127.0.0.1:1", "unix://host/p",
		"unix:///a/../b", "unix:///a?b", "unix:relative", "unix:///%00", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseAddr(s)
		if err != nil {
			return
		}
		if !strings.HasPrefix(strings.ToLower(s), "unix:") || !filepath.IsAbs(p) || filepath.Clean(p) != p || strings.ContainsRune(p, 0) {
			t.Fatalf("ParseAddr(%q) = %q", s, p)
		}
	})
}

// FuzzParseMode: an accepted mode is permission bits only.
func FuzzParseMode(f *testing.F) {
	for _, s := range []string{"0600", "660", "0777", "1777", "-1", "0x1ff", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if m, err := ParseMode(s); err == nil && m&^0o777 != 0 {
			t.Fatalf("ParseMode(%q) = %v", s, m)
		}
	})
}

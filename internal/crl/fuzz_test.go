package crl

import (
	"strings"
	"testing"
)

// FuzzNameFromPath feeds it what an unauthenticated HTTP client sends:
// whatever it accepts is one path segment that Path gives back.
func FuzzNameFromPath(f *testing.F) {
	for _, s := range []string{"/crl/agent-1f.crl", "/crl/.crl", "/crl/a/b.crl", "/crl/../x.crl", "/metrics", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		name, ok := NameFromPath(p)
		if !ok {
			if name != "" {
				t.Fatalf("refused %q but named %q", p, name)
			}
			return
		}
		if name == "" || strings.Contains(name, "/") || "/crl/"+name+".crl" != p {
			t.Fatalf("accepted %q as %q", p, name)
		}
	})
}

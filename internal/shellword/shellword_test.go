package shellword

import (
	"os/exec"
	"strings"
	"testing"
)

func TestQuote(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"/var/lib/muster", "/var/lib/muster"},
		{"./agent-data", "./agent-data"},
		{"sha256:ab,cd=e@f+g", "sha256:ab,cd=e@f+g"},
		{"", "''"},
		{"/tmp/my dir", "'/tmp/my dir'"},
		{"/tmp/it's", `'/tmp/it'\''s'`},
		{"/tmp/$(reboot)", "'/tmp/$(reboot)'"},
		{"~/data", "'~/data'"},
		{"a\nb", "'a\nb'"},
		{"=data", "'=data'"},
		{"a=b", "a=b"},
	} {
		if got := Quote(tt.in); got != tt.want {
			t.Errorf("Quote(%q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

// TestQuotePastes: what Quote prints, pasted into sh, is the one word it
// was given, whatever bytes it holds.
func TestQuotePastes(t *testing.T) {
	for _, s := range []string{"/tmp/my dir", "it's", "''", `a"b\c`, "$HOME `id` $(id) ;|&<>*?[a] #x", "~", "a\tb\nc", "-n"} {
		out, err := exec.Command("sh", "-c", `printf '%s' `+Quote(s)).Output()
		if err != nil {
			t.Fatalf("sh -c printf %s: %v", Quote(s), err)
		}
		if string(out) != s {
			t.Errorf("%q pasted as %s reads back %q", s, Quote(s), out)
		}
	}
}

// FuzzQuotePastes: whatever bytes a word holds (but NUL, which no
// argument can), Quote's form of it, pasted into sh as printf's
// argument, is that one word again.
func FuzzQuotePastes(f *testing.F) {
	for _, s := range []string{"", "/tmp/my dir", "it's", "''", "$(id)", "~", "a\nb", "=x", "\xff\xfe", "\\"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if strings.ContainsRune(s, 0) {
			t.Skip("no argument holds a NUL")
		}
		out, err := exec.Command("sh", "-c", `printf '%s' `+Quote(s)).Output()
		if err != nil {
			t.Fatalf("sh -c printf %s: %v", Quote(s), err)
		}
		if string(out) != s {
			t.Errorf("%q pasted as %s reads back %q", s, Quote(s), out)
		}
	})
}

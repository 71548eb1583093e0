package jointoken

import (
	"regexp"
	"strings"
	"testing"
)

// The expressions validToken and validID replaced: the oracle their byte
// loops must agree with on every string.
var (
	idRE    = regexp.MustCompile(`^[a-z0-9]{6}$`)
	tokenRE = regexp.MustCompile(`^[a-z0-9]{6}\.[a-z0-9]{16}$`)
)

func TestValidMatchesRegexp(t *testing.T) {
	for _, s := range []string{
		"", "abc123", "abc12", "abc1234", "ABC123", "abc12.", "abc 12", "abc12é",
		"abc123.0123456789abcdef", "abc123.0123456789abcde", "abc123.0123456789abcdefg",
		"abc123x0123456789abcdef", "abc12.30123456789abcdef", "abc123.0123456789abcdeF",
		"abc123.0123456789abcde\n", "abc123.0123456789abcdé", "abc123.0123456789.bcdef",
		"abc123.0123456789abcdef\n", "\nabc123.0123456789abcdef",
	} {
		if validToken(s) != tokenRE.MatchString(s) {
			t.Errorf("validToken(%q) = %v, regexp %v", s, validToken(s), tokenRE.MatchString(s))
		}
		if validID(s) != idRE.MatchString(s) {
			t.Errorf("validID(%q) = %v, regexp %v", s, validID(s), idRE.MatchString(s))
		}
	}
	// Every byte at every position of a valid token and of a valid ID.
	for _, good := range []string{"abc123.0123456789abcdef", "abc123"} {
		for at := range len(good) {
			for c := range 256 {
				b := []byte(good)
				b[at] = byte(c)
				s := string(b)
				if validToken(s) != tokenRE.MatchString(s) || validID(s) != idRE.MatchString(s) {
					t.Fatalf("%q: validToken %v (regexp %v), validID %v (regexp %v)", s,
						validToken(s), tokenRE.MatchString(s), validID(s), idRE.MatchString(s))
				}
			}
		}
	}
}

func FuzzValidMatchesRegexp(f *testing.F) {
	for _, s := range []string{"", "abc123", "abc123.0123456789abcdef", "abc123.0123456789abcde", strings.Repeat("a", 23)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := validToken(s), tokenRE.MatchString(s); got != want {
			t.Fatalf("validToken(%q) = %v, regexp %v", s, got, want)
		}
		if got, want := validID(s), idRE.MatchString(s); got != want {
			t.Fatalf("validID(%q) = %v, regexp %v", s, got, want)
		}
	})
}

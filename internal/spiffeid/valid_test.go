package spiffeid

import (
	"regexp"
	"strings"
	"testing"
)

// The expressions validTrustDomain and validName replaced: the oracle
// their byte loops must agree with on every string.
var (
	trustDomainRE = regexp.MustCompile(`^[a-z0-9._-]{1,255}$`)
	nameRE        = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$`)
)

func TestValidMatchesRegexp(t *testing.T) {
	tests := []struct {
		in           string
		td, nodeName bool
	}{
		{"", false, false},
		{"a", true, true},
		{"0", true, true},
		{"z9", true, true},
		{"-", true, false},
		{".", true, false},
		{"_", true, false},
		{"a-", true, false},
		{"-a", true, false},
		{"a.", true, false},
		{".a", true, false},
		{"a-b", true, true},
		{"a.b", true, true},
		{"a--b", true, true},
		{"a..b", true, true},
		{"a_b", true, false},
		{"prod-a3f2e1", true, true},
		{"gpu.rack4", true, true},
		{"A", false, false},
		{"aB", false, false},
		{"a b", false, false},
		{"a/b", false, false},
		{"a:1", false, false},
		{"a\n", false, false},
		{"\na", false, false},
		{"a\x00", false, false},
		{"é", false, false},
		{"aé", false, false},
		{"a\xffb", false, false},
		{"a\u0131", false, false}, // dotless i: not folded to 'i'
		{"a\u212a", false, false}, // Kelvin sign: not folded to 'k'
		{strings.Repeat("a", 62), true, true},
		{strings.Repeat("a", 63), true, true},
		{strings.Repeat("a", 64), true, false},
		{"a" + strings.Repeat("-", 61) + "a", true, true},
		{"a" + strings.Repeat("-", 62) + "a", true, false},
		{strings.Repeat("a", 255), true, false},
		{strings.Repeat("a", 256), false, false},
		{strings.Repeat("_", 255), true, false},
		{strings.Repeat("é", 100), false, false},
	}
	for _, tt := range tests {
		if got := validTrustDomain(tt.in); got != tt.td || got != trustDomainRE.MatchString(tt.in) {
			t.Errorf("validTrustDomain(%q) = %v, want %v (regexp %v)", tt.in, got, tt.td, trustDomainRE.MatchString(tt.in))
		}
		if got := validName(tt.in); got != tt.nodeName || got != nameRE.MatchString(tt.in) {
			t.Errorf("validName(%q) = %v, want %v (regexp %v)", tt.in, got, tt.nodeName, nameRE.MatchString(tt.in))
		}
		if (ValidTrustDomain(tt.in) == nil) != tt.td || (ValidNodeID(tt.in) == nil) != tt.nodeName {
			t.Errorf("ValidTrustDomain/ValidNodeID(%q) disagree with validTrustDomain/validName", tt.in)
		}
	}
}

// TestValidLengthsMatchRegexp puts every byte at the start, the middle and the end of a name of each length
// where a rule changes (the first and last character; names end at 63,
// trust domains at 255) and of a few lengths between them: the lengths in
// between differ from their neighbours only in the count of middle bytes.
func TestValidLengthsMatchRegexp(t *testing.T) {
	for _, n := range []int{0, 1, 2, 3, 4, 5, 17, 61, 62, 63, 64, 65, 66, 128, 253, 254, 255, 256, 257, 258} {
		for c := 0; c < 256; c++ {
			b := []byte(strings.Repeat("a", n))
			for _, at := range []int{0, n / 2, n - 1} {
				if n == 0 {
					break
				}
				b[at] = byte(c)
				s := string(b)
				if validTrustDomain(s) != trustDomainRE.MatchString(s) {
					t.Fatalf("validTrustDomain(%q) = %v, regexp %v", s, validTrustDomain(s), !validTrustDomain(s))
				}
				if validName(s) != nameRE.MatchString(s) {
					t.Fatalf("validName(%q) = %v, regexp %v", s, validName(s), !validName(s))
				}
				b[at] = 'a'
			}
		}
	}
}

func FuzzValidMatchesRegexp(f *testing.F) {
	for _, s := range []string{"", "a", "a-", "-a", "node-1", "gpu.rack4", "td_x", "A", "a\n", "é", strings.Repeat("a", 63), strings.Repeat("a", 64), strings.Repeat("a", 255), strings.Repeat("a", 256)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := validTrustDomain(s), trustDomainRE.MatchString(s); got != want {
			t.Fatalf("validTrustDomain(%q) = %v, regexp %v", s, got, want)
		}
		if got, want := validName(s), nameRE.MatchString(s); got != want {
			t.Fatalf("validName(%q) = %v, regexp %v", s, got, want)
		}
		if fault := NameFault(s); (fault == "") != validName(s) {
			t.Fatalf("NameFault(%q) = %q, but validName says %v", s, fault, validName(s))
		}
	})
}

// TestNameFault: a refused name is told what in it breaks the rule, so an
// operator need not search a typed name for its one capital or
// underscore; a valid name has no fault.
func TestNameFault(t *testing.T) {
	for _, tt := range []struct{ name, want string }{
		{"web-1", ""},
		{"", "is empty"},
		{strings.Repeat("a", 64), "is 64 bytes long, over 63"},
		{"Web-1", "has the capital 'W': names are lower-case"},
		{"web_1", "has '_', which is not one of a-z 0-9 . -"},
		{"wéb", "has 'é', which is not one of a-z 0-9 . -"},
		{"spiffe://td/agent/web-1", "has ':', which is not one of a-z 0-9 . -"},
		{"-web", "starts with '-', not a letter or digit"},
		{"web.", "ends with '.', not a letter or digit"},
	} {
		if got := NameFault(tt.name); got != tt.want {
			t.Errorf("NameFault(%q) = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func BenchmarkParse(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse("spiffe://prod-a3f2e1/agent/bench-1234-node-0001"); err != nil {
			b.Fatal(err)
		}
	}
}

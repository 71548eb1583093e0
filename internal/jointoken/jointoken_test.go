package jointoken

import (
	"fmt"
	"strings"
	"testing"
)

func TestGenerate(t *testing.T) {
	seen := map[string]bool{}
	counts := map[rune]int{}
	for range 500 {
		tok, err := Generate()
		if err != nil {
			t.Fatal(err)
		}
		s := tok.Reveal()
		if !tokenRE.MatchString(s) {
			t.Fatalf("generated %q", s)
		}
		if seen[s] {
			t.Fatalf("duplicate token %q", s)
		}
		seen[s] = true
		for _, c := range s {
			counts[c]++
		}
		back, err := Parse(s)
		if err != nil || back != tok {
			t.Fatalf("Parse(Reveal) = %v, %v", back, err)
		}
	}
	// Every character of the alphabet shows up: no bias toward a subset.
	if len(counts) != len(alphabet)+1 {
		t.Fatalf("characters used: %d, want %d", len(counts), len(alphabet)+1)
	}
}

func TestParse(t *testing.T) {
	for _, tt := range []struct {
		in string
		ok bool
	}{
		{"abcdef.0123456789abcdef", true},
		{"abcdef.0123456789abcde", false},
		{"abcde.0123456789abcdef", false},
		{"ABCDEF.0123456789abcdef", false},
		{"abcdef:0123456789abcdef", false},
		{"abcdef.0123456789abcdef\n", false},
		{" abcdef.0123456789abcdef", false},
		{"", false},
	} {
		_, err := Parse(tt.in)
		if (err == nil) != tt.ok {
			t.Errorf("Parse(%q) = %v, want ok %v", tt.in, err, tt.ok)
		}
		if err != nil && strings.Contains(err.Error(), "0123456789") {
			t.Errorf("error repeats the input: %v", err)
		}
	}
}

func TestSecretEqualAndRedaction(t *testing.T) {
	tok, _ := Parse("abcdef.0123456789abcdef")
	if !tok.SecretEqual([]byte("0123456789abcdef")) || tok.SecretEqual([]byte("0123456789abcdeg")) || tok.SecretEqual(nil) {
		t.Fatal("SecretEqual wrong")
	}
	out := fmt.Sprintf("%v %s %+v %#v", tok, tok, tok, tok)
	if strings.Contains(out, "0123456789abcdef") || !strings.Contains(out, "abcdef") {
		t.Fatalf("printed: %s", out)
	}
}

func FuzzParse(f *testing.F) {
	f.Add("abcdef.0123456789abcdef")
	f.Add("abcdef.")
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := Parse(s)
		if err != nil {
			return
		}
		if tok.Reveal() != s || !ValidID(tok.ID) || len(tok.Secret()) != secretLen {
			t.Fatalf("Parse(%q) = %#v", s, tok)
		}
	})
}

func TestParseSVIDUsage(t *testing.T) {
	for in, want := range map[string]string{"": "", "client": "", "Client": "", "client,server": "client,server",
		"server,client": "client,server", "client, server": "client,server"} {
		if got, err := ParseSVIDUsage(in); err != nil || got != want {
			t.Errorf("ParseSVIDUsage(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"server", "client,client", "peer", "client,server,x"} {
		if _, err := ParseSVIDUsage(in); err == nil {
			t.Errorf("ParseSVIDUsage(%q) accepted", in)
		}
	}
}

// TestLooksLike: what may hold most of a join token's secret is refused
// as a name; a node ID that merely starts with six [a-z0-9] and a dot,
// and cannot hold one, is not (any such first label was refused before).
func TestLooksLike(t *testing.T) {
	tok, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	for s, want := range map[string]bool{
		tok.Reveal():                             true, // a token
		tok.Reveal()[:12]:                        true, // cut short
		tok.Reveal() + "x":                       true, // a character too many
		tok.Reveal() + "-node":                   true, // something glued after it
		tok.Reveal() + ".example":                true,
		tok.ID + "." + tok.Reveal()[7:19] + "-x": true, // 12 characters of it, then more
		"abc123.prod":                            true, // may be a token cut short: ambiguous, refused
		"abc123.":                                true,
		"web001.prod.example":                    false,
		"db0001.eu-west-1":                       false,
		"runner.linux-amd64":                     false,
		"web001":                                 false,
		"builder.x":                              false, // a first label of 7
		"abc12.abcdefghijklmnop":                 false, // an ID of 5
		"ABC123.abcdefghijklmnop":                false, // not a token's alphabet
	} {
		if got := LooksLike(s); got != want {
			t.Errorf("LooksLike(%q) = %v, want %v", s, got, want)
		}
	}
}

// FuzzLooksLike: whatever follows a whole token, and every prefix of one
// that reaches past the dot, is taken for a token.
func FuzzLooksLike(f *testing.F) {
	f.Add("", 7)
	f.Add("-node", 23)
	f.Add(".example.com", 12)
	f.Fuzz(func(t *testing.T, tail string, cut int) {
		tok, err := Generate()
		if err != nil {
			t.Fatal(err)
		}
		if !LooksLike(tok.Reveal() + tail) {
			t.Fatalf("LooksLike(token + %q) = false", tail)
		}
		if cut = idLen + 1 + int(uint(cut)%(secretLen+1)); !LooksLike(tok.Reveal()[:cut]) {
			t.Fatalf("LooksLike of the token's first %d characters = false", cut)
		}
	})
}

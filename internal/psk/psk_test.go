package psk

import (
	"fmt"
	"strings"
	"testing"
)

func TestGenerateParse(t *testing.T) {
	p, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	s := p.Reveal()
	if !strings.HasPrefix(s, Prefix) || len(s) != len(Prefix)+64 {
		t.Fatalf("Reveal = %q", s)
	}
	if q, err := Parse(s); err != nil || !q.Equal(p) {
		t.Fatalf("Parse(%q) = %v, %v", s, q, err)
	}
	if q, err := ParseHex(strings.TrimPrefix(s, Prefix)); err != nil || !q.Equal(p) {
		t.Fatalf("ParseHex = %v, %v", q, err)
	}
	other, _ := Generate()
	if other.Equal(p) {
		t.Fatal("two generated PSKs are equal")
	}
	if b, _ := FromBytes(p.Bytes()); !b.Equal(p) {
		t.Fatal("FromBytes(Bytes) changed the PSK")
	}
}

func TestParseRefusals(t *testing.T) {
	good := strings.Repeat("0a", 32)
	for _, in := range []string{
		"", Prefix, good[:63], good + "0", strings.ToUpper(good), Prefix + "g" + good[1:],
		"muster-psk " + good, " " + good, Prefix + Prefix + good,
		good, // the prefix is required: bare hex may be another secret
	} {
		if _, err := Parse(in); err != ErrMalformed {
			t.Errorf("Parse(%q) = %v, want ErrMalformed", in, err)
		}
	}
	if _, err := ParseHex(Prefix + good); err != ErrMalformed {
		t.Errorf("ParseHex took the prefix: %v", err)
	}
	zero := strings.Repeat("0", 64)
	if _, err := Parse(Prefix + zero); err != ErrAllZero {
		t.Errorf("Parse(all zeros) = %v, want ErrAllZero", err)
	}
	if _, err := ParseHex(zero); err != ErrAllZero {
		t.Errorf("ParseHex(all zeros) = %v, want ErrAllZero", err)
	}
	if _, err := FromBytes(make([]byte, 31)); err == nil {
		t.Error("FromBytes accepted 31 bytes")
	}
}

func TestRedacted(t *testing.T) {
	p, _ := Generate()
	secret := strings.TrimPrefix(p.Reveal(), Prefix)
	out := fmt.Sprintf("%v %s %+v %#v", p, p, p, p)
	if strings.Contains(out, secret[:8]) {
		t.Fatalf("secret printed: %s", out)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(Prefix + strings.Repeat("ab", 32))
	f.Add("zz")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := Parse(s)
		if err != nil {
			return
		}
		if q, err := Parse(p.Reveal()); err != nil || !q.Equal(p) {
			t.Fatalf("round trip of %q failed", s)
		}
		if s != p.Reveal() {
			t.Fatalf("Parse(%q) accepted a non-canonical form", s)
		}
	})
}

package pagetoken

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	for _, tt := range []struct {
		list List
		c    Cursor
	}{
		{Tokens, Cursor{Micros: 1_764_000_000_000_000, ID: "7f3k2a"}},
		{Tokens, Cursor{Micros: math.MinInt64, ID: "x"}},
		{Tokens, Cursor{Micros: -1, ID: "web-01.example"}},
		{Agents, Cursor{ID: "node-a"}},
		{Agents, Cursor{ID: strings.Repeat("n", MaxID)}},
	} {
		s := Encode(tt.list, tt.c)
		got, err := Decode(tt.list, s)
		if err != nil || got != tt.c {
			t.Errorf("Decode(Encode(%v)) = %v, %v", tt.c, got, err)
		}
	}
}

func TestDecodeRefuses(t *testing.T) {
	for _, tt := range []struct {
		name string
		list List
		s    string
	}{
		{"other list", Agents, Encode(Tokens, Cursor{ID: "7f3k2a"})},
		{"other version", Tokens, "AgEAAAAAAAAAAHg"},
		{"no ID", Tokens, Encode(Tokens, Cursor{Micros: 5})},
		{"not base64url", Tokens, "!!!!"},
		{"padded", Tokens, Encode(Tokens, Cursor{ID: "ab"}) + "="},
		{"standard alphabet", Tokens, strings.NewReplacer("-", "+", "_", "/").Replace(Encode(Tokens, Cursor{Micros: -1, ID: "\xff\xfe?>"}))},
		{"too short", Tokens, "AQE"},
		{"ID too long", Agents, Encode(Agents, Cursor{ID: strings.Repeat("n", MaxID+1)})},
		{"ID not UTF-8", Agents, Encode(Agents, Cursor{ID: "a\xffb"})},
		{"huge", Tokens, strings.Repeat("A", 1<<20)},
		{"line break", Agents, "AQI0\n00000000000"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if c, err := Decode(tt.list, tt.s); !errors.Is(err, ErrInvalid) {
				t.Errorf("Decode(%q) = %v, %v; want ErrInvalid", tt.s, c, err)
			}
		})
	}
}

// FuzzDecode feeds Decode arbitrary text, as a client may send: it must
// not panic, and whatever it accepts must be a cursor that encodes back to
// the same token (one cursor, one spelling).
func FuzzDecode(f *testing.F) {
	f.Add(Encode(Tokens, Cursor{Micros: 1_764_000_000_000_000, ID: "7f3k2a"}))
	f.Add(Encode(Agents, Cursor{ID: "node-a"}))
	f.Add("")
	f.Add("AQE")
	f.Fuzz(func(t *testing.T, s string) {
		for _, list := range []List{Tokens, Agents} {
			c, err := Decode(list, s)
			if err != nil {
				continue
			}
			if c.ID == "" || len(c.ID) > MaxID {
				t.Fatalf("Decode(%q) accepted ID %q", s, c.ID)
			}
			if again := Encode(list, c); again != s {
				t.Fatalf("Decode(%q) = %v, which encodes to %q", s, c, again)
			}
		}
	})
}

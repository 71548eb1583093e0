package joinuri

import (
	"errors"
	"strings"
	"testing"
)

// TestParseSaysWhatBreaksANameRule: a joining URI's node, authority_id or
// bound-keypair token name that breaks muster's name rule is refused
// saying what in it breaks it; before, "invalid SPIFFE ID".
func TestParseSaysWhatBreaksANameRule(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"muster+token://abcdef.0123456789abcdef@h:1?node=Web_1",
			`node "Web_1" is not a valid node name: it has the capital 'W'`},
		{"muster+psk://" + strings.Repeat("ab", 32) + "@disc:7450?fingerprint=" + fp + "&authority_id=prod_1",
			`authority_id "prod_1" is not a valid authority name: it has '_'`},
		{"muster+bound-keypair://bot.@h:1?fingerprint=" + fp,
			`bound-keypair token "bot." is not a valid bound-keypair token name: it ends with '.'`},
	} {
		_, err := Parse(tc.in)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "SPIFFE") {
			t.Errorf("Parse(%q) = %v, want it to say %q", tc.in, err, tc.want)
		}
	}
}

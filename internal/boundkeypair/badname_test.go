package boundkeypair

import (
	"strings"
	"testing"
)

// TestSpecCheckSaysWhatBreaksAName: a bound-keypair token's name or node
// that breaks muster's name rule is refused naming the field, what in it
// breaks the rule, and the rule; before, "invalid SPIFFE ID".
func TestSpecCheckSaysWhatBreaksAName(t *testing.T) {
	for _, tc := range []struct {
		s    Spec
		want string
	}{
		{Spec{Name: "Bot_1", Node: "bot-1", RecoveryLimit: 1, RecoveryMode: ModeStandard},
			`metadata.name "Bot_1" is not a valid bound-keypair token name: it has the capital 'B'`},
		{Spec{Name: "bot-1", Node: "bot_1", RecoveryLimit: 1, RecoveryMode: ModeStandard},
			`spec.node "bot_1" is not a valid node name: it has '_', which is not one of a-z 0-9 . -`},
	} {
		_, err := tc.s.Check()
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "SPIFFE") {
			t.Errorf("Check(%+v) = %v, want it to say %q", tc.s, err, tc.want)
		}
	}
}

package agent

import (
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/psk"
	"github.com/muster-dev/muster/internal/spiffeid"
)

// TestJoinRefusesABadNodeName: agent join --node Web_1 is refused saying
// what in the name breaks muster's rule, and the rule, whichever way it
// joins; before, it said "node ID: invalid SPIFFE ID", which nobody typed.
func TestJoinRefusesABadNodeName(t *testing.T) {
	const fp = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	key, err := psk.ParseHex(strings.Repeat("ab", 32))
	if err != nil {
		t.Fatal(err)
	}
	tok := jointoken.Token{ID: "abcdef"}
	for _, tc := range []struct {
		name string
		r    JoinRequest
		want string
	}{
		{"token", JoinRequest{Token: tok, Node: "Web_1", Authority: "127.0.0.1:7443"},
			`node "Web_1" is not a valid node name: it has the capital 'W': names are lower-case; node names are ` + spiffeid.NameRule},
		{"through discovery", JoinRequest{PSK: key, Node: "web_1", Discovery: "127.0.0.1:7450", AuthorityID: "prod-a3f2e1", CAFingerprint: fp},
			`node "web_1" is not a valid node name: it has '_', which is not one of a-z 0-9 . -`},
		{"bound keypair, its node", JoinRequest{BoundKeypair: "bot-1", Node: "-web", Authority: "127.0.0.1:7443", CAFingerprint: fp},
			`node "-web" is not a valid node name: it starts with '-', not a letter or digit`},
		{"bound keypair, its token", JoinRequest{BoundKeypair: "Bot-1", Node: "web-1", Authority: "127.0.0.1:7443", CAFingerprint: fp},
			`bound-keypair token "Bot-1" is not a valid bound-keypair token name: it has the capital 'B'`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.r.check()
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "SPIFFE") {
				t.Fatalf("check() = %v, want it to say %q", err, tc.want)
			}
		})
	}
}

package jointoken

import (
	"strings"
	"testing"
	"time"
)

func TestSpecCheck(t *testing.T) {
	ok := Spec{TTL: DefaultTTL, Uses: 1}
	for _, tc := range []struct {
		name string
		spec func(Spec) Spec
		want string // "" for accepted, else a word of the error
	}{
		{"default", func(s Spec) Spec { return s }, ""},
		{"negative ttl", func(s Spec) Spec { s.TTL = -time.Second; return s }, "ttl"},
		{"ttl 1ns, expired at creation", func(s Spec) Spec { s.TTL = time.Nanosecond; return s }, "at least 1s"},
		{"ttl 500ms", func(s Spec) Spec { s.TTL = 500 * time.Millisecond; return s }, "at least 1s"},
		{"ttl 1s", func(s Spec) Spec { s.TTL = time.Second; return s }, ""},
		{"negative uses", func(s Spec) Spec { s.Uses = -1; return s }, "uses"},
		{"unlimited", func(s Spec) Spec { s.TTL, s.Uses = 0, 0; return s }, "--unsafe-unlimited"},
		{"unlimited, unsafe", func(s Spec) Spec { s.TTL, s.Uses, s.UnsafeUnlimited = 0, 0, true; return s }, ""},
		{"long description", func(s Spec) Spec { s.Description = strings.Repeat("x", MaxDescription+1); return s }, "description"},
		// The rule is muster's, and a name was typed: not an "invalid
		// SPIFFE ID" (the old words).
		{"bad node", func(s Spec) Spec { s.Node = "Bad_Node"; return s }, `node "Bad_Node" is not a valid node name: it has the capital 'B': names are lower-case; node names are 1-63 of a-z 0-9 . -`},
		{"node with an underscore", func(s Spec) Spec { s.Node = "web_1"; return s }, `node "web_1" is not a valid node name: it has '_', which is not one of a-z 0-9 . -`},
		{"bad label key", func(s Spec) Spec { s.Labels = map[string]string{"A B": "v"}; return s }, "label"},
		{"long label value", func(s Spec) Spec {
			s.Labels = map[string]string{"k": strings.Repeat("v", MaxLabelValueLen+1)}
			return s
		}, "label"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.spec(ok).Check()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Check = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "SPIFFE")):
				t.Errorf("Check = %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

func TestUsage(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name  string
		u     Usage
		err   error
		state string
	}{
		{"fresh", Usage{ExpiresAt: now.Add(time.Hour), UsesAllowed: 1}, nil, StateActive},
		{"never expires", Usage{UsesAllowed: 1}, nil, StateActive},
		{"unlimited uses", Usage{ExpiresAt: now.Add(time.Hour), UsesCount: 1000}, nil, StateActive},
		{"used up", Usage{ExpiresAt: now.Add(time.Hour), UsesAllowed: 2, UsesCount: 2}, ErrUsedUp, StateUsedUp},
		{"expired at this instant", Usage{ExpiresAt: now, UsesAllowed: 1}, ErrExpired, StateExpired},
		{"expired and used up", Usage{ExpiresAt: now.Add(-time.Hour), UsesAllowed: 1, UsesCount: 1}, ErrExpired, StateExpired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.u.Check(now); err != tc.err {
				t.Errorf("Check = %v, want %v", err, tc.err)
			}
			if s := tc.u.State(now); s != tc.state {
				t.Errorf("State = %q, want %q", s, tc.state)
			}
		})
	}
}

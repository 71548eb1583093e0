package discovery

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// defaultCanonical is DefaultPolicy's canonical form: RFC 8785 sorts keys
// by code unit and writes no whitespace.
const defaultCanonical = `{"new_agents_per_day":1000,"rate_limits":{"per_authority":{"burst":100,"per_minute":600},"per_node_source":{"burst":3,"per_minute":6},"per_source":{"burst":20,"per_minute":60}}}`

// ignorePolicyInternals leaves out the compiled forms, which cmp cannot read.
var ignorePolicyInternals = cmpopts.IgnoreUnexported(Policy{})

// policyJSON is the JSON of DefaultPolicy changed by edit.
func policyJSON(t testing.TB, edit func(p *Policy)) string {
	t.Helper()
	p := DefaultPolicy()
	if edit != nil {
		edit(&p)
	}
	raw, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// fullPolicy uses every field.
func fullPolicy() Policy {
	p := DefaultPolicy()
	p.AllowedCIDRs = []string{"10.0.0.0/8", "2001:db8::/32"}
	p.NodeIDPattern = "(web|db)-[0-9]+"
	p.NodeIDPrefixes = []string{"web-", "db-"}
	p.DeniedNodeIDPatterns = []string{"web-0+", "db-666"}
	return p
}

func repeat(n int, f func(i int) string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = f(i)
	}
	return out
}

func TestParsePolicyAccepts(t *testing.T) {
	for _, tc := range []struct {
		name string
		json string
		want Policy
	}{
		{"default", policyJSON(t, nil), DefaultPolicy()},
		{"default canonical", defaultCanonical, DefaultPolicy()},
		{"every field", policyJSON(t, func(p *Policy) { *p = fullPolicy() }), fullPolicy()},
		{"whitespace around", " \n\t" + defaultCanonical + "\n ", DefaultPolicy()},
		{"64 entries", policyJSON(t, func(p *Policy) {
			p.AllowedCIDRs = repeat(64, func(i int) string { return fmt.Sprintf("10.%d.0.0/16", i) })
		}), func() Policy {
			p := DefaultPolicy()
			p.AllowedCIDRs = repeat(64, func(i int) string { return fmt.Sprintf("10.%d.0.0/16", i) })
			return p
		}()},
		{"no quota", policyJSON(t, func(p *Policy) { p.NewAgentsPerDay = 0 }), func() Policy {
			p := DefaultPolicy()
			p.NewAgentsPerDay = 0
			return p
		}()},
		{"largest quota and rates", policyJSON(t, func(p *Policy) {
			p.NewAgentsPerDay = maxQuota
			p.RateLimits.PerSource = Rate{maxRate, maxRate}
		}), func() Policy {
			p := DefaultPolicy()
			p.NewAgentsPerDay = maxQuota
			p.RateLimits.PerSource = Rate{maxRate, maxRate}
			return p
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePolicy([]byte(tc.json))
			if err != nil {
				t.Fatalf("ParsePolicy: %v", err)
			}
			if diff := cmp.Diff(tc.want, got, ignorePolicyInternals); diff != "" {
				t.Errorf("policy (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParsePolicyRefuses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		json    string
		wantErr string
	}{
		{"not JSON", `rate_limits`, "invalid character"},
		{"empty", ``, "EOF"},
		{"array", `[]`, "cannot unmarshal array"},
		{"null", `null`, "rate_limits.per_node_source"},
		{"empty object", `{}`, "rate_limits.per_node_source"},
		{"unknown field", strings.TrimSuffix(defaultCanonical, "}") + `,"new_field":1}`, `unknown field "new_field"`},
		{"unknown nested field", policyJSON(t, nil)[:1] + `"rate_limits":{"per_day":{"burst":1}},` + policyJSON(t, nil)[1:], `unknown field "per_day"`},
		{"trailing object", defaultCanonical + ` {}`, "trailing data"},
		{"trailing garbage", defaultCanonical + `x`, "trailing data"},
		{"trailing brace", defaultCanonical + `}`, "trailing data"},
		{"trailing bracket", defaultCanonical + `]`, "trailing data"},
		{"trailing comma", defaultCanonical + `,`, "trailing data"},
		{"too large", defaultCanonical + strings.Repeat(" ", MaxPolicyBytes), "larger than 16384 bytes"},
		{"fractional rate", strings.Replace(defaultCanonical, `"per_minute":6}`, `"per_minute":6.5}`, 1), "cannot unmarshal number 6.5"},
		{"rate as string", strings.Replace(defaultCanonical, `"per_minute":6}`, `"per_minute":"6"}`, 1), "cannot unmarshal string"},
		{"bad CIDR", policyJSON(t, func(p *Policy) { p.AllowedCIDRs = []string{"10.0.0.0/33"} }), "allowed_cidrs"},
		{"not a CIDR", policyJSON(t, func(p *Policy) { p.AllowedCIDRs = []string{"10.0.0.1"} }), "allowed_cidrs"},
		{"CIDR with a zone", policyJSON(t, func(p *Policy) { p.AllowedCIDRs = []string{"fe80::%eth0/64"} }), "allowed_cidrs"},
		{"CIDR with host bits", policyJSON(t, func(p *Policy) { p.AllowedCIDRs = []string{"10.1.2.3/8"} }), "10.1.2.3/8 has host bits set (did you mean 10.0.0.0/8?)"},
		{"IPv6 CIDR with host bits", policyJSON(t, func(p *Policy) { p.AllowedCIDRs = []string{"2001:db8::1/32"} }), "has host bits set"},
		{"bad regexp", policyJSON(t, func(p *Policy) { p.NodeIDPattern = "web(" }), "node_id_pattern: error parsing regexp"},
		{"pattern escaping its anchors", policyJSON(t, func(p *Policy) { p.NodeIDPattern = "web)|(.*" }), "node_id_pattern: error parsing regexp"},
		{"unterminated quote", policyJSON(t, func(p *Policy) { p.NodeIDPattern = `\Qweb` }), "node_id_pattern: error parsing regexp"},
		{"bad denied regexp", policyJSON(t, func(p *Policy) { p.DeniedNodeIDPatterns = []string{"ok", "[a-"} }), "denied_node_id_patterns: error parsing regexp"},
		{"denied pattern escaping its anchors", policyJSON(t, func(p *Policy) { p.DeniedNodeIDPatterns = []string{"x)|(y"} }), "denied_node_id_patterns"},
		{"too-long pattern", policyJSON(t, func(p *Policy) { p.NodeIDPattern = strings.Repeat("a", maxPatternLen+1) }), "pattern longer than 256 characters"},
		{"too-long denied pattern", policyJSON(t, func(p *Policy) { p.DeniedNodeIDPatterns = []string{strings.Repeat("a", maxPatternLen+1)} }), "pattern longer than 256 characters"},
		{"empty prefix", policyJSON(t, func(p *Policy) { p.NodeIDPrefixes = []string{""} }), `node_id_prefixes: "" is not the start of a node ID`},
		{"upper-case prefix", policyJSON(t, func(p *Policy) { p.NodeIDPrefixes = []string{"Web-"} }), "node_id_prefixes"},
		{"prefix with underscore", policyJSON(t, func(p *Policy) { p.NodeIDPrefixes = []string{"web_"} }), "node_id_prefixes"},
		{"prefix with inner bad character", policyJSON(t, func(p *Policy) { p.NodeIDPrefixes = []string{"we b"} }), "node_id_prefixes"},
		{"prefix starting with a dash", policyJSON(t, func(p *Policy) { p.NodeIDPrefixes = []string{"-web"} }), "node_id_prefixes"},
		{"prefix starting with a dot", policyJSON(t, func(p *Policy) { p.NodeIDPrefixes = []string{".web"} }), "node_id_prefixes"},
		{"prefix too long", policyJSON(t, func(p *Policy) { p.NodeIDPrefixes = []string{strings.Repeat("a", 64)} }), "node_id_prefixes"},
		{"zero per_minute", policyJSON(t, func(p *Policy) { p.RateLimits.PerNodeSource.PerMinute = 0 }), "rate_limits.per_node_source"},
		{"zero burst", policyJSON(t, func(p *Policy) { p.RateLimits.PerSource.Burst = 0 }), "rate_limits.per_source"},
		{"negative per_minute", policyJSON(t, func(p *Policy) { p.RateLimits.PerAuthority.PerMinute = -1 }), "rate_limits.per_authority"},
		{"negative burst", policyJSON(t, func(p *Policy) { p.RateLimits.PerAuthority.Burst = -5 }), "rate_limits.per_authority"},
		{"rate too high", policyJSON(t, func(p *Policy) { p.RateLimits.PerSource.PerMinute = maxRate + 1 }), "between 1 and 1000000"},
		{"burst too high", policyJSON(t, func(p *Policy) { p.RateLimits.PerNodeSource.Burst = maxRate + 1 }), "between 1 and 1000000"},
		{"negative quota", policyJSON(t, func(p *Policy) { p.NewAgentsPerDay = -1 }), "new_agents_per_day"},
		{"quota above exact integers", policyJSON(t, func(p *Policy) { p.NewAgentsPerDay = 1<<53 + 1 }), "new_agents_per_day"},
		{"65 CIDRs", policyJSON(t, func(p *Policy) {
			p.AllowedCIDRs = repeat(65, func(i int) string { return fmt.Sprintf("10.%d.0.0/16", i) })
		}), "at most 64 entries"},
		{"65 prefixes", policyJSON(t, func(p *Policy) {
			p.NodeIDPrefixes = repeat(65, func(i int) string { return fmt.Sprintf("p%d", i) })
		}), "at most 64 entries"},
		{"65 denied patterns", policyJSON(t, func(p *Policy) {
			p.DeniedNodeIDPatterns = repeat(65, func(i int) string { return fmt.Sprintf("d%d", i) })
		}), "at most 64 entries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParsePolicy([]byte(tc.json))
			if err == nil {
				t.Fatalf("ParsePolicy(%.200s) succeeded", tc.json)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q does not contain %q", err, tc.wantErr)
			}
			if !strings.HasPrefix(err.Error(), "discovery: policy") {
				t.Errorf("error %q does not start with the package prefix", err)
			}
		})
	}
}

func TestPolicyAdmit(t *testing.T) {
	cidrs := func(c ...string) func(*Policy) { return func(p *Policy) { p.AllowedCIDRs = c } }
	pattern := func(re string) func(*Policy) { return func(p *Policy) { p.NodeIDPattern = re } }
	prefixes := func(pre ...string) func(*Policy) { return func(p *Policy) { p.NodeIDPrefixes = pre } }
	denied := func(re ...string) func(*Policy) { return func(p *Policy) { p.DeniedNodeIDPatterns = re } }
	const anywhere = "192.0.2.1"
	for _, tc := range []struct {
		name   string
		edit   func(*Policy)
		source string // "" is the zero netip.Addr
		node   string
		want   string // the denial reason; "" admits
	}{
		{"default admits anything valid", nil, anywhere, "web-1", ""},
		{"default admits an unknown source", nil, "", "web-1", ""},

		{"IPv4 in CIDR", cidrs("10.0.0.0/8", "2001:db8::/32"), "10.1.2.3", "web-1", ""},
		{"IPv4 outside CIDR", cidrs("10.0.0.0/8", "2001:db8::/32"), "11.0.0.1", "web-1", DenySource},
		{"IPv6 in CIDR", cidrs("10.0.0.0/8", "2001:db8::/32"), "2001:db8::7", "web-1", ""},
		{"IPv6 outside CIDR", cidrs("10.0.0.0/8", "2001:db8::/32"), "2001:db9::7", "web-1", DenySource},
		{"IPv4-mapped IPv6 in an IPv4 CIDR", cidrs("10.0.0.0/8"), "::ffff:10.1.2.3", "web-1", ""},
		{"IPv4-mapped IPv6 outside an IPv4 CIDR", cidrs("10.0.0.0/8"), "::ffff:11.1.2.3", "web-1", DenySource},
		{"IPv4 in an IPv4-mapped CIDR", cidrs("::ffff:10.0.0.0/104"), "10.1.2.3", "web-1", ""},
		{"IPv4-mapped in an IPv4-mapped CIDR", cidrs("::ffff:10.0.0.0/104"), "::ffff:10.1.2.3", "web-1", ""},
		{"IPv4 outside an IPv4-mapped CIDR", cidrs("::ffff:10.0.0.0/104"), "11.1.2.3", "web-1", DenySource},
		{"IPv4 never matches an IPv6 CIDR", cidrs("::/0"), "10.1.2.3", "web-1", DenySource},
		{"host CIDR", cidrs("192.0.2.1/32"), "192.0.2.1", "web-1", ""},
		{"zone never matches", cidrs("fe80::/10"), "fe80::1%eth0", "web-1", DenySource},
		{"unknown source with CIDRs", cidrs("0.0.0.0/0"), "", "web-1", DenySource},
		{"source is checked before the node ID", cidrs("10.0.0.0/8"), "11.0.0.1", "NOT VALID", DenySource},

		{"invalid node ID", nil, anywhere, "Web_1", DenyInvalid},
		{"empty node ID", nil, anywhere, "", DenyInvalid},
		{"node ID ending with a dash", nil, anywhere, "web-", DenyInvalid},
		{"node ID too long", nil, anywhere, strings.Repeat("a", 64), DenyInvalid},
		{"node ID with a newline", pattern("web.*"), anywhere, "web\n", DenyInvalid},
		{"invalid node ID before the pattern", pattern("x"), anywhere, "X", DenyInvalid},

		{"pattern matches the whole ID", pattern("web"), anywhere, "web", ""},
		{"pattern is not a prefix match", pattern("web"), anywhere, "web-1", DenyNodeID},
		{"pattern is not a suffix match", pattern("web"), anywhere, "aweb", DenyNodeID},
		{"alternation: first", pattern("a|b"), anywhere, "a", ""},
		{"alternation: second", pattern("a|b"), anywhere, "b", ""},
		{"alternation is anchored on the left branch", pattern("a|b"), anywhere, "a-1", DenyNodeID},
		{"alternation is anchored on the right branch", pattern("a|b"), anywhere, "1-b", DenyNodeID},
		{"alternation of both", pattern("a|b"), anywhere, "ab", DenyNodeID},
		{"pattern with anchors of its own", pattern("^web-[0-9]+$"), anywhere, "web-12", ""},
		{"multi-line flag does not unanchor", pattern("(?m)web"), anywhere, "web-1", DenyNodeID},
		{"quoted literal", pattern(`\Qweb.1\E`), anywhere, "web.1", ""},
		{"quoted literal is literal", pattern(`\Qweb.1\E`), anywhere, "webx1", DenyNodeID},

		{"first prefix", prefixes("web-", "db-"), anywhere, "web-1", ""},
		{"second prefix", prefixes("web-", "db-"), anywhere, "db-2", ""},
		{"whole ID as prefix", prefixes("web-", "db-1"), anywhere, "db-1", ""},
		{"no prefix", prefixes("web-", "db-"), anywhere, "cache-1", DenyNodeID},

		{"denied pattern", denied("admin.*", "root"), anywhere, "admin-7", DenyNodeID},
		{"denied literal", denied("admin.*", "root"), anywhere, "root", DenyNodeID},
		{"denied pattern matches the whole ID", denied("admin.*", "root"), anywhere, "rooted", ""},
		{"denied alternation is anchored", denied("x|y"), anywhere, "x-1", ""},
		{"not denied", denied("admin.*", "root"), anywhere, "web-1", ""},

		{"every rule passes", func(p *Policy) { *p = fullPolicy() }, "10.9.9.9", "web-12", ""},
		{"every rule: denied pattern", func(p *Policy) { *p = fullPolicy() }, "10.9.9.9", "web-000", DenyNodeID},
		{"every rule: pattern", func(p *Policy) { *p = fullPolicy() }, "10.9.9.9", "web-x", DenyNodeID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParsePolicy([]byte(policyJSON(t, tc.edit)))
			if err != nil {
				t.Fatal(err)
			}
			var src netip.Addr
			if tc.source != "" {
				src = netip.MustParseAddr(tc.source)
			}
			err = p.Admit(src, tc.node)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Admit(%s, %q) = %v, want admitted", src, tc.node, err)
				}
				return
			}
			var d *Denial
			if !errors.As(err, &d) {
				t.Fatalf("Admit(%s, %q) = %v, want a *Denial %s", src, tc.node, err, tc.want)
			}
			if d.Reason != tc.want {
				t.Errorf("reason = %q (%s), want %q", d.Reason, d.Detail, tc.want)
			}
			if want := "discovery: " + tc.want + ": "; !strings.HasPrefix(err.Error(), want) || d.Detail == "" {
				t.Errorf("message %q does not start with %q followed by a detail", err, want)
			}
		})
	}
}

func TestDenialReasons(t *testing.T) {
	// The reasons are metric labels and the start of messages: they stay
	// as they are.
	got := []string{DenySource, DenyNodeID, DenyRateLimit, DenyQuota, DenyUnknown, DenyInvalid}
	want := []string{"source_not_allowed", "node_id_not_allowed", "rate_limited", "quota_exhausted", "unknown_authority", "invalid_request"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("reasons (-want +got):\n%s", diff)
	}
}

func TestAdmitFailsClosedWithoutValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Policy
	}{
		{"CIDRs", Policy{AllowedCIDRs: []string{"10.0.0.0/8"}}},
		{"pattern", Policy{NodeIDPattern: "web"}},
		{"denied patterns", Policy{DeniedNodeIDPatterns: []string{"web"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.Admit(netip.MustParseAddr("192.0.2.1"), "db-1")
			var d *Denial
			if err == nil || errors.As(err, &d) {
				t.Fatalf("Admit on an unvalidated policy = %v, want an error that is not a denial", err)
			}
		})
	}
	t.Run("failed Validate keeps the old rules", func(t *testing.T) {
		p := Policy{RateLimits: DefaultPolicy().RateLimits, AllowedCIDRs: []string{"10.0.0.0/8"}}
		if err := p.Validate(); err != nil {
			t.Fatal(err)
		}
		p.AllowedCIDRs = []string{"0.0.0.0/0"}
		p.NodeIDPattern = "(" // fails: nothing of this attempt may be kept
		if err := p.Validate(); err == nil {
			t.Fatal("Validate accepted a bad pattern")
		}
		if err := p.Admit(netip.MustParseAddr("192.0.2.1"), "web-1"); err == nil {
			t.Error("Admit admitted a source outside the last valid CIDRs")
		}
	})
}

func TestValidateDoesNotWriteIntoACopy(t *testing.T) {
	p := DefaultPolicy()
	p.AllowedCIDRs = []string{"10.0.0.0/8"}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	q := p // shares p's compiled slices
	q.AllowedCIDRs = []string{"192.0.2.0/24"}
	if err := q.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := p.Admit(netip.MustParseAddr("10.1.1.1"), "web-1"); err != nil {
		t.Errorf("validating a copy changed the original: %v", err)
	}
	if err := p.Admit(netip.MustParseAddr("192.0.2.1"), "web-1"); err == nil {
		t.Error("validating a copy changed the original: it admits the copy's CIDR")
	}
}

func TestPolicyCanonical(t *testing.T) {
	t.Run("golden default", func(t *testing.T) {
		got, err := DefaultPolicy().Canonical()
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != defaultCanonical {
			t.Errorf("Canonical() =\n%s\nwant\n%s", got, defaultCanonical)
		}
	})

	// One policy written two ways: other key order at every level, other
	// whitespace.
	compact := `{"allowed_cidrs":["10.0.0.0/8"],"node_id_pattern":"web-[0-9]+","rate_limits":{"per_node_source":{"per_minute":6,"burst":3},"per_source":{"per_minute":60,"burst":20},"per_authority":{"per_minute":600,"burst":100}},"new_agents_per_day":1000000000}`
	pretty := `
	{
	  "new_agents_per_day" : 1000000000,
	  "rate_limits" : {
	    "per_authority"   : { "burst" : 100, "per_minute" : 600 },
	    "per_source"      : { "burst" : 20,  "per_minute" : 60  },
	    "per_node_source" : { "burst" : 3,   "per_minute" : 6   }
	  },
	  "node_id_pattern" : "web-[0-9]+",
	  "allowed_cidrs"   : [ "10.0.0.0/8" ]
	}`
	const want = `{"allowed_cidrs":["10.0.0.0/8"],"new_agents_per_day":1000000000,"node_id_pattern":"web-[0-9]+","rate_limits":{"per_authority":{"burst":100,"per_minute":600},"per_node_source":{"burst":3,"per_minute":6},"per_source":{"burst":20,"per_minute":60}}}`
	for _, tc := range []struct{ name, json string }{{"compact", compact}, {"pretty", pretty}} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParsePolicy([]byte(tc.json))
			if err != nil {
				t.Fatal(err)
			}
			got, err := p.Canonical()
			if err != nil {
				t.Fatal(err)
			}
			// Sorted keys, no whitespace, integers written in full (not
			// 1e+09).
			if string(got) != want {
				t.Errorf("Canonical() =\n%s\nwant\n%s", got, want)
			}
		})
	}

	t.Run("empty lists are left out", func(t *testing.T) {
		p := DefaultPolicy()
		p.AllowedCIDRs, p.NodeIDPrefixes = []string{}, []string{}
		got, err := p.Canonical()
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != defaultCanonical {
			t.Errorf("Canonical() = %s, want %s", got, defaultCanonical)
		}
	})

	t.Run("escapes", func(t *testing.T) {
		p := DefaultPolicy()
		p.NodeIDPattern = `<a>&\d`
		got, err := p.Canonical()
		if err != nil {
			t.Fatal(err)
		}
		// RFC 8785 writes < > & as themselves, not as json.Marshal's
		// \u003c; a backslash is escaped.
		if want := `"node_id_pattern":"<a>&\\d"`; !strings.Contains(string(got), want) {
			t.Errorf("Canonical() = %s, want it to contain %s", got, want)
		}
	})

	t.Run("round trip", func(t *testing.T) {
		c, err := fullPolicy().Canonical()
		if err != nil {
			t.Fatal(err)
		}
		p, err := ParsePolicy(c)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(fullPolicy(), p, ignorePolicyInternals); diff != "" {
			t.Errorf("policy (-want +got):\n%s", diff)
		}
	})
}

func FuzzParsePolicy(f *testing.F) {
	f.Add([]byte(defaultCanonical))
	full, _ := json.Marshal(fullPolicy())
	f.Add(full)
	f.Add([]byte(`{"allowed_cidrs":["::ffff:10.0.0.0/104"],"node_id_pattern":"a|b","node_id_prefixes":["a"],"denied_node_id_patterns":["\\Qx\\E"],` + defaultCanonical[1:]))
	f.Add([]byte(defaultCanonical + "}"))
	f.Add([]byte(`{"new_agents_per_day":9007199254740993,` + defaultCanonical[1:]))
	f.Add([]byte(`{"node_id_pattern":"web)|(.*",` + defaultCanonical[1:]))
	f.Add([]byte(`{"RATE_LIMITS":{}}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"node_id_pattern":"\ud800"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParsePolicy(data)
		if err != nil {
			return
		}
		_ = p.Admit(netip.MustParseAddr("10.1.2.3"), "web-1")
		c, err := p.Canonical()
		if err != nil {
			t.Fatalf("Canonical of a parsed policy: %v", err)
		}
		p2, err := ParsePolicy(c)
		if err != nil {
			t.Fatalf("ParsePolicy(Canonical) = %v\ncanonical: %s", err, c)
		}
		c2, err := p2.Canonical()
		if err != nil {
			t.Fatal(err)
		}
		if string(c) != string(c2) {
			t.Fatalf("canonical form changed on a round trip:\n%s\n%s", c, c2)
		}
		if diff := cmp.Diff(p, p2, ignorePolicyInternals, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("policy changed on a round trip (-first +second):\n%s", diff)
		}
	})
}

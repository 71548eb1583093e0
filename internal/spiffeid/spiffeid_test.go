package spiffeid

import (
	"crypto/x509"
	"errors"
	"net/url"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in   string
		want ID
		ok   bool
	}{
		{"spiffe://prod-a3f2e1/agent/node-1", ID{"prod-a3f2e1", RoleAgent, "node-1"}, true},
		{"spiffe://example.org/admin/alice", ID{"example.org", RoleAdmin, "alice"}, true},
		{"spiffe://td/authority/dev-000000", ID{"td", RoleAuthority, "dev-000000"}, true},
		{"spiffe://td/agent/a", ID{"td", RoleAgent, "a"}, true},
		{"https://td/agent/a", ID{}, false},
		{"spiffe://td/agent", ID{}, false},
		{"spiffe://td/agent/a/b", ID{}, false},
		{"spiffe://td/robot/a", ID{}, false},
		{"spiffe://TD/agent/a", ID{}, false},
		{"spiffe://td/agent/Node", ID{}, false},
		{"spiffe://td/agent/-a", ID{}, false},
		{"spiffe://td:443/agent/a", ID{}, false},
		{"spiffe://u@td/agent/a", ID{}, false},
		{"spiffe://td/agent/a?x=1", ID{}, false},
		{"spiffe://td/agent/a%2e", ID{}, false},
		{"spiffe:///agent/a", ID{}, false},
		{"spiffe://td//agent/a", ID{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := Parse(tt.in)
			if tt.ok != (err == nil) {
				t.Fatalf("Parse = %v, %v", got, err)
			}
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			if got != tt.want {
				t.Fatalf("Parse = %+v, want %+v", got, tt.want)
			}
			if tt.ok && (got.String() != tt.in || got.URL().String() != tt.in) {
				t.Fatalf("round trip: %s / %s", got, got.URL())
			}
		})
	}
}

func TestFromCertificate(t *testing.T) {
	u := func(s string) *url.URL { v, _ := url.Parse(s); return v }
	one := &x509.Certificate{URIs: []*url.URL{u("spiffe://td/agent/n")}}
	if id, err := FromCertificate(one); err != nil || id.Name != "n" {
		t.Fatalf("FromCertificate = %v, %v", id, err)
	}
	two := &x509.Certificate{URIs: []*url.URL{u("spiffe://td/agent/n"), u("spiffe://td/admin/n")}}
	for _, c := range []*x509.Certificate{nil, {}, two} {
		if _, err := FromCertificate(c); err == nil {
			t.Errorf("FromCertificate(%v) accepted", c)
		}
	}
}

func TestNodeID(t *testing.T) {
	long := "a"
	for len(long) < 63 {
		long += "b"
	}
	for name, ok := range map[string]bool{
		"n": true, "node-1": true, "gpu.rack4": true, long: true, long + "c": false,
		"": false, "a-": false, ".a": false, "A": false, "a_b": false, "a/b": false,
	} {
		if (ValidNodeID(name) == nil) != ok {
			t.Errorf("ValidNodeID(%q) ok = %v, want %v", name, !ok, ok)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add("spiffe://td/agent/node-1")
	f.Add("spiffe://a.b/admin/x")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := Parse(s)
		if err != nil {
			return
		}
		if id.String() != s {
			t.Fatalf("Parse(%q) accepted a non-canonical form %q", s, id)
		}
		back, err := url.Parse(id.URL().String())
		if err != nil || back.String() != s {
			t.Fatalf("URL form of %q does not round-trip", s)
		}
	})
}

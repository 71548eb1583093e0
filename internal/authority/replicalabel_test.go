package authority

import (
	"errors"
	"testing"
)

// TestReplicaLabel: a replica bound elsewhere than it advertises is named
// by host and bound address; without a host name, by the bound address
// alone, never with an empty name ("replica  at").
func TestReplicaLabel(t *testing.T) {
	host := func(h string, err error) func() (string, error) { return func() (string, error) { return h, err } }
	for _, tc := range []struct {
		name, advertise, bound string
		hostname               func() (string, error)
		want                   string
	}{
		{"bound where advertised", "10.0.0.1:8443", "10.0.0.1:8443", host("a1", nil), "10.0.0.1:8443"},
		{"behind a balancer", "ca.example:443", "10.0.0.1:8443", host("a1", nil), "ca.example:443 (replica a1 at 10.0.0.1:8443)"},
		{"host name fails", "ca.example:443", "10.0.0.1:8443", host("", errors.New("no name")), "ca.example:443 (replica at 10.0.0.1:8443)"},
		{"host name empty", "ca.example:443", "10.0.0.1:8443", host("", nil), "ca.example:443 (replica at 10.0.0.1:8443)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := replicaLabel(tc.advertise, tc.bound, tc.hostname); got != tc.want {
				t.Errorf("replicaLabel = %q, want %q", got, tc.want)
			}
		})
	}
}

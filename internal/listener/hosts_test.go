package listener

import (
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestHosts(t *testing.T) {
	name, err := os.Hostname()
	if err != nil {
		t.Skip("no host name:", err)
	}
	if name == "localhost" {
		t.Skip("the machine is called localhost")
	}
	for _, tc := range []struct {
		name  string
		addrs []string
		want  []string
	}{
		{"named host", []string{"muster.example:7443"}, []string{"muster.example"}},
		{"specific IP without loopback", []string{"192.0.2.7:7443", "192.0.2.7:7443"}, []string{"192.0.2.7"}},
		{"IPv6", []string{"[2001:db8::1]:7443"}, []string{"2001:db8::1"}},
		{"bare host", []string{"muster.example"}, []string{"muster.example"}},
		{"every interface", []string{":7443"}, []string{name, "localhost", "127.0.0.1", "::1"}},
		{"every IPv4 interface", []string{"0.0.0.0:7443"}, []string{name, "localhost", "127.0.0.1", "::1"}},
		{"every IPv6 interface", []string{"[::]:7443"}, []string{name, "localhost", "127.0.0.1", "::1"}},
		{"loopback", []string{"127.0.0.1:0", "127.0.0.1:41234"}, []string{"127.0.0.1", "localhost", "::1"}},
		{"localhost", []string{"localhost:7450"}, []string{"localhost", "127.0.0.1", "::1"}},
		{"listen, bound, advertised", []string{"0.0.0.0:7443", "0.0.0.0:7443", "muster.example:443"},
			[]string{name, "localhost", "127.0.0.1", "::1", "muster.example"}},
		{"empty entries", []string{"", "muster.example:7443", ""}, []string{"muster.example"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Hosts(tc.addrs...)); diff != "" {
				t.Errorf("Hosts(%q) (-want +got):\n%s", tc.addrs, diff)
			}
		})
	}
}

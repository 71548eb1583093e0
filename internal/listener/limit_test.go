package listener

import (
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestConnectionsPerSourceAreCapped: past max open connections from one
// source, a new one is closed at once; closing one frees its place; a
// trusted proxy is not counted.
func TestConnectionsPerSourceAreCapped(t *testing.T) {
	for _, tt := range []struct {
		name    string
		exempt  []netip.Prefix
		limited bool
	}{
		{"direct", nil, true},
		{"trusted proxy", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			raw, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			lis := withSourceLimit(raw, 3, tt.exempt, func(Refusal) {})
			defer lis.Close()
			accepted, dial := acceptAll(lis), dialTo(t, raw.Addr().String())
			var server []net.Conn
			for i := 0; i < 3; i++ {
				dial()
				server = append(server, <-accepted)
			}
			fourth := dial()
			if got := closedAtOnce(fourth, 500*time.Millisecond); got != tt.limited {
				t.Fatalf("fourth connection closed at once: %v, want %v", got, tt.limited)
			}
			if !tt.limited {
				return
			}
			// One closes: its place is free again.
			server[0].Close()
			fifth := dial()
			select {
			case c := <-accepted:
				defer c.Close()
			case <-time.After(5 * time.Second):
				t.Fatal("a connection was refused after one of the source's closed")
			}
			if closedAtOnce(fifth, 500*time.Millisecond) {
				t.Fatal("the fifth connection was closed")
			}
		})
	}
}

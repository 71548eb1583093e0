package listener

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	proxyproto "github.com/pires/go-proxyproto"
)

func TestParseTrustedProxies(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      []string
		want    []netip.Prefix
		wantErr string
	}{
		{name: "none"},
		{name: "address", in: []string{"10.0.0.1"}, want: []netip.Prefix{netip.MustParsePrefix("10.0.0.1/32")}},
		{name: "IPv6 address", in: []string{"2001:db8::1"}, want: []netip.Prefix{netip.MustParsePrefix("2001:db8::1/128")}},
		{name: "mapped address", in: []string{"::ffff:10.0.0.1"}, want: []netip.Prefix{netip.MustParsePrefix("10.0.0.1/32")}},
		{name: "range, masked", in: []string{" 10.1.2.3/8 "}, want: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}},
		{name: "several", in: []string{"10.0.0.0/8", "192.0.2.1"},
			want: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.1/32")}},
		{name: "host name", in: []string{"lb.example"}, wantErr: `trusted proxy "lb.example": want an IP address or a CIDR range`},
		{name: "bad range", in: []string{"10.0.0.0/33"}, wantErr: "want an IP address or a CIDR range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseTrustedProxies(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestListenReportsTheSystemReason(t *testing.T) {
	busy, err := Listen("127.0.0.1:0", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	_, err = Listen(Addr(busy), Options{})
	if !errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), Addr(busy)) {
		t.Fatalf("second bind: %v, want the reason alone", err)
	}
	if Addr(nil) != "" {
		t.Error("Addr of no listener is not empty")
	}
}

// v2Header is what a load balancer sends before the client's bytes.
func v2Header(t *testing.T, client string) []byte {
	t.Helper()
	h := proxyproto.HeaderProxyFromAddrs(2, net.TCPAddrFromAddrPort(netip.MustParseAddrPort(client)),
		net.TCPAddrFromAddrPort(netip.MustParseAddrPort("192.0.2.1:7443")))
	b, err := h.Format()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// accepted is what the server side of a connection saw.
type accepted struct {
	remote string
	data   []byte
}

// through connects to a listener bound with trusted, sends what, and
// returns what the accepted connection saw.
func through(t *testing.T, trusted []netip.Prefix, what []byte) accepted {
	t.Helper()
	lis, err := Listen("127.0.0.1:0", Options{TrustedProxies: trusted})
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	got := make(chan accepted, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			got <- accepted{remote: "accept: " + err.Error()}
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		data, _ := io.ReadAll(c)
		got <- accepted{remote: c.RemoteAddr().String(), data: data}
	}()
	c, err := net.Dial("tcp", Addr(lis))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(what); err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).CloseWrite()
	defer c.Close()
	select {
	case a := <-got:
		return a
	case <-time.After(20 * time.Second):
		t.Fatal("no connection accepted in 20s")
		return accepted{}
	}
}

func TestTrustedProxy(t *testing.T) {
	payload := []byte("hello")
	loopback := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	elsewhere := []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}

	t.Run("trusted peer, v2 header", func(t *testing.T) {
		a := through(t, loopback, append(v2Header(t, "198.51.100.7:40000"), payload...))
		if a.remote != "198.51.100.7:40000" || !bytes.Equal(a.data, payload) {
			t.Errorf("saw %s %q, want the header's source and the payload alone", a.remote, a.data)
		}
	})
	t.Run("trusted peer, v1 header", func(t *testing.T) {
		a := through(t, loopback, append([]byte("PROXY TCP4 198.51.100.8 192.0.2.1 40000 7443\r\n"), payload...))
		if a.remote != "198.51.100.8:40000" || !bytes.Equal(a.data, payload) {
			t.Errorf("saw %s %q, want the header's source and the payload alone", a.remote, a.data)
		}
	})
	t.Run("trusted peer without a header", func(t *testing.T) {
		a := through(t, loopback, payload)
		if !strings.HasPrefix(a.remote, "127.0.0.1:") || !bytes.Equal(a.data, payload) {
			t.Errorf("saw %s %q, want the TCP peer and the payload", a.remote, a.data)
		}
	})
	for name, trusted := range map[string][]netip.Prefix{"untrusted peer": elsewhere, "no trusted proxies": nil} {
		t.Run(name, func(t *testing.T) {
			h := v2Header(t, "198.51.100.7:40000")
			a := through(t, trusted, append(h, payload...))
			// The header is not honoured: it stays in the data, where
			// TLS or HTTP refuses it.
			if !strings.HasPrefix(a.remote, "127.0.0.1:") || !bytes.Equal(a.data, append(h, payload...)) {
				t.Errorf("saw %s %q, want the TCP peer and the header left unread", a.remote, a.data)
			}
		})
	}
}

package e2e

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// headersAccepted sends one gRPC request whose metadata carries padding
// bytes, the way a hostile client would (ignoring the server's advertised
// limit), and reports whether the server answered it with response headers
// (true) or reset the stream or the connection (false).
func headersAccepted(t *testing.T, addr, path string, padding int) bool {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "https"}, {Name: ":path", Value: path},
		{Name: ":authority", Value: addr}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
		{Name: "x-padding", Value: strings.Repeat("a", padding)},
	} {
		enc.WriteField(f)
	}
	const frameMax = 16 << 10
	b := block.Bytes()
	first := b[:min(frameMax, len(b))]
	b = b[len(first):]
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: first, EndStream: true, EndHeaders: len(b) == 0}); err != nil {
		return false
	}
	for len(b) > 0 {
		chunk := b[:min(frameMax, len(b))]
		b = b[len(chunk):]
		if err := fr.WriteContinuation(1, len(b) == 0, chunk); err != nil {
			return false // the server closed the connection on us
		}
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			if errors.Is(err, io.EOF) || strings.Contains(err.Error(), "reset") || strings.Contains(err.Error(), "closed") {
				return false
			}
			t.Fatalf("reading the answer: %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.HeadersFrame:
			if f.StreamID == 1 {
				return true
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == 1 {
				return false
			}
		case *http2.GoAwayFrame:
			return false
		}
	}
}

// TestHeaderListIsCapped: gRPC metadata is capped on every listener, the
// authority's API and bootstrap listeners and discovery's, before any
// handler runs; a request with small metadata still gets its answer.
// (Discovery serves gRPC through net/http, whose MaxHeaderBytes caps it.)
func TestHeaderListIsCapped(t *testing.T) {
	t.Parallel()
	e := newJoinEnv(t, "--bootstrap-listen", "127.0.0.1:0")
	disc := startDiscovery(t, filepath.Join(t.TempDir(), "discovery"))
	for _, tt := range []struct{ name, addr, path string }{
		{"authority", e.auth.addr, "/muster.v1.BootstrapService/GetTrustBundle"},
		{"bootstrap listener", e.auth.bootstrap, "/muster.v1.BootstrapService/GetTrustBundle"},
		{"discovery", disc.addr, "/muster.v1.DiscoveryService/LookupAuthority"},
	} {
		if !headersAccepted(t, tt.addr, tt.path, 1<<10) {
			t.Errorf("%s: a request with 1 KiB of metadata was refused", tt.name)
		}
		if headersAccepted(t, tt.addr, tt.path, 1<<20) {
			t.Errorf("%s: a request with 1 MiB of metadata was taken", tt.name)
		}
	}
}

// TestSilentConnectionIsClosed: a client that connects and never starts
// its TLS handshake is disconnected after the handshake timeout (10 s),
// not held for gRPC's default two minutes.
func TestSilentConnectionIsClosed(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	auth := startAuthority(t, dir)
	c, err := net.Dial("tcp", auth.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	c.SetReadDeadline(start.Add(30 * time.Second))
	_, err = c.Read(make([]byte, 1))
	if took := time.Since(start); err == nil || took > 20*time.Second {
		t.Fatalf("silent connection: read %v after %v, want it closed within about 10s", err, took)
	}
}

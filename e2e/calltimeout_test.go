package e2e

import (
	"bytes"
	"crypto/tls"
	"io"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// stalledCallStatus opens a gRPC call on addr without a deadline, sends
// its headers and never its request, and returns the grpc-status the
// server ends it with ("" if it still held it after wait).
func stalledCallStatus(t *testing.T, addr, path string, wait time.Duration) string {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(wait))
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "https"}, {Name: ":path", Value: path},
		{Name: ":authority", Value: addr}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	} {
		enc.WriteField(f)
	}
	// No END_STREAM: the request is still to come.
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return ""
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				fr.WritePing(true, f.Data)
			}
		case *http2.MetaHeadersFrame:
			if s := headerValue(f, "grpc-status"); f.StreamID == 1 && s != "" {
				return s
			}
		}
	}
}

func headerValue(f *http2.MetaHeadersFrame, name string) string {
	for _, h := range f.RegularFields() {
		if h.Name == name {
			return h.Value
		}
	}
	return ""
}

// TestStalledCallEndsAtCallTimeout: through the binary, a call whose
// request never comes is ended DEADLINE_EXCEEDED (grpc-status 4) at
// --call-timeout, on the api and the bootstrap listener, not held for as
// long as the client keeps its connection.
func TestStalledCallEndsAtCallTimeout(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	auth := startAuthority(t, dir, "--bootstrap-listen", "127.0.0.1:0", "--call-timeout", "1s")
	for _, tt := range []struct{ name, addr string }{
		{"api listener", auth.addr},
		{"bootstrap listener", auth.bootstrap},
	} {
		start := time.Now()
		if got := stalledCallStatus(t, tt.addr, "/muster.v1.BootstrapService/GetTrustBundle", 20*time.Second); got != "4" {
			t.Errorf("%s: a call whose request never came: grpc-status %q after %s, want 4 (DEADLINE_EXCEEDED) at the 1 s call timeout", tt.name, got, time.Since(start).Round(time.Millisecond))
		}
	}
}

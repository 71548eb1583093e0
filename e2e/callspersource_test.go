package e2e

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// holdCalls opens n gRPC calls on one connection to addr, sends their
// headers and never their requests, and keeps the connection answering
// the server's settings and pings until the test closes it.
func holdCalls(t *testing.T, addr, path string, n int) io.Closer {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		var block bytes.Buffer
		enc := hpack.NewEncoder(&block)
		for _, f := range []hpack.HeaderField{
			{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "https"}, {Name: ":path", Value: path},
			{Name: ":authority", Value: addr}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
		} {
			enc.WriteField(f)
		}
		// No END_STREAM: the request is still to come.
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
	}
	go func() {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
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
			}
		}
	}()
	return conn
}

// TestCallsPerSourceAreCapped: through the binary, with
// --max-calls-per-source 4, one source holding four calls whose request
// never comes (up to the call timeout, a minute) has the next call
// refused at once, RESOURCE_EXHAUSTED (grpc-status 8), on the api and the
// bootstrap listener alike (they share the count); the refusal is
// audited with its source and the setting to raise; and once the held
// calls end, the source's calls are served again. Before, one source
// could hold 100 calls on each of its 256 connections.
func TestCallsPerSourceAreCapped(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	auth := startAuthority(t, dir, "--bootstrap-listen", "127.0.0.1:0", "--max-calls-per-source", "4")
	if !strings.Contains(auth.Logs(), `"max_calls_per_source":4,`) {
		t.Errorf("the start log does not name the cap:\n%s", auth.Logs())
	}
	const method = "/muster.v1.BootstrapService/GetTrustBundle"
	held := []io.Closer{holdCalls(t, auth.addr, method, 2), holdCalls(t, auth.bootstrap, method, 2)}
	// The held calls reach the server in their own time; a probe that is
	// held instead of refused is ended and tried again.
	var got string
	for deadline := time.Now().Add(30 * time.Second); got != "8" && time.Now().Before(deadline); {
		got = stalledCallStatus(t, auth.addr, method, 2*time.Second)
	}
	if got != "8" {
		t.Fatalf("a call past the source's 4 in flight: grpc-status %q, want 8 (RESOURCE_EXHAUSTED)", got)
	}
	start := time.Now()
	if got := stalledCallStatus(t, auth.bootstrap, method, 20*time.Second); got != "8" {
		t.Errorf("on the bootstrap listener: grpc-status %q after %s, want 8 (RESOURCE_EXHAUSTED) at once", got, time.Since(start).Round(time.Millisecond))
	}
	for _, c := range held {
		c.Close()
	}
	// The places are given back as the held calls end with their
	// connections.
	waitFor(t, 10*time.Second, "the source is served again", func() bool {
		return muster(t, nil, "status", "--data", dir, "--timeout", "5s").code == 0
	})
	var recs []map[string]any
	json.Unmarshal([]byte(mustRun(t, "audit", "list", "--data", dir, "-o", "json", "--action", "api.access")), &recs)
	var found int
	for _, r := range recs {
		reason, _ := r["reason"].(string)
		if r["result"] == "denied" && r["source"] == "127.0.0.1" && r["target"] == method &&
			strings.Contains(reason, "limits.max_calls_per_source (4)") && strings.Contains(reason, "raise limits.max_calls_per_source") {
			found++
		}
	}
	if found < 2 {
		t.Errorf("%d refusals audited with the source and the setting, want at least 2: %v", found, recs)
	}
}

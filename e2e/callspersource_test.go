package e2e

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// heldCalls are gRPC calls holdCalls keeps open.
type heldCalls struct {
	conn net.Conn
	// status has the grpc-status of each call the server ends (a
	// refusal's, or the call timeout's), in the order they come.
	status chan string
}

func (h *heldCalls) Close() error { return h.conn.Close() }

// holdCalls opens n gRPC calls on one connection to addr, sends their
// headers and never their requests, and keeps the connection answering
// the server's settings and pings until the test closes it.
func holdCalls(t *testing.T, addr, path string, n int) *heldCalls {
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
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
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
	h := &heldCalls{conn: conn, status: make(chan string, n)}
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
			case *http2.MetaHeadersFrame:
				if s := headerValue(f, "grpc-status"); s != "" {
					select {
					case h.status <- s:
					default:
					}
				}
			}
		}
	}()
	return h
}

// firstStatus is the grpc-status of the first of the held calls the
// server ends, "" if none ends within wait.
func firstStatus(wait time.Duration, held ...*heldCalls) string {
	cases := make([]reflect.SelectCase, 0, len(held)+1)
	for _, h := range held {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(h.status)})
	}
	cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(time.After(wait))})
	i, v, _ := reflect.Select(cases)
	if i == len(held) {
		return ""
	}
	return v.String()
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
	// Five calls on three connections, two listeners: the calls reach the
	// server in their own order (a later connection's may come first), so
	// whichever comes fifth is refused, and the other four are held.
	held := []*heldCalls{holdCalls(t, auth.addr, method, 2), holdCalls(t, auth.bootstrap, method, 2), holdCalls(t, auth.addr, method, 1)}
	if got := firstStatus(30*time.Second, held...); got != "8" {
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

// TestDiscoveryCallLimits: through the binary, discovery's
// --max-calls-per-source caps the calls one source has in flight (the
// next refused at once, RESOURCE_EXHAUSTED, audited naming the setting),
// and limits.call_timeout in discovery.yaml ends a call whose request
// never comes at that timeout (DEADLINE_EXCEEDED). Before, discovery's
// call timeout was a fixed minute and its calls were not capped per
// source.
func TestDiscoveryCallLimits(t *testing.T) {
	t.Parallel()
	const method = "/muster.v1.DiscoveryService/LookupAuthority"
	t.Run("calls per source", func(t *testing.T) {
		t.Parallel()
		dir := filepath.Join(t.TempDir(), "discovery")
		d := startDiscovery(t, dir, "--max-calls-per-source", "2")
		if !strings.Contains(d.Logs(), `"max_calls_per_source":2,`) {
			t.Errorf("the start log does not name the cap:\n%s", d.Logs())
		}
		// Three calls on two connections, neither over the cap alone:
		// whichever reaches the server third is refused, the others are
		// held. (Not a probe ended and tried again until refused: sent
		// after the held calls, it may overtake them, take the place of
		// the one refused in its stead, and give it back when ended, so
		// that no probe is ever third.)
		got := firstStatus(30*time.Second, holdCalls(t, d.addr, method, 2), holdCalls(t, d.addr, method, 1))
		if got != "8" {
			t.Fatalf("a call past the source's 2 in flight: grpc-status %q, want 8 (RESOURCE_EXHAUSTED)", got)
		}
		var found bool
		waitFor(t, 10*time.Second, "the refusal is audited", func() bool {
			for _, r := range discoveryAudit(t, dir, "--action", "api.access") {
				found = found || r.Source == "127.0.0.1" && strings.Contains(r.Reason, "2 calls from 127.0.0.1 have not ended") &&
					strings.Contains(r.Reason, "raise discovery's limits.max_calls_per_source")
			}
			return found
		})
	})
	t.Run("call timeout from discovery.yaml", func(t *testing.T) {
		t.Parallel()
		dir := filepath.Join(t.TempDir(), "discovery")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "discovery.yaml"), []byte("limits:\n  call_timeout: 1s\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		d := startDiscovery(t, dir)
		if !strings.Contains(d.Logs(), `"call_timeout":"1s"`) {
			t.Errorf("the start log does not name the call timeout:\n%s", d.Logs())
		}
		start := time.Now()
		if got := stalledCallStatus(t, d.addr, method, 20*time.Second); got != "4" {
			t.Errorf("a call whose request never came: grpc-status %q after %s, want 4 (DEADLINE_EXCEEDED) at the 1 s call timeout", got, time.Since(start).Round(time.Millisecond))
		}
	})
}

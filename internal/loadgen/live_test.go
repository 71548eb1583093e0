package loadgen

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/pprofserve"
)

// memStatsTail is the end of a heap profile's text as runtime/pprof writes
// it (debug=1), trimmed to a few of its MemStats lines.
const memStatsTail = `heap profile: 3: 2048 [9: 8192] @ heap/1048576
1: 1024 [1: 1024] @ 0x4a1b2c 0x4a1d3e
#	0x4a1b2b	main.f+0x2b	/src/main.go:10

# runtime.MemStats
# Alloc = 4194304
# TotalAlloc = 9000000
# HeapAlloc = 4194304
# HeapSys = 8388608
# Stack = 655360 / 655360
# MSpan = 1 / 2
`

func TestParseLiveMemory(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     LiveMemory
		err      string
	}{
		{"profile", memStatsTail, LiveMemory{HeapAlloc: 4194304, Stack: 655360}, ""},
		{"crlf", strings.ReplaceAll(memStatsTail, "\n", "\r\n"), LiveMemory{HeapAlloc: 4194304, Stack: 655360}, ""},
		{"stack in use below its sys", "# HeapAlloc = 0\n# Stack = 32768 / 65536\n", LiveMemory{Stack: 32768}, ""},
		{"empty", "", LiveMemory{}, "no \"# HeapAlloc"},
		{"binary profile", "\x1f\x8b\x08\x00", LiveMemory{}, "no \"# HeapAlloc"},
		{"no stack", "# HeapAlloc = 10\n", LiveMemory{}, "no \"# HeapAlloc"},
		{"no heap", "# Stack = 10 / 10\n", LiveMemory{}, "no \"# HeapAlloc"},
		{"heap not a number", "# HeapAlloc = 1e6\n# Stack = 1 / 1\n", LiveMemory{}, "HeapAlloc \"1e6\""},
		{"heap negative", "# HeapAlloc = -1\n# Stack = 1 / 1\n", LiveMemory{}, "HeapAlloc \"-1\""},
		{"stack without sys", "# HeapAlloc = 1\n# Stack = 10\n", LiveMemory{}, "Stack \"10\""},
		{"stack with spaces", "# HeapAlloc = 1\n# Stack = 10 /  20\n", LiveMemory{}, "Stack \"10 /  20\""},
		{"heap twice", "# HeapAlloc = 1\n# HeapAlloc = 2\n# Stack = 1 / 1\n", LiveMemory{}, "HeapAlloc given twice"},
		{"stack twice", "# HeapAlloc = 1\n# Stack = 1 / 1\n# Stack = 2 / 2\n", LiveMemory{}, "Stack given twice"},
		// HeapAllocs (no space before "=") is not HeapAlloc.
		{"other names", "# HeapAllocs = 5\n# StackSys = 5\n", LiveMemory{}, "no \"# HeapAlloc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseLiveMemory([]byte(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %+v, %v; want an error with %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func FuzzParseLiveMemory(f *testing.F) {
	f.Add([]byte(memStatsTail))
	f.Add([]byte("# HeapAlloc = 1\n# Stack = 2 / 3\n"))
	f.Add([]byte("# Stack = 9223372036854775808 / 1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseLiveMemory(b)
		if err == nil && (m.HeapAlloc < 0 || m.Stack < 0) {
			t.Fatalf("%q parsed as %+v", b, m)
		}
		if err != nil && m != (LiveMemory{}) {
			t.Fatalf("%q: an error with a reading %+v", b, m)
		}
	})
}

// TestReadLiveMemory reads this process's own profiles through the handler
// the authority serves them with: the runtime's real text parses, and an
// address that is not a profile listener is a clear error.
func TestReadLiveMemory(t *testing.T) {
	srv := httptest.NewServer(pprofserve.Handler())
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	m, err := ReadLiveMemory(context.Background(), addr)
	if err != nil || m.HeapAlloc <= 0 || m.Stack <= 0 {
		t.Fatalf("got %+v, %v; want this process's heap and stacks", m, err)
	}

	notPprof := httptest.NewServer(http.NotFoundHandler())
	defer notPprof.Close()
	if _, err := ReadLiveMemory(context.Background(), strings.TrimPrefix(notPprof.URL, "http://")); err == nil ||
		!strings.Contains(err.Error(), "404") || !strings.Contains(err.Error(), "--pprof-listen") {
		t.Errorf("a listener without profiles: %v", err)
	}
	wrong := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("hello")) }))
	defer wrong.Close()
	if _, err := ReadLiveMemory(context.Background(), strings.TrimPrefix(wrong.URL, "http://")); err == nil ||
		!strings.Contains(err.Error(), "HeapAlloc") {
		t.Errorf("a listener answering something else: %v", err)
	}
	// Nothing listens there once the server is closed.
	gone := httptest.NewServer(pprofserve.Handler())
	gone.Close()
	if _, err := ReadLiveMemory(context.Background(), strings.TrimPrefix(gone.URL, "http://")); err == nil {
		t.Error("a closed address: want an error")
	}
	if _, err := ReadLiveMemory(context.Background(), "192.0.2.1:6060"); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("a non-loopback address: %v", err)
	}
}

func TestParseGoroutines(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		err  bool
	}{
		{"goroutine profile: total 30\n1 @ 0x1\n", 30, false},
		{"goroutine profile: total 7\r\n", 7, false},
		{"goroutine profile: total 0", 0, false},
		{"", 0, true},
		{"goroutine profile: total -1\n", 0, true},
		{"goroutine profile: total 3x\n", 0, true},
		{"heap profile: 3: 2048 [9: 8192] @ heap/1048576\n", 0, true},
		{"\x1f\x8b\x08\x00", 0, true},
	} {
		got, err := parseGoroutines([]byte(tc.in))
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("%q: got %d, %v; want %d, an error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

// TestReadGoroutines reads this process's own count through the handler
// the authority serves its profiles with.
func TestReadGoroutines(t *testing.T) {
	srv := httptest.NewServer(pprofserve.Handler())
	defer srv.Close()
	if n, err := ReadGoroutines(context.Background(), strings.TrimPrefix(srv.URL, "http://")); err != nil || n <= 0 {
		t.Fatalf("got %d, %v; want this process's goroutines", n, err)
	}
}

// TestWaitSetupGone: the wait reads the count until it is back to the
// count before the setup (not the first reading, nor a fixed time), and
// past its bound returns the count still above it.
func TestWaitSetupGone(t *testing.T) {
	// An authority whose goroutine count falls by one a reading, from
	// 35, as the setup's connections close.
	var reads atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/debug/pprof/goroutine" || r.URL.Query().Get("debug") != "1" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "goroutine profile: total %d\n", 35-reads.Add(1)+1)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	if n, err := waitSetupGone(context.Background(), addr, 30, time.Minute); err != nil || n != 30 || reads.Load() != 6 {
		t.Fatalf("got %d, %v after %d readings; want 30 at the sixth", n, err, reads.Load())
	}
	// Past its bound it returns what it read last, above the base.
	reads.Store(0)
	if n, err := waitSetupGone(context.Background(), addr, 0, 120*time.Millisecond); err != nil || n <= 0 || n >= 35 {
		t.Fatalf("got %d, %v; want a count above 0 once the bound passed", n, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	reads.Store(0)
	if _, err := waitSetupGone(ctx, addr, 0, time.Minute); err == nil {
		t.Error("a cancelled context: want its error")
	}
}

package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/muster-dev/muster/internal/pprofserve"
)

// LiveMemory is the authority's live memory as its runtime counts it,
// read from its --pprof-listen address after a forced collection: the
// heap still reachable and the goroutine stacks in use. Unlike the
// resident set it does not include memory the runtime holds but has not
// yet returned to the system, so it is what a stream itself costs.
type LiveMemory struct {
	// HeapAlloc is MemStats.HeapAlloc right after a collection.
	HeapAlloc int64
	// Stack is MemStats.StackInuse.
	Stack int64
}

// liveRead bounds one reading: the forced collection and the profile of a
// heap holding thousands of streams take seconds, not minutes.
const liveRead = time.Minute

// liveMax bounds the profile read: its text lists every allocation site,
// a few megabytes at most.
const liveMax = 256 << 20

// ReadLiveMemory asks the authority's profiles at addr (HOST:PORT of its
// --pprof-listen, loopback only) for its heap after forced collections
// (/debug/pprof/heap?debug=1&gc=1) and parses the runtime's MemStats from
// the end of that text.
//
// It asks twice and reads the second answer: what sync.Pools hold (TLS
// record buffers, gRPC's buffers, many of them after thousands of
// handshakes) survives one collection in the pools' victim caches and is
// freed by the next, so after one collection the heap read 2–30 KiB a
// stream above what the streams hold, depending on how many buffers the
// last burst pooled.
func ReadLiveMemory(ctx context.Context, addr string) (LiveMemory, error) {
	if err := pprofserve.CheckAddr(addr); err != nil {
		return LiveMemory{}, fmt.Errorf("loadgen: the authority's %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, liveRead)
	defer cancel()
	url := "http://" + addr + "/debug/pprof/heap?debug=1&gc=1"
	var b []byte
	for range 2 {
		var err error
		if b, err = getProfile(ctx, url, addr); err != nil {
			return LiveMemory{}, err
		}
	}
	m, err := parseLiveMemory(b)
	if err != nil {
		return LiveMemory{}, fmt.Errorf("%w (is %s the authority's --pprof-listen address?)", err, addr)
	}
	return m, nil
}

// ReadGoroutines is the authority's goroutine count, from the first line
// of its goroutine profile at addr (/debug/pprof/goroutine?debug=1,
// "goroutine profile: total N").
func ReadGoroutines(ctx context.Context, addr string) (int, error) {
	if err := pprofserve.CheckAddr(addr); err != nil {
		return 0, fmt.Errorf("loadgen: the authority's %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, liveRead)
	defer cancel()
	b, err := getProfile(ctx, "http://"+addr+"/debug/pprof/goroutine?debug=1", addr)
	if err != nil {
		return 0, err
	}
	n, err := parseGoroutines(b)
	if err != nil {
		return 0, fmt.Errorf("%w (is %s the authority's --pprof-listen address?)", err, addr)
	}
	return n, nil
}

// parseGoroutines reads N from the "goroutine profile: total N" line that
// begins a goroutine profile's text (debug=1).
func parseGoroutines(b []byte) (int, error) {
	line, _, _ := strings.Cut(string(b), "\n")
	v, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), "goroutine profile: total ")
	n, err := strconv.Atoi(v)
	if !ok || err != nil || n < 0 {
		if len(line) > 64 {
			line = line[:64] + "…"
		}
		return 0, fmt.Errorf("loadgen: goroutine profile begins %q: want \"goroutine profile: total N\"", line)
	}
	return n, nil
}

// getProfile is the body of one GET of url, a profile of the authority's
// at addr.
func getProfile(ctx context.Context, url, addr string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("loadgen: the authority's profiles: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("loadgen: the authority's profiles (its --pprof-listen address): %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("loadgen: GET %s: %s (is %s the authority's --pprof-listen address?)", url, resp.Status, addr)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, liveMax))
	if err != nil {
		return nil, fmt.Errorf("loadgen: GET %s: %w", url, err)
	}
	return b, nil
}

// parseLiveMemory reads "# HeapAlloc = N" and "# Stack = INUSE / SYS" from
// the MemStats comment block that ends a heap profile in its text form
// (debug=1). Each must appear exactly once with non-negative integers:
// anything else is not the profile expected.
func parseLiveMemory(b []byte) (LiveMemory, error) {
	var m LiveMemory
	var heap, stack bool
	for line := range strings.Lines(string(b)) {
		line = strings.TrimRight(line, "\r\n")
		if v, ok := strings.CutPrefix(line, "# HeapAlloc = "); ok {
			if heap {
				return LiveMemory{}, errors.New("loadgen: heap profile: HeapAlloc given twice")
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return LiveMemory{}, fmt.Errorf("loadgen: heap profile: HeapAlloc %q: want a byte count", v)
			}
			m.HeapAlloc, heap = n, true
		} else if v, ok := strings.CutPrefix(line, "# Stack = "); ok {
			if stack {
				return LiveMemory{}, errors.New("loadgen: heap profile: Stack given twice")
			}
			inuse, sys, ok := strings.Cut(v, " / ")
			n, err1 := strconv.ParseInt(inuse, 10, 64)
			s, err2 := strconv.ParseInt(sys, 10, 64)
			if !ok || err1 != nil || err2 != nil || n < 0 || s < 0 {
				return LiveMemory{}, fmt.Errorf("loadgen: heap profile: Stack %q: want INUSE / SYS byte counts", v)
			}
			m.Stack, stack = n, true
		}
	}
	if !heap || !stack {
		return LiveMemory{}, errors.New("loadgen: heap profile: no \"# HeapAlloc =\" and \"# Stack =\" lines (want the text of /debug/pprof/heap?debug=1)")
	}
	return m, nil
}

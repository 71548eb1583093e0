package authority

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/muster-dev/muster/internal/store"
)

// fakeCRLStore answers the cache's reads: the list it holds, or fail's
// error; block, if set, holds each read until it is closed or the read's
// context ends. It counts the reads.
type fakeCRLStore struct {
	mu    sync.Mutex
	list  store.CRL
	fail  error
	block chan struct{}
	reads atomic.Int64
}

func (f *fakeCRLStore) read(ctx context.Context, name string) (store.CRL, error) {
	f.reads.Add(1)
	f.mu.Lock()
	block, list, fail := f.block, f.list, f.fail
	f.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return store.CRL{}, fmt.Errorf("postgres: get crl: %w: %w", store.ErrUnavailable, ctx.Err())
		}
	}
	return list, fail
}

func (f *fakeCRLStore) set(list store.CRL, fail error, block chan struct{}) {
	f.mu.Lock()
	f.list, f.fail, f.block = list, fail, block
	f.mu.Unlock()
}

// fakeClock is a settable clock for crlCache.now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

const testCRLName = "agent-1d0e"

func newTestCRLCache(t *testing.T) (*crlCache, *fakeCRLStore, *fakeClock, *[]string) {
	t.Helper()
	f := &fakeCRLStore{}
	clock := &fakeClock{t: time.Now()}
	var mu sync.Mutex
	var failures []string
	c := newCRLCache(f.read, func(name string, err error, copy *store.CRL) {
		mu.Lock()
		defer mu.Unlock()
		failures = append(failures, fmt.Sprintf("%s copy=%v", name, copy != nil))
	})
	c.now = clock.now
	return c, f, clock, &failures
}

// TestCRLCacheConcurrentMissesShareOneRead: fetches of a list the
// replica does not hold, all at once, make one read of the store. Before,
// each fetch that found no list read the store itself until the first
// read came back.
func TestCRLCacheConcurrentMissesShareOneRead(t *testing.T) {
	t.Parallel()
	c, f, clock, _ := newTestCRLCache(t)
	release := make(chan struct{})
	list := store.CRL{Issuer: testCRLName, NextUpdate: clock.now().Add(time.Hour), DER: []byte("der")}
	f.set(list, nil, release)
	const fetches = 50
	var started, done sync.WaitGroup
	started.Add(fetches)
	errs := make(chan error, fetches)
	for range fetches {
		done.Go(func() {
			started.Done()
			l, err := c.get(t.Context(), testCRLName)
			if err == nil && string(l.DER) != "der" {
				err = fmt.Errorf("got list %q", l.DER)
			}
			errs <- err
		})
	}
	started.Wait()
	close(release)
	done.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a fetch: %v", err)
		}
	}
	if n := f.reads.Load(); n != 1 {
		t.Errorf("%d fetches at once made %d reads of the store, want 1", fetches, n)
	}
}

// TestCRLCacheStoreDown: with the store down (or slow), a copy before
// its nextUpdate is served and counted; a copy past it is not, nor is
// one the replica never held: those get the store's error. Within a
// second of a failed read the store is not asked again.
func TestCRLCacheStoreDown(t *testing.T) {
	t.Parallel()
	down := fmt.Errorf("postgres: get crl: %w: connection refused", store.ErrUnavailable)
	for _, tc := range []struct {
		name string
		// held: the replica read a list valid for validFor before the
		// store went down (slow: it hangs rather than failing).
		held     bool
		validFor time.Duration
		slow     bool
		wantCopy bool
	}{
		{name: "a valid copy, the store down", held: true, validFor: time.Hour, wantCopy: true},
		{name: "a valid copy, the store hung", held: true, validFor: time.Hour, slow: true, wantCopy: true},
		{name: "an expired copy, the store down", held: true, validFor: time.Second},
		{name: "no copy, the store down"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, f, clock, failures := newTestCRLCache(t)
			list := store.CRL{Issuer: testCRLName, NextUpdate: clock.now().Add(tc.validFor), DER: []byte("der")}
			if tc.held {
				f.set(list, nil, nil)
				if _, err := c.get(t.Context(), testCRLName); err != nil {
					t.Fatal(err)
				}
			}
			clock.add(2 * time.Second)
			if tc.slow {
				hang := make(chan struct{})
				defer close(hang)
				f.set(store.CRL{}, nil, hang)
			} else {
				f.set(store.CRL{}, down, nil)
			}
			reads := f.reads.Load()
			l, err := c.get(t.Context(), testCRLName)
			if tc.wantCopy {
				if err != nil || string(l.DER) != "der" {
					t.Fatalf("got %q, %v; want the copy", l.DER, err)
				}
				var m dto.Metric
				if err := c.servedCopy.Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
					n := m.GetCounter().GetValue()
					t.Errorf("muster_crl_served_copy_total = %v, want 1", n)
				}
			} else if !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("got %q, %v; want the store unavailable", l.DER, err)
			}
			if n := f.reads.Load() - reads; n != 1 {
				t.Errorf("%d reads of the store, want 1", n)
			}
			if tc.slow {
				return
			}
			if want := fmt.Sprintf("%s copy=%v", testCRLName, tc.wantCopy); len(*failures) != 1 || (*failures)[0] != want {
				t.Errorf("failures reported %v, want [%s]", *failures, want)
			}
			// Again within the second: same answer, no read.
			l2, err2 := c.get(t.Context(), testCRLName)
			if string(l2.DER) != string(l.DER) || (err2 == nil) != (err == nil) {
				t.Errorf("again: %q, %v; want %q, %v", l2.DER, err2, l.DER, err)
			}
			if n := f.reads.Load() - reads; n != 1 {
				t.Errorf("a fetch within the second of a failed read read the store: %d reads", n)
			}
		})
	}
}

// TestCRLHandlerStoreDown: through the handler, a valid copy is served
// while the store is down; with none, a 503 that says what to check.
func TestCRLHandlerStoreDown(t *testing.T) {
	t.Parallel()
	down := fmt.Errorf("postgres: get crl: %w: connection refused", store.ErrUnavailable)
	for _, tc := range []struct {
		name     string
		validFor time.Duration
		code     int
		body     string
	}{
		{"valid copy", time.Hour, http.StatusOK, "der"},
		{"expired copy", time.Second, http.StatusServiceUnavailable, "check the authority's store"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, f, clock, _ := newTestCRLCache(t)
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			s := &Server{log: log, crlCache: c}
			s.outage = newStoreOutage(log, func(context.Context) error { return nil })
			c.failed = s.crlReadFailed
			f.set(store.CRL{Issuer: testCRLName, NextUpdate: clock.now().Add(tc.validFor), DER: []byte("der")}, nil, nil)
			fetch := func() *httptest.ResponseRecorder {
				w := httptest.NewRecorder()
				s.crlHandler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/crl/"+testCRLName+".crl", nil))
				return w
			}
			if w := fetch(); w.Code != http.StatusOK {
				t.Fatalf("with the store up: %d %s", w.Code, w.Body)
			}
			clock.add(2 * time.Second)
			f.set(store.CRL{}, down, nil)
			if w := fetch(); w.Code != tc.code || !strings.Contains(w.Body.String(), tc.body) {
				t.Errorf("with the store down: %d %q, want %d with %q", w.Code, w.Body, tc.code, tc.body)
			}
		})
	}
}

// TestCRLCacheHungReadServesTheCopyAtOnce: once a read has gone
// unanswered for crlCopyWait, a fetch of a list held before its
// nextUpdate gets the copy without waiting for it again, so a relying
// party that waits less than that still gets it. Before, every fetch
// while the read hung waited crlCopyWait, and one whose client gave up
// sooner got nothing.
func TestCRLCacheHungReadServesTheCopyAtOnce(t *testing.T) {
	t.Parallel()
	c, f, clock, _ := newTestCRLCache(t)
	f.set(store.CRL{Issuer: testCRLName, NextUpdate: clock.now().Add(time.Hour), DER: []byte("der")}, nil, nil)
	if _, err := c.get(t.Context(), testCRLName); err != nil {
		t.Fatal(err)
	}
	clock.add(2 * crlReadEvery)
	hang := make(chan struct{})
	defer close(hang)
	f.set(store.CRL{}, nil, hang)
	// The first fetch starts the read and gets the copy after crlCopyWait.
	if l, err := c.get(t.Context(), testCRLName); err != nil || string(l.DER) != "der" {
		t.Fatalf("the fetch that started the read: %q, %v; want the copy", l.DER, err)
	}
	clock.add(crlCopyWait)
	// A client that gives up well within crlCopyWait; the deadline only
	// bounds a fetch that would wait.
	ctx, cancel := context.WithTimeout(t.Context(), crlCopyWait/10)
	defer cancel()
	if l, err := c.get(ctx, testCRLName); err != nil || string(l.DER) != "der" {
		t.Fatalf("a fetch while the read has hung for %s: %q, %v; want the copy at once", crlCopyWait, l.DER, err)
	}
	if n := f.reads.Load(); n != 2 {
		t.Errorf("%d reads of the store, want 2: the first and the one that hangs", n)
	}
}

// TestCRLCacheUnsignedListReadOncePerSecond: the list of an intermediate
// whose first list is not signed yet is read from the store at most once
// per crlReadEvery, as a signed one is; every fetch meanwhile gets the
// same answer (503, not signed yet). Before, no attempt was recorded for
// it, and every fetch read the store.
func TestCRLCacheUnsignedListReadOncePerSecond(t *testing.T) {
	t.Parallel()
	c, f, clock, failures := newTestCRLCache(t)
	f.set(store.CRL{}, fmt.Errorf("get crl %s: %w", testCRLName, store.ErrNotFound), nil)
	for i := range 5 {
		if _, err := c.get(t.Context(), testCRLName); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("fetch %d: %v, want not found", i, err)
		}
	}
	if n := f.reads.Load(); n != 1 {
		t.Fatalf("five fetches within %s read the store %d times, want 1", crlReadEvery, n)
	}
	clock.add(crlReadEvery)
	list := store.CRL{Issuer: testCRLName, NextUpdate: clock.now().Add(time.Hour), DER: []byte("der")}
	f.set(list, nil, nil)
	if got, err := c.get(t.Context(), testCRLName); err != nil || string(got.DER) != "der" {
		t.Fatalf("fetch once signed: %q, %v; want the list", got.DER, err)
	}
	if n := f.reads.Load(); n != 2 {
		t.Fatalf("the store was read %d times, want 2", n)
	}
	if len(*failures) != 0 {
		t.Errorf("a list not signed yet was reported as a failed read: %v", *failures)
	}
}

package postgres

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// TestConnectTimeoutNamed: a request that fails because connecting to a
// database that does not answer ran out of time names the setting that
// bounded it, with its value: the store URL's connect_timeout when the
// URL sets one (it named limits.store_timeout and the store's 20 s, which
// the operator would have raised to no effect), limits.store_timeout
// otherwise. The "database" accepts connections (the kernel's backlog)
// and never answers, as a hung server does.
func TestConnectTimeoutNamed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	base := "postgres://u@" + ln.Addr().String() + "/db?sslmode=disable"
	for _, tc := range []struct {
		name    string
		url     string
		timeout time.Duration
		// long: a request bounded by longRequestTimeout, whose
		// connecting the store's timeout still bounds.
		long    bool
		want    []string
		notWant string
	}{
		{"the URL's connect_timeout", base + "&connect_timeout=1", 20 * time.Second, false,
			[]string{"within 1s", "connect_timeout in the store URL"}, "(limits.store_timeout)"},
		{"the store's timeout", base, time.Second, false,
			[]string{"within 1s", "(limits.store_timeout)"}, "connect_timeout"},
		{"the store's timeout, a long request", base, time.Second, true,
			[]string{"within 1s", "(limits.store_timeout)"}, "long requests"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, _, err := newPool(t.Context(), tc.url, WithRequestTimeout(tc.timeout))
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			ctx := t.Context()
			if tc.long {
				ctx = long(ctx)
			}
			_, err = d.Exec(ctx, "SELECT 1")
			err = wrap("select", err)
			if !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("A request to a database that does not answer: %v, want ErrUnavailable", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v\ndoes not say %q", err, w)
				}
			}
			if strings.Contains(err.Error(), tc.notWant) {
				t.Errorf("%v\nsays %q", err, tc.notWant)
			}
		})
	}
}

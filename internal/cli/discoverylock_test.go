package cli

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/discoveryd"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/postgres"
)

// TestDiscoveryLockErrNamesStoreAndWayOut: every serving-lock refusal of
// discovery, whether its store has opened or not, names the store
// without its password and a way on. Before, one after the store opened
// went out bare ("postgres: the serving lock: …").
func TestDiscoveryLockErrNamesStoreAndWayOut(t *testing.T) {
	const url = "postgres://muster:s3cret@db.internal:5432/discovery"
	d := discoveryd.Dir("/var/lib/muster/discovery")
	for _, tt := range []struct {
		err  error
		want []string
	}{
		{fmt.Errorf("postgres: the serving lock: %w", store.ErrUnavailable), []string{"db.internal:5432/discovery", "start the database"}},
		{errors.New("postgres: the serving lock: permission denied"), []string{"db.internal:5432/discovery", "run this again: muster discovery --data /var/lib/muster/discovery"}},
		{postgres.ErrExcluded, []string{"muster store reapply", "muster discovery --data /var/lib/muster/discovery"}},
	} {
		msg := discoveryLockErr(d, url, tt.err).Error()
		for _, w := range tt.want {
			if !strings.Contains(msg, w) {
				t.Errorf("refusal %q lacks %q", msg, w)
			}
		}
		if strings.Contains(msg, "s3cret") {
			t.Errorf("refusal %q names the password", msg)
		}
	}
}

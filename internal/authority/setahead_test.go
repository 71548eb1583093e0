package authority

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

func aheadValue(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

type auditEvents struct {
	mu     sync.Mutex
	events []audit.Event
}

func (a *auditEvents) Record(_ context.Context, e audit.Event) (store.AuditRecord, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events = append(a.events, e)
	return store.AuditRecord{}, nil
}

// TestHeartbeatAheadOfTheStore: heartbeats reporting a verifier set
// version above the store's (a restored store) are logged once per
// version, counted, audited, and move the store's version past them.
func TestHeartbeatAheadOfTheStore(t *testing.T) {
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "muster.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	custody, _ := signer.NewSealed(seal.StorageKey{5})
	events := &auditEvents{}
	k := signer.NewKeeper(st, custody, events, "prod-a3f2e1", 0)
	if _, err := k.EnsureFirst(ctx, signer.Actor{Name: "authority"}); err != nil {
		t.Fatal(err)
	}
	ahead, err := newSetAhead(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	s := &Server{signers: k, setAhead: ahead, log: slog.New(slog.NewTextHandler(&logs, nil))}

	s.checkSetVersion(ctx, "n1", 1) // what the store holds: nothing to do
	if v, _ := k.SetVersion(ctx); v != 1 || aheadValue(t, ahead.detected) != 0 {
		t.Fatalf("a heartbeat at the store's version moved it to %d", v)
	}
	s.checkSetVersion(ctx, "n1", 7)
	s.checkSetVersion(ctx, "n2", 7) // another agent, the version already moved
	if v, _ := k.SetVersion(ctx); v != 8 {
		t.Fatalf("store version %d after heartbeats at 7, want 8", v)
	}
	if n := strings.Count(logs.String(), "newer than the store's"); n != 1 {
		t.Fatalf("logged %d times:\n%s", n, logs.String())
	}
	if aheadValue(t, ahead.detected) != 1 || aheadValue(t, ahead.highest) != 7 {
		t.Fatalf("metrics: detected %v, highest %v", aheadValue(t, ahead.detected), aheadValue(t, ahead.highest))
	}
	raw, err := k.VerifierSet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if set, err := signer.ParseVerifierSet(raw); err != nil || set.Version != 8 {
		t.Fatalf("published set %+v: %v", set, err)
	}
	last := events.events[len(events.events)-1]
	if last.Action != "node_task_signer.advance" || last.Result != audit.ResultOK {
		t.Fatalf("audit %+v", last)
	}
}

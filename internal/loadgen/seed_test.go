package loadgen

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/store"
)

// seedCalls is a SeedLoader that writes nothing and notes, in order, each
// Started call and each batch it is given.
type seedCalls struct{ calls []string }

func (c *seedCalls) LoadSeed(_ context.Context, b store.Seed) ([]bool, error) {
	c.calls = append(c.calls, "load")
	inserted := make([]bool, len(b.Tokens))
	for i := range inserted {
		inserted[i] = true
	}
	return inserted, nil
}

func seedTestConfig(t *testing.T) SeedConfig {
	t.Helper()
	h, err := ca.Create("test", time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	sealer, err := seal.StorageKey{1}.Sealer(seal.InfoToken)
	if err != nil {
		t.Fatal(err)
	}
	return SeedConfig{Tokens: 6, Nodes: 2, Batch: 4, CA: h, TrustDomain: "test.example", Sealer: sealer,
		CertTTL: time.Hour, TokenTTL: time.Hour, Actor: "test"}
}

// TestSeedStartedBeforeTheFirstRow: muster bench seed audits a seed in
// Started, so Started must come before any row is written (a seed killed
// part-way keeps the rows its batches committed), name the run the rows
// carry, and, when it fails, stop the seed before it writes anything.
func TestSeedStartedBeforeTheFirstRow(t *testing.T) {
	c := &seedCalls{}
	cfg := seedTestConfig(t)
	var run string
	cfg.Started = func(r string) error {
		c.calls = append(c.calls, "started")
		run = r
		return nil
	}
	res, err := Seed(t.Context(), c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Two batches of tokens, and the two nodes' joins with the first.
	if want := []string{"started", "load", "load", "load"}; !slices.Equal(c.calls, want) {
		t.Errorf("calls %v, want %v", c.calls, want)
	}
	if run == "" || run != res.Run {
		t.Errorf("Started was given run %q, the seed's is %q", run, res.Run)
	}

	c = &seedCalls{}
	refused := errors.New("the audit chain refused the record")
	cfg.Started = func(string) error { return refused }
	if _, err := Seed(t.Context(), c, cfg); !errors.Is(err, refused) {
		t.Errorf("Seed with a failing Started: %v, want its error", err)
	}
	if len(c.calls) != 0 {
		t.Errorf("Seed with a failing Started wrote %v, want nothing", c.calls)
	}
}

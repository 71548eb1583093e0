package authority

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/pgtest"
	"github.com/muster-dev/muster/internal/store/postgres"
)

var (
	benchPGOnce sync.Once
	benchPG     *pgtest.Server
	benchPGErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if benchPG != nil {
		benchPG.Stop()
	}
	os.Exit(code)
}

// BenchmarkReplicas: joins and renewals on one, two and three replicas
// sharing a PostgreSQL, with clients spread over them. The test server runs
// with fsync=off, so these figures measure the protocol, locking and round
// trips, not durable commits; BenchmarkExchangeJoinToken and
// BenchmarkRenewal are the durable single-node SQLite figures.
func BenchmarkReplicas(b *testing.B) {
	benchPGOnce.Do(func() { benchPG, benchPGErr = pgtest.Start() })
	pgtest.FailOrSkip(b, benchPGErr)
	for _, n := range []int{1, 2, 3} {
		for _, kind := range []string{"join", "renewal"} {
			b.Run(fmt.Sprintf("postgres-%d/%s", n, kind), func(b *testing.B) {
				url := benchPG.NewDatabase(b)
				a := startReplicas(b, func(ctx context.Context) (store.Store, error) { return postgres.Open(ctx, url) }, n)
				if kind == "join" {
					benchJoins(b, a)
				} else {
					benchRenewals(b, a)
				}
			})
		}
	}
}

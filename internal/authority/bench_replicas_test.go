package authority

import (
	"context"
	"flag"
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

// TestMain runs, unless go test -parallel says otherwise, four parallel
// tests at a time rather than GOMAXPROCS. The parallel tests are the
// longest (root and intermediate rotation, each on its own authority and
// store; the CA and JWT key clocks' step deadlines and the change watch's
// outage, each on its own server, waiting on its ticks) and mostly wait:
// the package used 64 s of CPU in a 442 s run.
// The others, TestJoinTokenRefusalTiming among them, still run one at a
// time, before the parallel ones start.
func TestMain(m *testing.M) {
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		if err := flag.Set("test.parallel", "4"); err != nil {
			panic(err)
		}
	}
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

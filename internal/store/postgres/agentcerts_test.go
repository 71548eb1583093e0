package postgres

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/storetest"
)

// TestMigration0024FillsInstanceExpiry: migration 0024 fills in, from the
// certificates held, each instance's certificate expiry that joins and
// renewals before it did not record: run again on a store whose columns
// are emptied, the counts come back as a store written since counts.
func TestMigration0024FillsInstanceExpiry(t *testing.T) {
	ctx := t.Context()
	s, _ := openFresh(t)
	benchToken(t, s)
	for n := range 3 {
		j := benchJoin(int64(n))
		if n == 2 {
			j.Certificate.IssuedAt = j.Certificate.NotAfter.Add(-2 * time.Hour)
			j.Certificate.NotAfter = j.Certificate.NotAfter.Add(-2 * time.Hour)
		}
		if _, err := s.CommitJoin(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	want, err := s.CountAgentCertificates(ctx)
	if err != nil || want != (store.AgentCertificateCounts{Valid: 2, Expired: 1}) {
		t.Fatalf("CountAgentCertificates = %+v, %v; want 2 valid, 1 expired", want, err)
	}
	if _, err := s.pool.Exec(ctx, `UPDATE instances SET last_not_after = NULL, last_expiring_at = NULL`); err != nil {
		t.Fatal(err)
	}
	if n, err := s.CountAgentCertificates(ctx); err != nil || n != (store.AgentCertificateCounts{}) {
		t.Fatalf("emptied: %+v, %v", n, err)
	}
	if _, err := s.pool.Exec(ctx, migration0024Fill(t)); err != nil {
		t.Fatal(err)
	}
	if got, err := s.CountAgentCertificates(ctx); err != nil || got != want {
		t.Fatalf("after 0024's fill: %+v, %v; want %+v", got, err, want)
	}
}

// migration0024Fill is migration 0024's UPDATE, which fills each
// instance's expiry in from the certificates held.
func migration0024Fill(t *testing.T) string {
	t.Helper()
	i := slices.IndexFunc(migrations, func(m store.Migration) bool { return m.Version == 24 })
	if i < 0 {
		t.Fatal("no migration 0024")
	}
	_, update, ok := strings.Cut(migrations[i].SQL, "UPDATE instances")
	update, _, _ = strings.Cut(update, ";")
	if !ok {
		t.Fatalf("migration 0024 has no UPDATE:\n%s", migrations[i].SQL)
	}
	return "UPDATE instances" + update
}

// TestExpiringAtOneDefinition: an instance's last_expiring_at is
// store.ExpiringAt to the microsecond whichever path wrote it (a join,
// muster bench seed's bulk load, migration 0024's SQL for the instances
// before it), at the boundaries of the integer division: lifetimes of 0
// to 5 µs and of a day and 1 or 3 µs, an issue time finer than the
// store keeps, a not-after before the issue. Before, the bulk load
// computed it in SQL as the migration does, rounding up where
// store.ExpiringAt, which a join writes, rounded down: a microsecond
// apart on three lifetimes in four.
func TestExpiringAtOneDefinition(t *testing.T) {
	ctx := t.Context()
	s, _ := openFresh(t)
	benchToken(t, s)
	cases := storetest.ExpiringAtCases()
	var seed store.Seed
	want := map[string]int64{}
	for n, c := range cases {
		j := benchJoin(int64(n))
		j.Certificate.NotBefore, j.Certificate.IssuedAt = c.Issued.Add(-time.Minute), c.Issued
		j.Certificate.NotAfter = c.Issued.Add(c.Lifetime)
		in, cert, err := store.PrepareJoin(j)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.CommitJoin(ctx, j); err != nil {
			t.Fatal(err)
		}
		want[in.ID] = store.ExpiringAt(cert).UnixMicro()
		// The same certificate, bulk-loaded for another node.
		in.ID, in.NodeID, in.LastSerial = "seeded-"+in.ID, "seeded-"+in.NodeID, "5eed"+in.LastSerial
		cert.InstanceID, cert.NodeID, cert.Serial = in.ID, in.NodeID, in.LastSerial
		seed.Instances = append(seed.Instances, in)
		seed.Nodes = append(seed.Nodes, store.Node{ID: in.NodeID, JoinMethod: in.JoinMethod, TokenID: in.TokenID,
			InstanceID: in.ID, CreatedAt: in.CreatedAt, UpdatedAt: in.CreatedAt})
		seed.Certificates = append(seed.Certificates, cert)
		want[in.ID] = store.ExpiringAt(cert).UnixMicro()
	}
	if _, err := s.LoadSeed(ctx, seed); err != nil {
		t.Fatal(err)
	}
	check := func(by string) {
		t.Helper()
		rows, err := s.pool.Query(ctx, `SELECT i.id, i.last_expiring_at, c.not_after, c.Issued_at
			FROM instances i JOIN certificates c ON c.serial = i.last_serial`)
		if err != nil {
			t.Fatal(err)
		}
		type row struct {
			ID                           string
			ExpiringAt, NotAfter, Issued int64
		}
		got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("%d instances, want %d", len(got), len(want))
		}
		for _, r := range got {
			if r.ExpiringAt != want[r.ID] {
				t.Errorf("%s, written by %s: last_expiring_at %d, store.ExpiringAt %d (not after %d, issued %d, %+d µs)",
					r.ID, by, r.ExpiringAt, want[r.ID], r.NotAfter, r.Issued, r.ExpiringAt-want[r.ID])
			}
		}
	}
	check("a join or the bulk load")
	if _, err := s.pool.Exec(ctx, `UPDATE instances SET last_not_after = NULL, last_expiring_at = NULL`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, migration0024Fill(t)); err != nil {
		t.Fatal(err)
	}
	check("migration 0024")
}

// TestCountAgentCertificatesUsesTheIndexes: on a store of many nodes, few
// of them expiring or expired, the counts of those are ranges of the
// partial indexes, not reads of the instances table. Before, the store
// clock came from a CTE of clock_timestamp(), whose ranges the planner
// estimated at a third of the rows each: three sequential scans of every
// instance, history and chain PEMs included, on every count.
func TestCountAgentCertificatesUsesTheIndexes(t *testing.T) {
	ctx := t.Context()
	s, _ := openFresh(t)
	// 20000 instances, a tenth superseded; of the current ones, 1 in 100
	// expiring and 1 in 100 expired, the rest valid for hours. Each has
	// its own times, and the rows are not in their order (as renewals
	// leave them), so a range the planner thinks large is not worth an
	// index.
	if _, err := s.pool.Exec(ctx, `INSERT INTO instances (id, node_id, join_method, token_id, previous_id, state, generation, created_at,
			last_serial, last_public_key, last_chain_pem, last_issued_at, last_not_after, last_expiring_at)
		SELECT 'i' || g, 'n' || g, 'token', 't', '', CASE WHEN g % 10 = 5 THEN 'superseded' ELSE 'current' END, 1, 0,
			's' || g, '\x00'::bytea, convert_to(repeat('x', 1800), 'UTF8'), 0,
			n + (CASE g % 100 WHEN 0 THEN -3600 - g WHEN 1 THEN 3600 + g ELSE 20 * 3600 + g END) * 1000000::bigint,
			n + (CASE g % 100 WHEN 0 THEN -4 * 3600 - g WHEN 1 THEN -300 - g ELSE 15 * 3600 + g END) * 1000000::bigint
		FROM generate_series(1, 20000) g, (SELECT `+nowMicros+` AS n) clock ORDER BY md5(g::text)`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `ANALYZE instances`); err != nil {
		t.Fatal(err)
	}
	if n, err := s.CountAgentCertificates(ctx); err != nil || n != (store.AgentCertificateCounts{Valid: 17600, Expiring: 200, Expired: 200}) {
		t.Fatalf("CountAgentCertificates = %+v, %v; want 17600 valid, 200 expiring, 200 expired", n, err)
	}
	rows, err := s.pool.Query(ctx, "EXPLAIN "+agentCertCountQuery)
	if err != nil {
		t.Fatal(err)
	}
	var plan strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(plan.String(), "instances_current_expiry"); n < 2 {
		t.Errorf("the expiring and expired counts do not use instances_current_expiry:\n%s", plan.String())
	}
	if n := strings.Count(plan.String(), "Seq Scan"); n > 1 {
		t.Errorf("the counts read the instances table %d times:\n%s", n, plan.String())
	}
}

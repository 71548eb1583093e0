package sqlite

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// TestCountAgentCertificatesUsesTheIndex: the three counts of
// muster_agent_certificates each read the partial index
// instances_current_expiry (migration 0025), without and with
// statistics, and never the instances table; and they count right over
// instances the joins and renewals wrote.
func TestCountAgentCertificatesUsesTheIndex(t *testing.T) {
	ctx := t.Context()
	s, _ := openTemp(t)
	if err := s.InsertToken(ctx, testToken("t1", 0), benchLink); err != nil {
		t.Fatal(err)
	}
	// Six nodes: two valid, two in their last quarter, two expired.
	now := time.Now()
	for n, life := range []struct{ from, to time.Duration }{
		{-time.Hour, 10 * time.Hour}, {-time.Minute, time.Hour},
		{-9 * time.Hour, time.Hour}, {-time.Hour, 10 * time.Minute},
		{-2 * time.Hour, -time.Hour}, {-10 * time.Hour, -time.Minute},
	} {
		j := testJoin("t1", fmt.Sprintf("node-%d", n), fmt.Sprintf("inst-%d", n))
		j.Certificate.IssuedAt, j.Certificate.NotBefore = now.Add(life.from), now.Add(life.from)
		j.Certificate.NotAfter = now.Add(life.to)
		if _, err := s.CommitJoin(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.CountAgentCertificates(ctx)
	if want := (store.AgentCertificateCounts{Valid: 2, Expiring: 2, Expired: 2}); err != nil || got != want {
		t.Fatalf("CountAgentCertificates = %+v, %v; want %+v", got, err, want)
	}

	for _, stats := range []string{"without statistics", "after ANALYZE"} {
		if stats == "after ANALYZE" {
			if _, err := s.w.ExecContext(ctx, `ANALYZE`); err != nil {
				t.Fatal(err)
			}
		}
		rows, err := s.w.QueryContext(ctx, `EXPLAIN QUERY PLAN `+agentCertCountQuery)
		if err != nil {
			t.Fatal(err)
		}
		var steps []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			steps = append(steps, detail)
		}
		if err := rows.Close(); err != nil {
			t.Fatal(err)
		}
		plan := strings.Join(steps, "; ")
		if n := strings.Count(plan, "SEARCH instances USING COVERING INDEX instances_current_expiry (last_expiring_at"); n != 3 {
			t.Errorf("%s: %d of the three counts search instances_current_expiry by its first column: %s", stats, n, plan)
		}
		if strings.Contains(plan, "SCAN instances") {
			t.Errorf("%s: the counts scan instances: %s", stats, plan)
		}
	}
}

package authority

import (
	"context"
	"crypto/x509"
	"math/big"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	dto "github.com/prometheus/client_model/go"

	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/pgtest"
	"github.com/muster-dev/muster/internal/store/postgres"
)

// TestStreamCopiesTakingTurnsAudited: two holders of one identity (a
// cloned disk: the same certificate, from two hosts) that keep replacing
// each other's stream are a copy: counted in
// muster_agent_stream_copies_suspected_total and audited
// agent.stream_copy_suspected with the way out. An agent that merely
// reconnects (the same host from another port, a renewed certificate, a
// move to another address once) is none of it. Before, each replacement
// was only an agent.stream_replace.
func TestStreamCopiesTakingTurnsAudited(t *testing.T) {
	b := startReplicas(t, nil, 1)
	s := b.srvs[0]
	stream := func(node, source string, serial int64) *agentStream {
		ctx, replaced := context.WithCancelCause(t.Context())
		t.Cleanup(func() { replaced(nil) })
		st := &agentStream{a: &agentService{s: s}, ctx: ctx, replaced: replaced,
			c: Caller{ID: spiffeid.ID{TrustDomain: b.td, Role: spiffeid.RoleAgent, Name: node}, Source: source,
				Cert: &x509.Certificate{SerialNumber: big.NewInt(serial)}}}
		// As open does, once the standing is checked.
		if err := st.record(); err != nil {
			t.Fatal(err)
		}
		return st
	}
	copies := func() float64 {
		var m dto.Metric
		if err := s.streams.copies.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	suspected := func(node string) []store.AuditRecord {
		recs, err := b.store.ListAudit(t.Context(), store.AuditFilter{Action: "agent.stream_copy_suspected"})
		if err != nil {
			t.Fatal(err)
		}
		var out []store.AuditRecord
		for _, r := range recs {
			if r.Target == node {
				out = append(out, r)
			}
		}
		return out
	}

	// An agent reconnecting: a blip (the same host, another port), a
	// renewal (a new certificate), a move to another address (once).
	for i, c := range []struct {
		source string
		serial int64
	}{{"10.0.0.1:5000", 7}, {"10.0.0.1:5001", 7}, {"10.0.0.1:5002", 7}, {"10.0.0.1:5003", 8}, {"10.0.0.1:5004", 8},
		{"10.0.0.9:4000", 8}, {"10.0.0.9:4001", 8}, {"10.0.0.9:4002", 8}} {
		stream("n-reconnects", c.source, c.serial).replaceOld()
		if n := copies(); n != 0 {
			t.Fatalf("reconnection %d counted as a copy (%v)", i, n)
		}
	}
	if recs := suspected("n-reconnects"); len(recs) != 0 {
		t.Fatalf("an agent reconnecting audited as a copy: %+v", recs)
	}

	// Two holders taking turns: A, B, A, B, A, each taking the stream
	// back from the other after the first replacement (three times).
	for i := range 5 {
		source := "10.0.0.1:5000"
		if i%2 == 1 {
			source = "10.0.0.2:6000"
		}
		stream("n-cloned", source, 7).replaceOld()
	}
	if n := copies(); n != 1 {
		t.Fatalf("copies suspected after three alternations: %v, want 1", n)
	}
	// The row names its stream by a random name alone, and says who
	// holds it and the node's last turn in columns of their own (before,
	// both were encoded into the stream's name).
	row, err := b.store.GetAgentStream(t.Context(), "n-cloned")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := uuid.Parse(row.StreamID); err != nil {
		t.Errorf("the row's StreamID %q is not a bare random name: %v", row.StreamID, err)
	}
	a, c := "10.0.0.1 (certificate 7)", "10.0.0.2 (certificate 7)"
	if row.Holder != a || row.Turn.From != c || row.Turn.To != a || row.Turn.Count != 4 || row.Turn.At.IsZero() {
		t.Errorf("the row says holder %q, turn %+v; want %q, the fourth turn from %q to it", row.Holder, row.Turn, a, c)
	}
	recs := suspected("n-cloned")
	if len(recs) != 1 {
		t.Fatalf("%d agent.stream_copy_suspected records, want 1", len(recs))
	}
	for _, want := range []string{"copy_suspected", "10.0.0.1", "10.0.0.2", "muster lock create --node n-cloned --reason copied-identity", "muster agents show n-cloned"} {
		if !strings.Contains(recs[0].Reason, want) {
			t.Errorf("reason %q does not say %q", recs[0].Reason, want)
		}
	}
}

// TestStreamCopiesOnTwoReplicasAuditedOnce: the two holders of one
// identity each hold their stream on another replica (SQLite's two
// processes on one file, PostgreSQL's two authorities), so neither
// replica replaces the other's stream itself: they take turns on the
// store's stream row. The row carries the count, so the turns are one
// suspicion, counted by one replica and audited once, as on one replica.
// Before, each replica saw only its own holder reconnect, and none was
// counted.
func TestStreamCopiesOnTwoReplicasAuditedOnce(t *testing.T) {
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			var open func(ctx context.Context) (store.Store, error)
			if backend == "postgres" {
				benchPGOnce.Do(func() { benchPG, benchPGErr = pgtest.Start() })
				pgtest.FailOrSkip(t, benchPGErr)
				url := benchPG.NewDatabase(t)
				open = func(ctx context.Context) (store.Store, error) { return postgres.Open(ctx, url) }
			}
			b := startReplicas(t, open, 2)
			stream := func(s *Server, source string) {
				ctx, replaced := context.WithCancelCause(t.Context())
				t.Cleanup(func() { replaced(nil) })
				st := &agentStream{a: &agentService{s: s}, ctx: ctx, replaced: replaced,
					c: Caller{ID: spiffeid.ID{TrustDomain: b.td, Role: spiffeid.RoleAgent, Name: "n-cloned"}, Source: source,
						Cert: &x509.Certificate{SerialNumber: big.NewInt(7)}}}
				if err := st.record(); err != nil {
					t.Fatal(err)
				}
				st.replaceOld()
			}
			// A on the first replica, B on the second, A, B, A: three
			// alternations, then two more (B, A), not yet a second
			// record (every flapAlternations-th is audited).
			for i := range 7 {
				if i%2 == 0 {
					stream(b.srvs[0], "10.0.0.1:5000")
				} else {
					stream(b.srvs[1], "10.0.0.2:6000")
				}
			}
			var copies float64
			for _, s := range b.srvs {
				var m dto.Metric
				if err := s.streams.copies.Write(&m); err != nil {
					t.Fatal(err)
				}
				copies += m.GetCounter().GetValue()
			}
			// Alternations 3, 4 and 5, each counted once, by the
			// replica whose write made it.
			if copies != 3 {
				t.Fatalf("copies suspected over both replicas after five alternations: %v, want 3", copies)
			}
			recs, err := b.store.ListAudit(t.Context(), store.AuditFilter{Action: "agent.stream_copy_suspected"})
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) != 1 {
				t.Fatalf("%d agent.stream_copy_suspected records over both replicas, want 1", len(recs))
			}
			for _, want := range []string{"10.0.0.1 (certificate 7)", "10.0.0.2 (certificate 7)", "muster lock create --node n-cloned --reason copied-identity"} {
				if !strings.Contains(recs[0].Reason, want) {
					t.Errorf("reason %q does not say %q", recs[0].Reason, want)
				}
			}
		})
	}
}

// racingStore is a store that runs race once, if set, right after a
// GetAgentStream read: another stream opening between an opening
// stream's read of the node's row and its write.
type racingStore struct {
	store.Store
	race *atomic.Pointer[func()]
}

func (s racingStore) GetAgentStream(ctx context.Context, nodeID string) (store.AgentStream, error) {
	row, err := s.Store.GetAgentStream(ctx, nodeID)
	if f := s.race.Swap(nil); f != nil {
		(*f)()
	}
	return row, err
}

// TestStreamCopyCountedOnceWhenTwoOpenAtOnce: two streams of one holder
// opening at once on two replicas, both having read the row of the other
// holder's stream, make one replacement, not two: the one whose write
// lands second finds the row changed since its read (the conditional
// write refuses it), reads it again, and sees its own holder took it. So
// the third alternation is counted and audited once. Written
// unconditionally, both would count it from the same read, and audit it
// twice.
func TestStreamCopyCountedOnceWhenTwoOpenAtOnce(t *testing.T) {
	var race atomic.Pointer[func()]
	b := startReplicas(t, nil, 2, func(c *Config) { c.Store = racingStore{Store: c.Store, race: &race} })
	stream := func(s *Server, source string) {
		ctx, replaced := context.WithCancelCause(t.Context())
		t.Cleanup(func() { replaced(nil) })
		st := &agentStream{a: &agentService{s: s}, ctx: ctx, replaced: replaced,
			c: Caller{ID: spiffeid.ID{TrustDomain: b.td, Role: spiffeid.RoleAgent, Name: "n-cloned"}, Source: source,
				Cert: &x509.Certificate{SerialNumber: big.NewInt(7)}}}
		if err := st.record(); err != nil {
			t.Fatal(err)
		}
		st.replaceOld()
	}
	// A, B, A, B: two alternations.
	for i := range 4 {
		if i%2 == 0 {
			stream(b.srvs[0], "10.0.0.1:5000")
		} else {
			stream(b.srvs[1], "10.0.0.2:6000")
		}
	}
	// A again on the first replica; between its read and its write, A
	// reconnects to the second (from another port) and takes the row
	// first: the third alternation, once.
	other := func() { stream(b.srvs[1], "10.0.0.1:5001") }
	race.Store(&other)
	stream(b.srvs[0], "10.0.0.1:5002")
	if race.Load() != nil {
		t.Fatal("the race did not run: the test does not exercise two streams opening at once")
	}
	var copies float64
	for _, s := range b.srvs {
		var m dto.Metric
		if err := s.streams.copies.Write(&m); err != nil {
			t.Fatal(err)
		}
		copies += m.GetCounter().GetValue()
	}
	recs, err := b.store.ListAudit(t.Context(), store.AuditFilter{Action: "agent.stream_copy_suspected"})
	if err != nil {
		t.Fatal(err)
	}
	if copies != 1 || len(recs) != 1 {
		t.Fatalf("two streams of one holder opening at once: %v copies suspected, %d records; want 1 and 1", copies, len(recs))
	}
}

// goneRowStore is a store whose next GetAgentStream, if gone is set,
// returns *gone: the node's row as an opening stream read it, gone from
// the store before the stream writes its own.
type goneRowStore struct {
	store.Store
	gone *atomic.Pointer[store.AgentStream]
}

func (s goneRowStore) GetAgentStream(ctx context.Context, nodeID string) (store.AgentStream, error) {
	if row := s.gone.Swap(nil); row != nil {
		return *row, nil
	}
	return s.Store.GetAgentStream(ctx, nodeID)
}

// TestStreamOverAGoneRowCountsNothing: a stream that read the node's row
// (another holder's live stream, the third turn between the two) finds it
// gone when it writes (a store restored from an older backup, a row
// removed by hand): its write is refused, it reads the node's row again,
// finds none, and opens as the node's first stream, carrying no turn and
// counting nothing. Before, the take wrote the row back from what was
// read of it, and counted a copy against a row no longer in the store.
func TestStreamOverAGoneRowCountsNothing(t *testing.T) {
	var gone atomic.Pointer[store.AgentStream]
	b := startReplicas(t, nil, 1, func(c *Config) { c.Store = goneRowStore{Store: c.Store, gone: &gone} })
	s := b.srvs[0]
	now := time.Now().UTC()
	a, other := "10.0.0.1 (certificate 7)", "10.0.0.2 (certificate 7)"
	gone.Store(&store.AgentStream{NodeID: "n-gone", StreamID: "11111111-2222-3333-4444-555555555555", Replica: "r:1", Connected: true,
		ConnectedAt: now, LastSeen: now, Holder: other, Turn: store.StreamTurn{From: a, To: other, At: now, Count: 3}})
	ctx, replaced := context.WithCancelCause(t.Context())
	t.Cleanup(func() { replaced(nil) })
	st := &agentStream{a: &agentService{s: s}, ctx: ctx, replaced: replaced,
		c: Caller{ID: spiffeid.ID{TrustDomain: b.td, Role: spiffeid.RoleAgent, Name: "n-gone"}, Source: "10.0.0.1:5000",
			Cert: &x509.Certificate{SerialNumber: big.NewInt(7)}}}
	if err := st.record(); err != nil {
		t.Fatal(err)
	}
	st.replaceOld()
	if gone.Load() != nil {
		t.Fatal("the stream did not read the gone row: the test does not exercise it")
	}
	var m dto.Metric
	if err := s.streams.copies.Write(&m); err != nil {
		t.Fatal(err)
	}
	if n := m.GetCounter().GetValue(); n != 0 {
		t.Errorf("copies suspected over a row no longer in the store: %v, want 0", n)
	}
	row, err := b.store.GetAgentStream(t.Context(), "n-gone")
	if err != nil {
		t.Fatal(err)
	}
	if row.StreamID != st.row.StreamID || row.Holder != a || row.Turn != (store.StreamTurn{}) {
		t.Errorf("the node's row after the open: %+v; want the stream's, holder %q, no turn", row, a)
	}
}

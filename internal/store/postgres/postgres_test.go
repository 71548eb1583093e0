package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/pgtest"
	"github.com/muster-dev/muster/internal/store/storetest"
)

// srv is this package's PostgreSQL cluster (fsync=off: see pgtest).
var srv *pgtest.Server

// TestMain runs, unless go test -parallel says otherwise, four parallel
// tests at a time rather than GOMAXPROCS: the parallel ones (the
// conformance cases) mostly wait on the server, and the suite took 144 s
// two at a time and 92 s four at a time (two loaded cores).
func TestMain(m *testing.M) {
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		if err := flag.Set("test.parallel", "4"); err != nil {
			panic(err)
		}
	}
	pgtest.Main(m, &srv)
}

// openURL opens a store on url, closed when the test ends.
func openURL(t testing.TB, url string) *Store {
	t.Helper()
	s, err := Open(context.Background(), url)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// openFresh opens a store on a new, empty database and returns its URL.
func openFresh(t testing.TB) (*Store, string) {
	t.Helper()
	url := srv.NewDatabase(t)
	return openURL(t, url), url
}

// TestConformance runs the suite on copies of one database that Open
// migrated (CREATE DATABASE ... TEMPLATE): each case opens its own copy, as
// a restarted authority opens its database. Creating and migrating a new
// database took about 0.8 s of each case's 1 s under -race (268 cases).
// The other tests here (openFresh) still migrate a new database each.
func TestConformance(t *testing.T) {
	template, templateURL := openFresh(t)
	template.Close() // openFresh's cleanup closes it again: a no-op
	storetest.RunStoreTests(t, func(t *testing.T) store.Store {
		return openURL(t, srv.NewDatabaseFrom(t, templateURL))
	})
}

func TestSchemaTooNew(t *testing.T) {
	ctx := t.Context()
	s, url := openFresh(t)
	if v, err := s.SchemaVersion(ctx); err != nil || v != latestVersion() {
		t.Fatalf("SchemaVersion = %d, %v; want %d", v, err, latestVersion())
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES (9999, 0)`); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(ctx, url)
	if err == nil {
		s2.Close()
		t.Fatal("Open of a database at version 9999 succeeded")
	}
	if !errors.Is(err, store.ErrSchemaTooNew) {
		t.Errorf("Open: %v, want an error wrapping ErrSchemaTooNew", err)
	}
	// The operator meets this mid-rollback: it must say what to run, or
	// what to restore, not only that the versions differ.
	for _, want := range []string{
		fmt.Sprintf("database is at schema version 9999, this binary knows up to %d:", latestVersion()),
		"run a muster that knows schema version 9999 or later (`muster version` shows",
		"restore the database from the backup taken before the upgrade (docs/install.md, \"Upgrades\")",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open: %v\nwant it to say %q", err, want)
		}
	}
}

// TestOpenRace has several stores open one new database at once, as
// replicas starting together do: every Open must succeed and each migration
// be applied once.
func TestOpenRace(t *testing.T) {
	ctx := t.Context()
	url := srv.NewDatabase(t)
	const n = 6
	stores := make([]*Store, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { stores[i], errs[i] = Open(ctx, url) })
	}
	wg.Wait()
	for i, s := range stores {
		if errs[i] != nil {
			t.Errorf("Open %d: %v", i, errs[i])
			continue
		}
		defer s.Close()
	}
	if t.Failed() {
		return
	}
	var rows, max int
	if err := stores[0].pool.QueryRow(ctx, `SELECT count(*), max(version) FROM schema_migrations`).Scan(&rows, &max); err != nil {
		t.Fatal(err)
	}
	if rows != latestVersion() || max != latestVersion() {
		t.Errorf("schema_migrations has %d rows up to %d, want %d", rows, max, latestVersion())
	}
}

func TestLoadMigrations(t *testing.T) {
	// The dialects mirror each other: as many migrations as the SQLite
	// store's, read from its directory so that a new pair needs no edit here.
	sqlite, err := filepath.Glob(filepath.Join("..", "sqlite", "migrations", "*.sql"))
	if err != nil || len(sqlite) == 0 {
		t.Fatalf("SQLite migrations: %v, %d files", err, len(sqlite))
	}
	if len(migrations) != len(sqlite) {
		t.Errorf("%d migrations embedded, want %d (the SQLite store's count)", len(migrations), len(sqlite))
	}
}

func TestAuditAppendOnly(t *testing.T) {
	s, _ := openFresh(t)
	ctx := t.Context()
	if _, err := s.AppendAudit(ctx, func(h store.AuditHead) (store.AuditRecord, error) {
		return store.AuditRecord{Seq: 1, Time: time.Now(), Hash: []byte{1}}, nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`UPDATE audit_records SET actor = 'x'`,
		`DELETE FROM audit_records`,
		`TRUNCATE audit_records`,
	} {
		if _, err := s.pool.Exec(ctx, q); err == nil {
			t.Errorf("%s succeeded, want the append-only trigger to refuse it", q)
		}
	}
}

func TestActionPrefixIsBytewise(t *testing.T) {
	s, _ := openFresh(t)
	ctx := t.Context()
	for _, a := range []string{"node.join", "Node.join", "node.joinX", "node_join", "nodé"} {
		if _, err := s.AppendAudit(ctx, func(h store.AuditHead) (store.AuditRecord, error) {
			r, _ := benchLink(h)
			r.Action = a
			return r, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := s.ListAudit(ctx, store.AuditFilter{Action: "node.join*"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		got = append(got, r.Action)
	}
	if fmt.Sprint(got) != "[node.join node.joinX]" {
		t.Errorf("ListAudit(node.join*) = %q, want [node.join node.joinX]", got)
	}
}

// twoHandles opens two stores with their own pools on one database: two
// authority replicas, as far as PostgreSQL can tell.
func twoHandles(t *testing.T) [2]*Store {
	s, url := openFresh(t)
	return [2]*Store{s, openURL(t, url)}
}

func joinOf(n int, tokenID string) store.Join {
	j := benchJoin(int64(n))
	j.TokenID, j.Instance.TokenID, j.Certificate.TokenID = tokenID, tokenID, tokenID
	return j
}

func TestCommitJoinTwoHandles(t *testing.T) {
	ctx := t.Context()
	h := twoHandles(t)
	const allowed, joiners = 5, 40
	if err := h[0].InsertToken(ctx, store.Token{
		ID: "t1", JoinMethod: store.JoinMethodToken, Ciphertext: []byte("c"), Nonce: []byte("n"),
		UsesAllowed: allowed, CreatedBy: "admin", CreatedAt: time.Now(),
	}, benchLink); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, joiners)
	var wg sync.WaitGroup
	for i := range joiners {
		wg.Go(func() {
			_, errs[i] = h[i%2].CommitJoin(ctx, joinOf(i, "t1"))
		})
	}
	wg.Wait()
	var ok, spent int
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, store.ErrTokenSpent):
			spent++
		default:
			t.Errorf("CommitJoin: %v", err)
		}
	}
	if ok != allowed || spent != joiners-allowed {
		t.Errorf("%d joins succeeded and %d found the token spent, want %d and %d", ok, spent, allowed, joiners-allowed)
	}
	tok, err := h[1].GetToken(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := h[1].ListNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if tok.UsesCount != allowed || len(nodes) != allowed {
		t.Errorf("UsesCount = %d and %d nodes, want %d and %d", tok.UsesCount, len(nodes), allowed, allowed)
	}
}

func TestAppendAuditTwoHandles(t *testing.T) {
	ctx := t.Context()
	h := twoHandles(t)
	const workers, each = 16, 25
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			for range each {
				if _, err := h[w%2].AppendAudit(ctx, benchLink); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("AppendAudit: %v", err)
	}
	recs, err := h[0].ListAudit(ctx, store.AuditFilter{Limit: workers * each * 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != workers*each {
		t.Fatalf("chain has %d records, want %d", len(recs), workers*each)
	}
	checkBenchChain(t, recs)
}

// TestCommitJoinAuditTwoHandles interleaves joins that append to the chain
// with plain appends from another pool: the chain must stay whole.
func TestCommitJoinAuditTwoHandles(t *testing.T) {
	ctx := t.Context()
	h := twoHandles(t)
	benchToken(t, h[0])
	const n = 30
	var wg sync.WaitGroup
	errs := make([]error, 2*n)
	for i := range n {
		wg.Go(func() {
			j := benchJoin(int64(i))
			j.Audit = benchLink
			_, errs[i] = h[0].CommitJoin(ctx, j)
		})
		wg.Go(func() { _, errs[n+i] = h[1].AppendAudit(ctx, benchLink) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	head, err := h[1].AuditHead(ctx)
	// And the token's record.
	if err != nil || head.Seq != 2*n+1 {
		t.Errorf("AuditHead = %d, %v; want seq %d", head.Seq, err, 2*n+1)
	}
}

func benchLink(head store.AuditHead) (store.AuditRecord, error) {
	seq := head.Seq + 1
	h := sha256.New()
	h.Write(head.Hash)
	binary.Write(h, binary.BigEndian, seq)
	return store.AuditRecord{
		Seq: seq, Time: time.Now(),
		Actor: "spiffe://muster.test/agent", Action: "node.join", Target: "node-1",
		Result: "ok", Source: "192.0.2.1:4242", CorrelationID: "c",
		PrevHash: head.Hash, Hash: h.Sum(nil),
	}, nil
}

func benchToken(t testing.TB, s *Store) { benchTokenWith(t, s, benchLink) }

// benchTokenWith is benchToken with its token.create record built by
// audit.
func benchTokenWith(t testing.TB, s *Store, audit func(store.AuditHead) (store.AuditRecord, error)) {
	t.Helper()
	if err := s.InsertToken(context.Background(), store.Token{
		ID: "t1", JoinMethod: store.JoinMethodToken, Ciphertext: []byte("c"), Nonce: []byte("n"),
		CreatedBy: "admin", CreatedAt: time.Now(),
	}, audit); err != nil {
		t.Fatal(err)
	}
}

// benchJoin is the admission of node n with the unlimited token t1.
func benchJoin(n int64) store.Join {
	now := time.Now()
	id := fmt.Sprintf("node-%d", n)
	key := sha256.Sum256([]byte(id))
	serial := fmt.Sprintf("%032x", n)
	return store.Join{
		TokenID: "t1", NodeID: id, RetryWindow: time.Minute,
		// A new node as the authority's read found it, and the lock
		// targets a token join checks.
		NodeFreeAtRead: true,
		LockTargets: []store.LockTarget{{Kind: store.LockNode, Target: id},
			{Kind: store.LockToken, Target: "t1"}, {Kind: store.LockPublicKey, Target: hex.EncodeToString(key[:])}},
		Instance: store.Instance{ID: "i-" + id, JoinMethod: store.JoinMethodToken, CreatedAt: now,
			LastChainPEM: []byte("-----BEGIN CERTIFICATE-----")},
		Certificate: store.Certificate{Serial: serial, PublicKey: key[:],
			NotBefore: now, NotAfter: now.Add(time.Hour), IssuedAt: now},
	}
}

// TestWatchChanges: a change committed through one pool is announced to a
// watcher listening through another (two replicas).
func TestWatchChanges(t *testing.T) {
	storetest.RunWatchTests(t, func(t *testing.T) (store.Store, store.Store) {
		a, url := openFresh(t)
		return a, openURL(t, url)
	})
}

// TestWatchChangesLostConnection: when the listening session is killed,
// WatchChanges returns an error (the authority listens again) instead of
// waiting forever on a dead connection.
func TestWatchChangesLostConnection(t *testing.T) {
	ctx := t.Context()
	a, _ := openFresh(t)
	listening := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- a.WatchChanges(ctx, func(store.Change) {
			select {
			case listening <- struct{}{}:
			default:
			}
		})
	}()
	select {
	case <-listening:
	case <-time.After(10 * time.Second):
		t.Fatal("WatchChanges did not start listening")
	}
	if _, err := a.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE query LIKE 'LISTEN %' AND pid <> pg_backend_pid() AND datname = current_database()`); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("WatchChanges returned nil after its connection was killed")
		}
	case <-time.After(2*watchPing + 10*time.Second):
		t.Fatal("WatchChanges did not notice its connection was killed")
	}
}

// TestChangePayload: a payload decodes to the change it encodes; a task for
// more nodes than fit is announced to every node; an unreadable payload is
// taken as everything, for every node.
func TestChangePayload(t *testing.T) {
	many := make([]string, 1000)
	for i := range many {
		many[i] = fmt.Sprintf("node-%04d", i)
	}
	for _, c := range []struct {
		name string
		in   string
		want store.Change
	}{
		{"kind alone", changePayload(store.ChangeSigners, nil), store.Change{Kind: store.ChangeSigners}},
		{"nodes", changePayload(store.ChangeTasks, []string{"a", "b"}), store.Change{Kind: store.ChangeTasks, Nodes: []string{"a", "b"}}},
		{"too many nodes", changePayload(store.ChangeTasks, many), store.Change{Kind: store.ChangeTasks}},
		{"garbage", "x\ny", store.Change{Kind: store.ChangeAll}},
		{"unknown kind", "64\na", store.Change{Kind: store.ChangeAll}},
		{"empty", "", store.Change{Kind: store.ChangeAll}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if len(c.in) > maxPayload {
				t.Fatalf("payload of %d bytes", len(c.in))
			}
			if got := parseChange(c.in); !slices.Equal(got.Nodes, c.want.Nodes) || got.Kind != c.want.Kind {
				t.Fatalf("parseChange(%q) = %+v, want %+v", c.in, got, c.want)
			}
		})
	}
}

// TestSignerVersionAcrossHandles: a signer step through one pool is the
// version another pool (another replica) reads next.
func TestSignerVersionAcrossHandles(t *testing.T) {
	storetest.RunSignerVersionTests(t, func(t *testing.T) (store.Store, store.Store) {
		a, url := openFresh(t)
		return a, openURL(t, url)
	})
}

// checkBenchChain fails t unless recs, from the chain's start, are linked
// by benchLink with no gap.
func checkBenchChain(t *testing.T, recs []store.AuditRecord) {
	t.Helper()
	var prev []byte
	for i, r := range recs {
		want, _ := benchLink(store.AuditHead{Seq: int64(i), Hash: prev})
		if r.Seq != int64(i+1) || string(r.PrevHash) != string(prev) || string(r.Hash) != string(want.Hash) {
			t.Fatalf("record %d: seq %d, broken link", i+1, r.Seq)
		}
		prev = r.Hash
	}
}

// raceWrites runs writes calls of write(i) and appends AppendAudit calls,
// spread over both handles, all at once. It returns how many writes
// succeeded and every error but the refused one.
func raceWrites(ctx context.Context, h [2]*Store, writes, appends int, write func(i int) error, refused error) (int, []error) {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		won  int
		errs []error
	)
	for i := range writes {
		wg.Go(func() {
			err := write(i)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won++
			case !errors.Is(err, refused):
				errs = append(errs, err)
			}
		})
	}
	for i := range appends {
		wg.Go(func() {
			if _, err := h[i%2].AppendAudit(ctx, benchLink); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return won, errs
}

// TestLeftoverVerifierSets: sets kept above the version (by an older
// release, or an earlier life of a restored database) are never listed
// and go with the next step or advance.
func TestLeftoverVerifierSets(t *testing.T) {
	s, _ := openFresh(t)
	storetest.RunLeftoverSetTests(t, s, func(t *testing.T, v int64, raw []byte) {
		if _, err := s.pool.Exec(t.Context(), `INSERT INTO verifier_sets (version, raw) VALUES ($1, $2)`, v, raw); err != nil {
			t.Fatal(err)
		}
	})
}

// TestRestoredVerifierSets: a database rolled back under a running
// replica and stepped back up to a version it read refuses the replica's
// step from that read, and keeps and lists the current version's set only
// for its step.
func TestRestoredVerifierSets(t *testing.T) {
	storetest.RunRestoredSetTests(t, func(t *testing.T) storetest.RestorableStore {
		s, _ := openFresh(t)
		exec := func(t *testing.T, q string, args ...any) {
			t.Helper()
			if _, err := s.pool.Exec(t.Context(), q, args...); err != nil {
				t.Fatal(err)
			}
		}
		return storetest.RestorableStore{Store: s,
			RollBack: func(t *testing.T, to store.SignerSetID) {
				exec(t, `UPDATE signer_set SET version = $1, stepped_at = $2 WHERE id = 1`, to.Version, to.SteppedAt)
				exec(t, `DELETE FROM verifier_sets WHERE version > $1`, to.Version)
			},
			Plant: func(t *testing.T, v int64, steppedAt *int64, raw []byte) {
				exec(t, `DELETE FROM verifier_sets WHERE version = $1`, v)
				if steppedAt == nil {
					// As the release before 0026 writes it.
					exec(t, `INSERT INTO verifier_sets (version, raw) VALUES ($1, $2)`, v, raw)
					return
				}
				exec(t, `INSERT INTO verifier_sets (version, raw, stepped_at) VALUES ($1, $2, $3)`, v, raw, *steppedAt)
			},
		}
	})
}

// TestRestoredRows: a root rotation step, a JWT key rotation and a setting
// written from a read taken before the database was restored under the
// replica, and written back up to the same version, are refused.
func TestRestoredRows(t *testing.T) {
	storetest.RunRestoredRowTests(t, func(t *testing.T) storetest.SnapshotStore {
		s, _ := openFresh(t)
		exec := func(t *testing.T, q string) {
			t.Helper()
			if _, err := s.pool.Exec(t.Context(), q); err != nil {
				t.Fatal(err)
			}
		}
		return storetest.SnapshotStore{Store: s, Snapshot: func(t *testing.T, tables ...string) func(t *testing.T) {
			for _, table := range tables {
				exec(t, `CREATE TABLE backup_`+table+` AS SELECT * FROM `+table)
			}
			return func(t *testing.T) {
				for _, table := range tables {
					exec(t, `DELETE FROM `+table)
					exec(t, `INSERT INTO `+table+` SELECT * FROM backup_`+table)
				}
			}
		}}
	})
}

package sqlite

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

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

// BenchmarkAppendAudit measures one durable (synchronous=FULL) append.
func BenchmarkAppendAudit(b *testing.B) {
	s, _ := openTemp(b)
	ctx := b.Context()
	for b.Loop() {
		if _, err := s.AppendAudit(ctx, benchLink); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAppendAuditParallel measures appends from many goroutines, which
// queue on the single writer connection.
func BenchmarkAppendAuditParallel(b *testing.B) {
	s, _ := openTemp(b)
	ctx := b.Context()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.AppendAudit(ctx, benchLink); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkInsertLock measures one durable single-row insert.
func BenchmarkInsertLock(b *testing.B) {
	s, _ := openTemp(b)
	ctx := b.Context()
	var n int
	for b.Loop() {
		n++
		if err := s.InsertLock(ctx, store.Lock{
			ID: fmt.Sprintf("lock-%d", n), Kind: store.LockNode, Target: fmt.Sprintf("node-%d", n),
			CreatedBy: "admin", CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour),
		}, benchLink); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFindAnyLock measures the lock check of a join (three targets)
// and of a renewal (five), against 10,000 locks, from parallel readers:
// half the checks find a lock on their second target, half find none.
func BenchmarkFindAnyLock(b *testing.B) {
	s, _ := openTemp(b)
	ctx := b.Context()
	insertBenchLocks(b, s, 10000)
	for _, n := range []int{3, 5} {
		b.Run(fmt.Sprintf("targets=%d", n), func(b *testing.B) {
			var i atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				targets := make([]store.LockTarget, n)
				for pb.Next() {
					k := i.Add(1) % 20000 // half hit, half miss
					for j := range targets {
						targets[j] = store.LockTarget{Kind: store.LockInstance, Target: fmt.Sprintf("i-%d-%d", k, j)}
					}
					targets[1] = store.LockTarget{Kind: store.LockNode, Target: fmt.Sprintf("node-%d", k)}
					_, err := s.FindAnyLock(ctx, targets)
					if err != nil && k < 10000 {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// insertBenchLocks inserts node locks on node-0 to node-(n-1).
func insertBenchLocks(b *testing.B, s *SQLite, n int) {
	b.Helper()
	ctx := b.Context()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	for i := range n {
		if _, err := tx.ExecContext(ctx, `INSERT INTO locks (`+lockColumns+`) VALUES (?, ?, ?, '', '', ?, NULL)`,
			fmt.Sprintf("lock-%d", i), store.LockNode, fmt.Sprintf("node-%d", i), time.Now().UnixMicro()); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
}

// benchJoin is a complete join of node-n under token t1, as the authority
// builds it: with the three lock targets a token join checks (the node,
// the token, the key), none of them locked.
func benchJoin(n int64) store.Join {
	now := time.Now()
	id := fmt.Sprintf("%d", n)
	key := sha256.Sum256([]byte(id))
	serial := fmt.Sprintf("%x", sha256.Sum256([]byte(id)))[:32] // random, as the CA issues them
	return store.Join{
		TokenID: "t1", NodeID: "node-" + id, RetryWindow: time.Minute,
		// A new node, as the authority's read found it.
		NodeFreeAtRead: true,
		LockTargets: []store.LockTarget{{Kind: store.LockNode, Target: "node-" + id},
			{Kind: store.LockToken, Target: "t1"}, {Kind: store.LockPublicKey, Target: hex.EncodeToString(key[:])}},
		Instance: store.Instance{
			ID: "i-" + id, JoinMethod: store.JoinMethodToken, TokenID: "t1", CreatedAt: now,
			LastSerial: serial, LastPublicKey: key[:], LastChainPEM: make([]byte, 1500), LastIssuedAt: now,
		},
		Certificate: store.Certificate{
			Serial: serial, NodeID: "node-" + id, InstanceID: "i-" + id, JoinMethod: store.JoinMethodToken,
			TokenID: "t1", PublicKey: key[:], NotBefore: now, NotAfter: now.Add(time.Hour), IssuedAt: now,
		},
	}
}

func benchToken(b *testing.B, s *SQLite) {
	if err := s.InsertToken(b.Context(), store.Token{
		ID: "t1", JoinMethod: store.JoinMethodToken, Ciphertext: []byte("c"), Nonce: []byte("n"),
		CreatedBy: "admin", CreatedAt: time.Now(),
	}, benchLink); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkCommitJoin measures one durable admission of a new node: the
// retry check, the token use, the node claim and three inserts in one
// transaction.
func BenchmarkCommitJoin(b *testing.B) {
	s, _ := openTemp(b)
	ctx := b.Context()
	benchToken(b, s)
	var n int64
	for b.Loop() {
		n++
		if _, err := s.CommitJoin(ctx, benchJoin(n)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCommitJoinParallel measures admissions from many goroutines
// sharing one token, which queue on the single writer connection.
func BenchmarkCommitJoinParallel(b *testing.B) {
	s, _ := openTemp(b)
	ctx := b.Context()
	benchToken(b, s)
	var n atomic.Int64
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.CommitJoin(ctx, benchJoin(n.Add(1))); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkCommitRenewal measures one durable renewal of one instance,
// generation after generation.
func BenchmarkCommitRenewal(b *testing.B) {
	s, _ := openTemp(b)
	ctx := b.Context()
	benchToken(b, s)
	res, err := s.CommitJoin(ctx, benchJoin(0))
	if err != nil {
		b.Fatal(err)
	}
	in := res.Instance
	for b.Loop() {
		now := time.Now()
		serial := fmt.Sprintf("%032x", 1_000_000_000+in.Generation)
		r := store.Renewal{
			InstanceID: in.ID, FromGeneration: in.Generation, ChainPEM: in.LastChainPEM,
			Certificate: store.Certificate{
				Serial: serial, NodeID: in.NodeID, InstanceID: in.ID, Generation: in.Generation + 1,
				JoinMethod: in.JoinMethod, TokenID: in.TokenID, PublicKey: in.LastPublicKey,
				NotBefore: now, NotAfter: now.Add(time.Hour), IssuedAt: now,
			},
		}
		if in, err = s.CommitRenewal(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
}

// benchRenewed joins one node and returns its instance and a renewal of
// it to the next generation, for the ReadRenewal benchmarks.
func benchRenewed(b *testing.B, s *SQLite) func() store.Instance {
	ctx := b.Context()
	benchToken(b, s)
	res, err := s.CommitJoin(ctx, benchJoin(0))
	if err != nil {
		b.Fatal(err)
	}
	in := res.Instance
	return func() store.Instance {
		now := time.Now()
		r := store.Renewal{
			InstanceID: in.ID, FromGeneration: in.Generation, ChainPEM: in.LastChainPEM,
			Certificate: store.Certificate{
				Serial: fmt.Sprintf("%032x", 1_000_000_000+in.Generation), NodeID: in.NodeID, InstanceID: in.ID,
				Generation: in.Generation + 1, JoinMethod: in.JoinMethod, TokenID: in.TokenID,
				PublicKey: in.LastPublicKey, NotBefore: now, NotAfter: now.Add(time.Hour), IssuedAt: now,
			},
		}
		if in, err = s.CommitRenewal(ctx, r); err != nil {
			b.Fatal(err)
		}
		return in
	}
}

// BenchmarkReadRenewal measures a renewal's read of its record, instance,
// node, lock and verifier set when nothing was written since the last
// read: the reading connection's page cache is warm.
func BenchmarkReadRenewal(b *testing.B) {
	s, _ := openTemp(b)
	ctx := b.Context()
	in := benchRenewed(b, s)()
	serial := fmt.Sprintf("%032x", 1_000_000_000+in.Generation-1)
	for b.Loop() {
		if r, err := s.ReadRenewal(ctx, serial, []string{"ab12"}); err != nil || !r.CertificateFound {
			b.Fatal(r.CertificateFound, err)
		}
	}
}

// BenchmarkReadJoin measures a token join's read (the token, the node
// asked for, the locks on its three targets) in a store of 5,000 nodes
// with a lock on each of them, when nothing was written since the last
// read: a known token and a free node, as nearly every join; an unknown
// token ID, whose decoy must cost what a known ID does; a bound-keypair
// token, read with its keypair row.
func BenchmarkReadJoin(b *testing.B) {
	s, _ := openTemp(b)
	ctx := b.Context()
	benchToken(b, s)
	benchFleet(b, s, 5000)
	insertBenchLocks(b, s, 5000)
	if err := s.InsertToken(ctx, store.Token{
		ID: "bk1", JoinMethod: store.JoinMethodBoundKeypair, Ciphertext: []byte("c"), Nonce: []byte("n"), NodeID: "node-bk", CreatedBy: "admin", CreatedAt: time.Now(),
		BoundKeypair: &store.BoundKeypair{Spec: store.BoundKeypairSpec{RecoveryLimit: 1, RecoveryMode: store.RecoveryStandard}},
	}, benchLink); err != nil {
		b.Fatal(err)
	}
	j := benchJoin(1_000_000)
	for _, c := range []struct{ name, token string }{{"known", "t1"}, {"unknown", "nosuch"}, {"bound-keypair", "bk1"}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if r, err := s.ReadJoin(ctx, c.token, j.NodeID, j.LockTargets); err != nil || r.NodeFound || r.Locked {
					b.Fatal(r, err)
				}
			}
		})
	}
}

// BenchmarkJoinReadWrite measures a token join's store work as the
// authority does it, one after another: the read, then the durable write.
// Each read follows a commit, so it finds the database changed and its
// connection's page cache reset. BenchmarkJoinReadWrite minus
// BenchmarkCommitJoin is the read's cost after a commit.
func BenchmarkJoinReadWrite(b *testing.B) {
	s, _ := openTemp(b)
	ctx := b.Context()
	benchToken(b, s)
	var n int64
	for b.Loop() {
		n++
		j := benchJoin(n)
		if r, err := s.ReadJoin(ctx, j.TokenID, j.NodeID, j.LockTargets); err != nil || !r.TokenFound || r.NodeFound || r.Locked {
			b.Fatal(r, err)
		}
		if _, err := s.CommitJoin(ctx, j); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRenewalReadWrite measures a renewal's store work as the
// authority does it, one after another: the read, then the durable write
// of the next generation. Each read follows a commit, so it finds the
// database changed and its connection's page cache reset.
// BenchmarkRenewalReadWrite minus BenchmarkCommitRenewal is the read's
// cost after a commit.
func BenchmarkRenewalReadWrite(b *testing.B) {
	s, _ := openTemp(b)
	ctx := b.Context()
	renew := benchRenewed(b, s)
	in := renew()
	for b.Loop() {
		serial := fmt.Sprintf("%032x", 1_000_000_000+in.Generation-1)
		if r, err := s.ReadRenewal(ctx, serial, []string{"ab12"}); err != nil || !r.CertificateFound {
			b.Fatal(r.CertificateFound, err)
		}
		in = renew()
	}
}

// benchBatch is the size of a batch in the batch benchmarks: a busy
// authority's committer finds about this many writes queued.
const benchBatch = 16

// runOps runs fns as one batch of the group committer, as it would run
// them had they been queued together, and fails b if any fails.
func runOps(b *testing.B, s *SQLite, fns []func(ctx context.Context, tx *writeTx) error) {
	batch := make([]*writeOp, len(fns))
	for i, fn := range fns {
		batch[i] = &writeOp{ctx: b.Context(), fn: fn, done: make(chan error, 1)}
	}
	s.runBatch(batch)
	s.wstmts.preparePending(b.Context()) // as the committer does after a batch
	for _, op := range batch {
		if err := <-op.done; err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCommitRenewalBatch measures renewals written as the committer
// writes them under load: benchBatch renewals of benchBatch instances,
// each with its audit record, in one batch, one commit. The batch is
// formed directly (runBatch), so every run has the same batches; b.N
// counts batches.
func BenchmarkCommitRenewalBatch(b *testing.B) {
	for _, size := range []int{1, benchBatch} {
		b.Run(fmt.Sprint(size), func(b *testing.B) { benchRenewalBatch(b, size, true) })
	}
	// Without lock targets: the conditional UPDATE as it was before the
	// write checked locks (measured against the above).
	b.Run("nolocks", func(b *testing.B) { benchRenewalBatch(b, benchBatch, false) })
}

// benchFleet records n/10 other nodes, each with its instance and ten
// certificates (random serials as the CA issues them), so that the batch benchmarks write into b-trees
// of some depth rather than into a store of a few pages.
func benchFleet(b *testing.B, s *SQLite, n int) {
	ctx := b.Context()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now().UnixMicro()
	for i := range n / 10 {
		id := fmt.Sprintf("fleet-%d", i)
		// Each node and its instance, holding a chain of the size a
		// leaf and its intermediate take in PEM.
		if _, err := tx.ExecContext(ctx, `INSERT INTO instances (`+instanceColumns+`) VALUES (?, ?, 'token', 't1', '', 'current', 9, ?, '', x'00', zeroblob(1500), ?)`,
			id, "node-"+id, now, now); err != nil {
			b.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO nodes (`+nodeColumns+`) VALUES (?, 'token', 't1', ?, ?, ?)`,
			"node-"+id, id, now, now); err != nil {
			b.Fatal(err)
		}
		for g := range 10 {
			key := sha256.Sum256([]byte(fmt.Sprint(id, g)))
			if _, err := tx.ExecContext(ctx, `INSERT INTO certificates (`+certificateColumns+`) VALUES (?, ?, ?, ?, 'token', 't1', ?, ?, ?, ?)`,
				fmt.Sprintf("%x", key[:16]), "node-"+id, id, g, key[:], now, now, now); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
}

// benchRenewal is the renewal of in to its next generation at now, with
// its audit record; its serial is drawn from seed and the generation, so
// each agent's differ.
func benchRenewal(in store.Instance, seed any, now time.Time) store.Renewal {
	return store.Renewal{
		InstanceID: in.ID, FromGeneration: in.Generation, ChainPEM: in.LastChainPEM, Audit: benchLink,
		Certificate: store.Certificate{
			Serial: fmt.Sprintf("%x", sha256.Sum256([]byte(fmt.Sprint(seed, "/", in.Generation))))[:32], NodeID: in.NodeID, InstanceID: in.ID,
			Generation: in.Generation + 1, JoinMethod: in.JoinMethod, TokenID: in.TokenID,
			PublicKey: in.LastPublicKey, NotBefore: now, NotAfter: now.Add(time.Hour), IssuedAt: now,
		},
	}
}

// benchRenewalOp is r as a write of a batch, which leaves *in the
// renewed instance.
func benchRenewalOp(b *testing.B, in *store.Instance, r store.Renewal) func(ctx context.Context, tx *writeTx) error {
	c, err := store.PrepareRenewal(r)
	if err != nil {
		b.Fatal(err)
	}
	return func(ctx context.Context, tx *writeTx) error {
		var err error
		*in, err = commitRenewal(ctx, tx, r, c)
		return err
	}
}

// benchAgents opens a store holding the bench token, a fleet of 5,000
// certificates and n agents joined with it, whose instances it returns.
func benchAgents(b *testing.B, n int) (*SQLite, []store.Instance) {
	s, _ := openTemp(b)
	benchToken(b, s)
	benchFleet(b, s, 5000)
	ins := make([]store.Instance, n)
	for i := range ins {
		res, err := s.CommitJoin(b.Context(), benchJoin(int64(i)))
		if err != nil {
			b.Fatal(err)
		}
		ins[i] = res.Instance
	}
	return s, ins
}

// benchRenewalBatch writes size renewals a batch, each checking the
// locks a renewal checks (store.RenewalLockTargets) if locked.
func benchRenewalBatch(b *testing.B, size int, locked bool) {
	s, ins := benchAgents(b, size)
	fns := make([]func(ctx context.Context, tx *writeTx) error, size)
	for b.Loop() {
		now := time.Now()
		for i := range ins {
			in := &ins[i]
			r := benchRenewal(*in, i, now)
			if locked {
				r.LockTargets = store.RenewalLockTargets(r.Certificate, *in, []string{"ab12"})
			}
			fns[i] = benchRenewalOp(b, in, r)
		}
		runOps(b, s, fns)
	}
}

// BenchmarkCommitJoinBatch measures joins of new nodes, each with its
// audit record, benchBatch to a batch (see BenchmarkCommitRenewalBatch).
func BenchmarkCommitJoinBatch(b *testing.B) {
	for _, size := range []int{1, benchBatch} {
		b.Run(fmt.Sprint(size), func(b *testing.B) { benchJoinBatch(b, size) })
	}
}

func benchJoinBatch(b *testing.B, size int) {
	s, _ := openTemp(b)
	benchToken(b, s)
	benchFleet(b, s, 5000)
	fns := make([]func(ctx context.Context, tx *writeTx) error, size)
	var n int64
	for b.Loop() {
		for i := range fns {
			n++
			j := benchJoin(n)
			j.Audit = benchLink
			in, cert, err := store.PrepareJoin(j)
			if err != nil {
				b.Fatal(err)
			}
			fns[i] = func(ctx context.Context, tx *writeTx) error {
				_, err := commitJoin(ctx, tx, j, in, cert)
				return err
			}
		}
		runOps(b, s, fns)
	}
}

// BenchmarkRenewalRound measures a renewal's store work in a store of
// some size as a busy authority does it: size agents each read their
// record (ReadRenewal, one after another on the read pool, the first
// after the last round's commit), then their renewals are written in one
// batch. b.N counts rounds. With size 1 every read follows a commit, so
// its connection's page cache was reset.
func BenchmarkRenewalRound(b *testing.B) {
	for _, size := range []int{1, benchBatch} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			s, ins := benchAgents(b, size)
			ctx := b.Context()
			keys := []string{"ab12"}
			fns := make([]func(ctx context.Context, tx *writeTx) error, size)
			for b.Loop() {
				now := time.Now()
				for i := range ins {
					in := &ins[i]
					rr, err := s.ReadRenewal(ctx, in.LastSerial, keys)
					if err != nil || !rr.InstanceFound || rr.Instance.Generation != in.Generation {
						b.Fatal(rr.InstanceFound, err)
					}
					r := benchRenewal(*in, i, now)
					r.LockTargets = store.RenewalLockTargets(r.Certificate, *in, keys)
					fns[i] = benchRenewalOp(b, in, r)
				}
				runOps(b, s, fns)
			}
		})
	}
}

// BenchmarkRenewalParallel measures renewals of benchBatch agents at
// once in a store of some size, as the authority serves them: each reads
// its record (ReadRenewal) on the read pool, then commits its renewal
// through the group committer (CommitRenewal); b.N counts renewals.
// Reads from several goroutines land on several of the pool's
// connections, and each connection's first read after a commit finds
// its page cache reset.
func BenchmarkRenewalParallel(b *testing.B) {
	s, _ := openTemp(b)
	ctx := b.Context()
	benchToken(b, s)
	benchFleet(b, s, 5000)
	var next atomic.Int64
	b.SetParallelism(benchBatch / runtime.GOMAXPROCS(0))
	b.RunParallel(func(pb *testing.PB) {
		res, err := s.CommitJoin(ctx, benchJoin(next.Add(1)))
		if err != nil {
			b.Error(err)
			return
		}
		in := res.Instance
		keys := []string{"ab12"}
		for pb.Next() {
			rr, err := s.ReadRenewal(ctx, in.LastSerial, keys)
			if err != nil || !rr.InstanceFound {
				b.Error(rr.InstanceFound, err)
				return
			}
			now := time.Now()
			r := benchRenewal(in, in.ID, now)
			r.LockTargets = store.RenewalLockTargets(r.Certificate, rr.Instance, keys)
			if in, err = s.CommitRenewal(ctx, r); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkWriteHandoff measures the hand-off of a write to the group
// commit and back, at 1, 4 and 16 writers: each write inserts one small
// row through s.write, so beside the commit's fsync the cost is the
// queueing and the waking. It reports the writes per commit (the batches'
// mean size); -v logs their distribution. Count context switches (perf
// stat -e context-switches) and futex and fdatasync calls (strace -c -f)
// of the test binary at two -benchtime counts and take the difference.
func BenchmarkWriteHandoff(b *testing.B) {
	for _, writers := range []int{1, 4, 16} {
		b.Run(fmt.Sprint(writers), func(b *testing.B) {
			s := openWithRows(b)
			var (
				mu  sync.Mutex
				txs []*writeTx // each write's transaction, in commit order; kept reachable so no address repeats
			)
			var n atomic.Int64
			b.ResetTimer()
			var wg sync.WaitGroup
			for range writers {
				wg.Go(func() {
					for {
						i := n.Add(1)
						if i > int64(b.N) {
							return
						}
						err := s.write(b.Context(), func(ctx context.Context, tx *writeTx) error {
							if _, err := tx.ExecContext(ctx, `INSERT INTO batch_rows (id) VALUES (?)`, fmt.Sprint(i)); err != nil {
								return err
							}
							mu.Lock()
							txs = append(txs, tx)
							mu.Unlock()
							return nil
						})
						if err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			sizes := batchSizes(txs)
			b.ReportMetric(float64(len(txs))/float64(len(sizes)), "writes/commit")
			b.Logf("batch sizes (size: batches): %v", sizeHistogram(sizes))
		})
	}
}

// batchSizes tells the sizes of the batches txs ran in, one transaction
// pointer per write in the order they ran.
func batchSizes(txs []*writeTx) []int {
	var sizes []int
	for i, tx := range txs {
		if i == 0 || tx != txs[i-1] {
			sizes = append(sizes, 0)
		}
		sizes[len(sizes)-1]++
	}
	return sizes
}

func sizeHistogram(sizes []int) map[int]int {
	h := map[int]int{}
	for _, n := range sizes {
		h[n]++
	}
	return h
}

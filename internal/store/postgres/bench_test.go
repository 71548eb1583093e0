package postgres

import (
	"sync/atomic"
	"testing"
)

// The benchmarks run against pgtest's server, which has fsync=off and
// synchronous_commit=off: they measure round trips and locking, not
// durability.

// BenchmarkAppendAuditParallel measures appends from many goroutines, which
// queue on the chain's advisory lock.
func BenchmarkAppendAuditParallel(b *testing.B) {
	s, _ := openFresh(b)
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

// BenchmarkAppendAudit measures one append at a time.
func BenchmarkAppendAudit(b *testing.B) {
	s, _ := openFresh(b)
	ctx := b.Context()
	for b.Loop() {
		if _, err := s.AppendAudit(ctx, benchLink); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCommitJoin measures one admission of a new node at a time.
func BenchmarkCommitJoin(b *testing.B) { benchCommitJoins(b, false) }

// BenchmarkCommitJoinParallel measures admissions from many goroutines
// sharing one token, which queue on the token's row lock.
func BenchmarkCommitJoinParallel(b *testing.B) {
	s, _ := openFresh(b)
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

// BenchmarkCommitJoinAudited measures one admission at a time that
// appends its audit record, as every join of an authority does.
func BenchmarkCommitJoinAudited(b *testing.B) { benchCommitJoins(b, true) }

// benchCommitJoins admits new nodes one at a time, each appending an
// audit record if audited.
func benchCommitJoins(b *testing.B, audited bool) {
	s, _ := openFresh(b)
	ctx := b.Context()
	benchToken(b, s)
	var n int64
	for b.Loop() {
		n++
		j := benchJoin(n)
		if audited {
			j.Audit = benchLink
		}
		if _, err := s.CommitJoin(ctx, j); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadJoin measures a token join's read (the token, the node
// asked for, the locks on its three targets), one at a time: a known
// token and a free node, as nearly every join, and an unknown token ID,
// whose decoy must cost what a known ID does.
func BenchmarkReadJoin(b *testing.B) {
	s, _ := openFresh(b)
	ctx := b.Context()
	benchToken(b, s)
	j := benchJoin(1_000_000)
	for _, c := range []struct{ name, token string }{{"known", "t1"}, {"unknown", "nosuch"}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if r, err := s.ReadJoin(ctx, c.token, j.NodeID, j.LockTargets); err != nil || r.NodeFound || r.Locked {
					b.Fatal(r, err)
				}
			}
		})
	}
}

// BenchmarkPoolAcquire measures taking one of the pool's connections and
// giving it back, no statement sent: the part of every request the pool's
// hooks (cancelThenDrop's check) add to.
func BenchmarkPoolAcquire(b *testing.B) {
	s, _ := openFresh(b)
	ctx := b.Context()
	for b.Loop() {
		c, err := s.pool.p.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		c.Release()
	}
}

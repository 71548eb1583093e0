package sqlite

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
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
		}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFindLock measures the lock check on the join path, against
// 10,000 locks, from parallel readers.
func BenchmarkFindLock(b *testing.B) {
	s, _ := openTemp(b)
	ctx := b.Context()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	for i := range 10000 {
		if _, err := tx.ExecContext(ctx, `INSERT INTO locks (`+lockColumns+`) VALUES (?, ?, ?, '', '', ?, NULL)`,
			fmt.Sprintf("lock-%d", i), store.LockNode, fmt.Sprintf("node-%d", i), time.Now().UnixMicro()); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	var i atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n := i.Add(1) % 20000 // half hit, half miss
			_, err := s.FindLock(ctx, store.LockNode, fmt.Sprintf("node-%d", n))
			if err != nil && n < 10000 {
				b.Error(err)
				return
			}
		}
	})
}

package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// BenchmarkWriterLayer measures what database/sql adds to the writer's
// transactions: a renewal's three statements (its UPDATE … RETURNING,
// its certificate, an audit record), size to a transaction, committed
// durably, run twice over the same data:
//
//   - sqltx: as the writer runs them, a *sql.Tx and writeTx's handles of
//     the writer's cached statements;
//   - raw: on the writer's connection as the driver gives it
//     (sql.Conn.Raw), its driver.Stmts prepared once and kept, the
//     arguments passed as driver.NamedValues and the returned row read
//     into a []driver.Value: no database/sql between muster and the
//     driver.
//
// The difference is the most a writer without *sql.Tx could save
// (docs/performance.md, eleventh session); the muster code around the
// statements (the renewal's checks, the audit record's hash) is not run.
// The audit records' hashes are placeholders, not a chain. cpu-ns/op is
// the process's CPU (user and system) per transaction.
func BenchmarkWriterLayer(b *testing.B) {
	for _, size := range []int{1, benchBatch} {
		b.Run(fmt.Sprint("sqltx/", size), func(b *testing.B) {
			s, ins, seq := writerLayerSetup(b, size)
			bg := context.Background()
			for _, q := range writerLayerQueries {
				if _, err := s.wstmts.get(bg, q); err != nil {
					b.Fatal(err)
				}
			}
			cpu0 := processCPU()
			for b.Loop() {
				now := time.Now()
				sqlTx, err := s.w.BeginTx(bg, nil)
				if err != nil {
					b.Fatal(err)
				}
				tx := newWriteTx(sqlTx, s.wstmts)
				for i := range ins {
					upd, cert, aud := writerLayerArgs(&ins[i], i, now, seq)
					seq++
					var nodeID, method, tokenID, prev string
					var created nullInt
					if err := tx.QueryRowContext(bg, writerLayerQueries[0], upd...).Scan(&nodeID, &method, &tokenID, &prev, &created); err != nil {
						b.Fatal(err)
					}
					if _, err := tx.ExecContext(bg, writerLayerQueries[1], cert...); err != nil {
						b.Fatal(err)
					}
					if _, err := tx.ExecContext(bg, writerLayerQueries[2], aud...); err != nil {
						b.Fatal(err)
					}
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
			}
			reportCPU(b, cpu0)
		})
		b.Run(fmt.Sprint("conn/", size), func(b *testing.B) {
			s, ins, seq := writerLayerSetup(b, size)
			bg := context.Background()
			conn, err := s.w.Conn(bg)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			var sts [len(writerLayerQueries) + 2]*sql.Stmt
			for i, q := range append(writerLayerQueries[:], `BEGIN IMMEDIATE`, `COMMIT`) {
				if sts[i], err = conn.PrepareContext(bg, q); err != nil {
					b.Fatal(err)
				}
				defer sts[i].Close()
			}
			cpu0 := processCPU()
			for b.Loop() {
				now := time.Now()
				if _, err := sts[3].ExecContext(bg); err != nil {
					b.Fatal(err)
				}
				for i := range ins {
					upd, cert, aud := writerLayerArgs(&ins[i], i, now, seq)
					seq++
					var nodeID, method, tokenID, prev string
					var created nullInt
					if err := sts[0].QueryRowContext(bg, upd...).Scan(&nodeID, &method, &tokenID, &prev, &created); err != nil {
						b.Fatal(err)
					}
					if _, err := sts[1].ExecContext(bg, cert...); err != nil {
						b.Fatal(err)
					}
					if _, err := sts[2].ExecContext(bg, aud...); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := sts[4].ExecContext(bg); err != nil {
					b.Fatal(err)
				}
			}
			reportCPU(b, cpu0)
		})
		b.Run(fmt.Sprint("raw/", size), func(b *testing.B) {
			s, ins, seq := writerLayerSetup(b, size)
			bg := context.Background()
			conn, err := s.w.Conn(bg)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			err = conn.Raw(func(dc any) error {
				var sts [len(writerLayerQueries)]driver.Stmt
				for i, q := range writerLayerQueries {
					st, err := dc.(driver.ConnPrepareContext).PrepareContext(bg, q)
					if err != nil {
						return err
					}
					defer st.Close()
					sts[i] = st
				}
				var nv []driver.NamedValue
				named := func(args []any) []driver.NamedValue {
					nv = nv[:0]
					for i, a := range args {
						nv = append(nv, driver.NamedValue{Ordinal: i + 1, Value: a})
					}
					return nv
				}
				dest := make([]driver.Value, 5)
				cpu0 := processCPU()
				for b.Loop() {
					now := time.Now()
					tx, err := dc.(driver.ConnBeginTx).BeginTx(bg, driver.TxOptions{})
					if err != nil {
						return err
					}
					for i := range ins {
						upd, cert, aud := writerLayerArgs(&ins[i], i, now, seq)
						seq++
						rows, err := sts[0].(driver.StmtQueryContext).QueryContext(bg, named(upd))
						if err != nil {
							return err
						}
						err = rows.Next(dest)
						rows.Close()
						if err != nil {
							return err
						}
						if _, err := sts[1].(driver.StmtExecContext).ExecContext(bg, named(cert)); err != nil {
							return err
						}
						if _, err := sts[2].(driver.StmtExecContext).ExecContext(bg, named(aud)); err != nil {
							return err
						}
					}
					if err := tx.Commit(); err != nil {
						return err
					}
				}
				reportCPU(b, cpu0)
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}

var writerLayerQueries = [...]string{
	renewQuery(0),
	`INSERT INTO certificates (` + certificateColumns + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
	`INSERT INTO audit_records (` + auditColumns + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
}

// writerLayerSetup is benchAgents with the audit chain's next seq.
func writerLayerSetup(b *testing.B, size int) (*SQLite, []store.Instance, int64) {
	s, ins := benchAgents(b, size)
	h, _, err := chainHead(b.Context(), s.r)
	if err != nil {
		b.Fatal(err)
	}
	return s, ins, h.Seq + 1
}

// writerLayerArgs are the arguments of writerLayerQueries for the renewal
// of *in at now with the audit record seq; *in moves to the next
// generation.
func writerLayerArgs(in *store.Instance, i int, now time.Time, seq int64) (upd, cert, aud []any) {
	r := benchRenewal(*in, i, now)
	c := r.Certificate
	upd = []any{c.Serial, c.PublicKey, r.ChainPEM, timeArg(c.IssuedAt), timeArg(c.NotAfter),
		timeArg(store.ExpiringAt(c)), in.ID, in.Generation}
	cert = []any{c.Serial, c.NodeID, c.InstanceID, c.Generation, c.JoinMethod, c.TokenID, c.PublicKey,
		timeArg(c.NotBefore), timeArg(c.NotAfter), timeArg(c.IssuedAt)}
	h := fmt.Appendf(nil, "%032d", seq)
	aud = []any{seq, now.UnixMicro(), "agent", "renew", in.ID, "ok", "", "127.0.0.1", "corr", h, h}
	in.Generation++
	return upd, cert, aud
}

// processCPU is the process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportCPU(b *testing.B, cpu0 time.Duration) {
	if cpu := processCPU() - cpu0; cpu0 > 0 && cpu > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}

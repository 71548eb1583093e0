package loadgen

import (
	"testing"
	"time"
)

// BenchmarkServerBound prints the server-side bound of each operation
// over a new connection as muster bench measures it, without an
// authority: the best of the runs, in µs, in all and primitive by
// primitive (`go test -run '^$' -bench ServerBound ./internal/loadgen/`).
func BenchmarkServerBound(b *testing.B) {
	for _, op := range []string{OpTokenJoin, OpPSKJoin, OpRenew, OpBoundRecovery, OpBoundRefresh} {
		b.Run(op, func(b *testing.B) {
			var best *Bound
			for b.Loop() {
				got, err := MeasureBound(op, true)
				if err != nil {
					b.Fatal(err)
				}
				if best == nil || got.PerOp < best.PerOp {
					best = got
				}
			}
			us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
			b.ReportMetric(0, "ns/op") // a run of MeasureBound's own time says nothing
			b.ReportMetric(us(best.PerOp), "bound-µs")
			b.ReportMetric(us(best.KeptConnection), "kept-connection-µs")
			for _, p := range best.Parts {
				b.ReportMetric(us(p.PerOp), string(p.Primitive)+"-µs")
			}
		})
	}
}

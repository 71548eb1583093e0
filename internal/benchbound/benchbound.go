// Package benchbound reports, in a go test benchmark, the server-side
// crypto bound of an operation (loadgen.MeasureBound and its parts,
// measured in the same run before the clock started) beside the time per
// operation, with the ratios muster bench prints, so that the in-process
// benchmarks of the authority and of enroll read as the bench does.
package benchbound

import (
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/loadgen"
)

// Report prints bound-ns/op, the process's CPU time per operation while
// the clock ran (cpu-ns/op) and two ratios, named as muster bench names
// them:
//
//   - of_bound, the bound over the wall time per operation: the
//     throughput as a fraction of the bound's rate on one core;
//   - cpu_efficiency, the bound over the CPU per operation. The process
//     holds whatever the benchmark runs (the service, its store, its
//     callers), so this reads below muster bench's cpu_efficiency, the
//     authority's CPU alone, for the same server.
//
// cpu0 is loadgen.ProcessCPU when the clock started (0: CPU not read, only
// of_bound is reported); 1.0 would be a process doing nothing but the
// server's crypto.
func Report(b *testing.B, bound, cpu0 time.Duration) {
	cpu := loadgen.ProcessCPU() - cpu0
	n := float64(b.N)
	b.ReportMetric(float64(bound.Nanoseconds()), "bound-ns/op")
	b.ReportMetric(float64(bound.Nanoseconds())/(float64(b.Elapsed().Nanoseconds())/n), "of_bound")
	if cpu0 > 0 && cpu > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/n, "cpu-ns/op")
		b.ReportMetric(float64(bound.Nanoseconds())/(float64(cpu.Nanoseconds())/n), "cpu_efficiency")
	}
}

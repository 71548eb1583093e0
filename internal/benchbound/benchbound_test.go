package benchbound

import (
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/loadgen"
)

// TestReport: the bound and of_bound are reported, and with the CPU read
// at the start, the CPU per operation and cpu_efficiency (bound over it).
func TestReport(t *testing.T) {
	const bound = time.Millisecond
	r := testing.Benchmark(func(b *testing.B) {
		cpu0 := loadgen.ProcessCPU()
		for b.Loop() {
			for start := loadgen.ProcessCPU(); loadgen.ProcessCPU()-start < 100*time.Microsecond; {
			}
		}
		Report(b, bound, cpu0)
	})
	x := r.Extra
	if x["bound-ns/op"] != float64(bound.Nanoseconds()) || x["of_bound"] <= 0 {
		t.Fatalf("metrics %v: want bound-ns/op %d and of_bound", x, bound.Nanoseconds())
	}
	if loadgen.ProcessCPU() == 0 {
		return // no process CPU clock here
	}
	if cpu := x["cpu-ns/op"]; cpu < 100_000 || x["cpu_efficiency"] != float64(bound.Nanoseconds())/cpu {
		t.Fatalf("metrics %v: want cpu-ns/op at least 100 µs and cpu_efficiency the bound over it", x)
	}
	r = testing.Benchmark(func(b *testing.B) {
		for b.Loop() {
		}
		Report(b, bound, 0)
	})
	if _, ok := r.Extra["cpu_efficiency"]; ok {
		t.Errorf("metrics %v without the CPU read: want no cpu_efficiency", r.Extra)
	}
}

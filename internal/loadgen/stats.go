// Package loadgen drives a running authority over its real protocol, from
// many simulated agents, and measures what it carries: throughput,
// latency percentiles, refusals by gRPC code, the authority's CPU and
// memory, and the crypto floor of each operation measured on the same
// machine in the same run.
package loadgen

import (
	"math"
	"slices"
	"time"
)

// Latency summarises the latencies of the successful requests of a run.
type Latency struct {
	P50 time.Duration `json:"p50_ns"`
	P95 time.Duration `json:"p95_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
}

// summarize sorts lat in place and returns its percentiles.
func summarize(lat []time.Duration) Latency {
	slices.Sort(lat)
	return Latency{P50: percentile(lat, 50), P95: percentile(lat, 95), P99: percentile(lat, 99), Max: percentile(lat, 100)}
}

// percentile is the nearest-rank percentile of sorted: the smallest value
// at least p% of the values are at or below. Nearest rank, not
// interpolation, so every figure printed is a latency a request had.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

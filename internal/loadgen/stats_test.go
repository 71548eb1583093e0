package loadgen

import (
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	for _, tc := range []struct {
		name string
		lat  []time.Duration
		p    float64
		want time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one value is every percentile", ms(7), 99, 7 * time.Millisecond},
		{"median of odd count", ms(1, 2, 3, 4, 5), 50, 3 * time.Millisecond},
		{"median of even count is the lower middle", ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{"p95 of 1..100", ms(hundred...), 95, 95 * time.Millisecond},
		{"p99 of 1..100", ms(hundred...), 99, 99 * time.Millisecond},
		{"max", ms(hundred...), 100, 100 * time.Millisecond},
		{"p0 is the minimum", ms(3, 9), 0, 3 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := percentile(tc.lat, tc.p); got != tc.want {
				t.Errorf("percentile(%v, %v) = %v, want %v", tc.lat, tc.p, got, tc.want)
			}
		})
	}
}

func TestSummarizeSorts(t *testing.T) {
	lat := []time.Duration{9, 1, 5, 3, 7, 2, 8, 4, 6, 10}
	got := summarize(lat)
	want := Latency{P50: 5, P95: 10, P99: 10, Max: 10}
	if got != want {
		t.Errorf("summarize = %+v, want %+v", got, want)
	}
}

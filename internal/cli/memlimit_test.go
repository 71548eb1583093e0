package cli

import (
	"io"
	"log/slog"
	"math"
	"runtime/debug"
	"testing"
)

func TestParseMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{in: "", want: 0},
		{in: "0", want: 0},
		{in: "2147483648", want: 2 << 30}, // the downward API's limits.memory, in bytes
		{in: "512MiB", want: 512 << 20},
		{in: "2GiB", want: 2 << 30},
		{in: "64MiB", want: 64 << 20},
		{in: "1TiB", want: 1 << 40},
		{in: "64KiB", bad: true}, // below 64 MiB: the collector would never rest
		{in: "2048", bad: true},  // MiB meant, bytes given
		{in: "100B", bad: true},
		{in: " 1GiB ", want: 1 << 30},
		{in: "2Gi", bad: true}, // a Kubernetes quantity: the downward API resolves it to bytes
		{in: "1.5GiB", bad: true},
		{in: "-1", bad: true},
		{in: "GiB", bad: true},
		{in: "lots", bad: true},
		{in: "9223372036854775807TiB", bad: true},
		{in: "9223372036854775807", want: math.MaxInt64},
	} {
		got, err := parseMemoryLimit(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("parseMemoryLimit(%q) = %d, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("parseMemoryLimit(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestApplyMemoryLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

	applyMemoryLimit(log, env(nil), 0)
	if got := debug.SetMemoryLimit(-1); got != prev {
		t.Fatalf("no --memory-limit changed the limit to %d", got)
	}
	applyMemoryLimit(log, env(map[string]string{"GOMEMLIMIT": "300MiB"}), 1<<30)
	if got := debug.SetMemoryLimit(-1); got != prev {
		t.Fatalf("--memory-limit overrode GOMEMLIMIT: limit %d", got)
	}
	applyMemoryLimit(log, env(nil), 1000<<20)
	if got, want := debug.SetMemoryLimit(-1), int64(900<<20); got != want {
		t.Fatalf("--memory-limit 1000MiB set the limit to %d, want 90%%: %d", got, want)
	}
}

// --check-config says what the authority will do with --memory-limit.
func TestDescribeMemoryLimit(t *testing.T) {
	for _, tt := range []struct {
		limit      int64
		gomemlimit string
		want       string
	}{
		{0, "", ""},
		{0, "1GiB", ""},
		{1 << 30, "", "1073741824 bytes: the Go collector's soft limit 966367641 (90%)"},
		{1 << 30, "800MiB", "1073741824 bytes: not applied, GOMEMLIMIT=800MiB is set and wins"},
	} {
		if got := describeMemoryLimit(tt.limit, tt.gomemlimit); got != tt.want {
			t.Errorf("describeMemoryLimit(%d, %q) = %q, want %q", tt.limit, tt.gomemlimit, got, tt.want)
		}
	}
}

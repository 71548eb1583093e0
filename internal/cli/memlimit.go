package cli

import (
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"strconv"
	"strings"
)

// memoryLimitShare is the part of --memory-limit (a container's memory
// limit) the authority gives the Go collector as its soft limit. The rest
// is what the collector does not count (the binary's text, SQLite's page
// cache outside the Go heap, the kernel's socket buffers charged to the
// container) and room for a burst past the soft limit, which the collector
// lets the heap exceed rather than spend more than half the CPU.
const memoryLimitShare = 0.9

// minMemoryLimit is the smallest --memory-limit taken: below it the
// collector would run almost without pause (an authority's heap is tens of
// MiB before its first agent), and a figure that small is most likely a
// number of MiB given without its unit.
const minMemoryLimit = 64 << 20

// parseMemoryLimit reads --memory-limit: a whole number of bytes (what
// Kubernetes' downward API gives for limits.memory), or with one of the
// suffixes GOMEMLIMIT takes (B, KiB, MiB, GiB, TiB). Zero or empty is no
// limit; anything else below minMemoryLimit is refused.
func parseMemoryLimit(s string) (int64, error) {
	units := []struct {
		suffix string
		mul    int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}
	num, mul := strings.TrimSpace(s), int64(1)
	if num == "" {
		return 0, nil
	}
	for _, u := range units {
		if n, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mul = n, u.mul
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mul {
		return 0, fmt.Errorf("--memory-limit %q: want a whole number of bytes, or one with KiB, MiB, GiB or TiB (such as 2GiB)", s)
	}
	if n*mul > 0 && n*mul < minMemoryLimit {
		return 0, fmt.Errorf("--memory-limit %q: want at least 64MiB (a number alone is bytes: 2048 is 2 KiB; say 2048MiB or 2GiB)", s)
	}
	return n * mul, nil
}

// applyMemoryLimit sets the collector's soft memory limit to
// memoryLimitShare of limit bytes. GOMEMLIMIT, when set, wins: the runtime
// read it at start, and an operator who set it meant that figure. GOGC is
// left as it is, so below the limit the collector runs as it always does,
// and only a heap grown near the limit is collected sooner (more CPU, no
// out-of-memory kill).
func applyMemoryLimit(log *slog.Logger, getenv func(string) string, limit int64) {
	if limit <= 0 {
		return
	}
	if v := getenv("GOMEMLIMIT"); v != "" {
		log.Info("GOMEMLIMIT is set: --memory-limit does not change it", "gomemlimit", v, "memory_limit", limit)
		return
	}
	soft := softMemoryLimit(limit)
	debug.SetMemoryLimit(soft)
	log.Info("Go memory limit set from --memory-limit", "memory_limit", limit, "gomemlimit", soft)
}

// softMemoryLimit is the collector's soft limit for --memory-limit limit.
func softMemoryLimit(limit int64) int64 { return int64(float64(limit) * memoryLimitShare) }

// describeMemoryLimit is --check-config's line for --memory-limit: what
// applyMemoryLimit would do with it, GOMEMLIMIT being gomemlimit.
func describeMemoryLimit(limit int64, gomemlimit string) string {
	switch {
	case limit <= 0:
		return ""
	case gomemlimit != "":
		return fmt.Sprintf("%d bytes: not applied, GOMEMLIMIT=%s is set and wins", limit, gomemlimit)
	default:
		return fmt.Sprintf("%d bytes: the Go collector's soft limit %d (90%%)", limit, softMemoryLimit(limit))
	}
}

package listener

import (
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// refusalLogEvery is how often a listener logs its refusals of one kind:
// a flood of connections is one warning a minute, not one a connection.
const refusalLogEvery = time.Minute

// Refusals reports connections closed at once: each is counted, and the
// log says so at the first and then at most once a minute per listener
// and kind, with how many since the last line. Safe for concurrent use.
type Refusals struct {
	log   *slog.Logger
	count func(listener string, r Refusal)
	now   func() time.Time

	mu   sync.Mutex
	seen map[refusalKey]*refusalRun
}

type refusalKey struct {
	listener string
	r        Refusal
}

type refusalRun struct {
	logged  time.Time
	pending int
}

// NewRefusals reports to log and count (a metric).
func NewRefusals(log *slog.Logger, count func(listener string, r Refusal)) *Refusals {
	return &Refusals{log: log, count: count, now: time.Now, seen: map[refusalKey]*refusalRun{}}
}

// For is the Options.Refused of the listener named name ("api",
// "bootstrap", "metrics"), whose cap is maxConns.
func (rs *Refusals) For(name string, maxConns int) func(Refusal) {
	return func(r Refusal) {
		rs.count(name, r)
		now := rs.now()
		k := refusalKey{name, r}
		rs.mu.Lock()
		run := rs.seen[k]
		if run == nil {
			run = &refusalRun{}
			rs.seen[k] = run
		}
		run.pending++
		n := run.pending
		due := run.logged.IsZero() || now.Sub(run.logged) >= refusalLogEvery
		if due {
			run.logged, run.pending = now, 0
		}
		rs.mu.Unlock()
		if !due {
			return
		}
		switch r {
		case RefusedTotal:
			rs.log.Warn("connections closed at once: the listener holds its cap of open connections",
				"listener", name, "refused", n, "max_connections", maxConns, "per", refusalLogEvery)
		case RefusedAnonymous:
			rs.log.Warn("connections closed after their handshake: anonymous callers hold their share of the cap; the rest is kept for operators and agents",
				"listener", name, "refused", n, "max_connections", maxConns, "per", refusalLogEvery)
		case RefusedSilent:
			rs.log.Warn("connections closed to make room: the cap of open connections was full, and each had not sent a byte (half-open), the oldest such of the source address holding the most",
				"listener", name, "closed", n, "max_connections", maxConns, "per", refusalLogEvery)
		case RefusedIdentity:
			rs.log.Warn("connections closed after their handshake: a client identity holds its cap of open connections",
				"listener", name, "refused", n, "per", refusalLogEvery)
		default:
			rs.log.Warn("connections closed at once: a source holds its cap of open connections",
				"listener", name, "refused", n, "max_per_source", MaxPerSource(maxConns), "per", refusalLogEvery)
		}
	}
}

// NewRefusalsMetric registers muster_connections_refused_total on reg and
// returns Refusals reporting to it and to log.
func NewRefusalsMetric(reg prometheus.Registerer, log *slog.Logger) (*Refusals, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "muster_connections_refused_total",
		Help: "Connections closed at once by a listener, by listener (api, bootstrap, metrics) and reason: per_source (the source held 256) or total (the listeners sharing limits.max_connections held it; the metrics listener: its own 64); anonymous and identity (past a share, after the handshake); silent (a connection that had sent nothing, the oldest such of the source holding the most, closed to make room on a full cap).",
	}, []string{"listener", "reason"})
	if err := reg.Register(c); err != nil {
		return nil, err
	}
	return NewRefusals(log, func(l string, r Refusal) { c.WithLabelValues(l, string(r)).Inc() }), nil
}

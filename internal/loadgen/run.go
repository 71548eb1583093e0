package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/status"
)

// ErrExhausted is returned by an operation that has used up what was
// prepared for it before the clock started (keys and CSRs): the worker
// stops, and the run ends when every worker has.
var ErrExhausted = errors.New("loadgen: the prepared requests are used up")

// Operation is one kind of request, prepared before the run: Do sends
// request seq for worker (0 ≤ worker < concurrency); a worker calls Do
// one request at a time, so per-worker state needs no lock.
type Operation interface {
	Do(ctx context.Context, worker int, seq int64) error
}

// RunConfig says how hard and how long to drive an operation.
type RunConfig struct {
	Concurrency int
	// Duration and Requests bound the run; the first reached ends it.
	// Zero means no bound of that kind (one of them must be set).
	Duration time.Duration
	Requests int64
	// Progress, if set, gets a line a second while the run lasts.
	Progress io.Writer
	// PID, if not zero, is the authority's process on this machine,
	// watched through /proc during the run.
	PID int
	// Batch is, for RunKept, the most connections opened and readied
	// before each batch of requests.
	Batch int
}

// Outcome is what a run measured.
type Outcome struct {
	Requests   int64             `json:"requests"`
	OK         int64             `json:"ok"`
	Errors     map[string]int64  `json:"errors"`
	FirstError map[string]string `json:"first_error,omitempty"`
	Elapsed    time.Duration     `json:"elapsed_ns"`
	// Throughput is successful requests per second of the run.
	Throughput float64    `json:"throughput"`
	Latency    Latency    `json:"latency"`
	Exhausted  bool       `json:"exhausted,omitempty"`
	Authority  *ProcUsage `json:"authority,omitempty"`
	// Kept is, for a run over kept connections (RunKept), its batches
	// and the untimed part's cost.
	Kept *KeptRun `json:"kept,omitempty"`
}

// worker's results, merged after the run without locks during it.
type tally struct {
	lat    []time.Duration
	errs   map[string]int64
	first  map[string]string
	ok     atomic.Int64
	failed atomic.Int64
}

// Run drives op with cfg.Concurrency workers until the duration or the
// request count is reached, ctx ends, or the prepared requests run out.
func Run(ctx context.Context, op Operation, cfg RunConfig) (*Outcome, error) {
	if cfg.Concurrency < 1 {
		return nil, fmt.Errorf("loadgen: concurrency %d: want at least 1", cfg.Concurrency)
	}
	if cfg.Duration <= 0 && cfg.Requests <= 0 {
		return nil, errors.New("loadgen: give a duration or a request count")
	}
	// The end of the run stops new requests but lets those in flight
	// finish: a request cut off would be counted by the authority as a
	// failure the run caused, and not by the run.
	stop := ctx
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		stop, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}
	watch, err := watchIf(cfg.PID)
	if err != nil {
		return nil, err
	}
	tallies := make([]*tally, cfg.Concurrency)
	for w := range tallies {
		tallies[w] = &tally{errs: map[string]int64{}, first: map[string]string{}}
	}
	var next atomic.Int64
	var exhausted atomic.Bool
	start := time.Now()
	stopProgress := progress(cfg.Progress, start, tallies)
	var wg sync.WaitGroup
	for w := range cfg.Concurrency {
		t := tallies[w]
		wg.Go(func() {
			for stop.Err() == nil {
				seq := next.Add(1) - 1
				if cfg.Requests > 0 && seq >= cfg.Requests {
					return
				}
				t0 := time.Now()
				err := op.Do(ctx, w, seq)
				d := time.Since(t0)
				switch {
				case errors.Is(err, ErrExhausted):
					exhausted.Store(true)
					return
				case err == nil:
					t.lat = append(t.lat, d)
					t.ok.Add(1)
				case ctx.Err() != nil:
					// Interrupted (^C): not the authority's answer.
					return
				default:
					code := status.Code(err).String()
					t.errs[code]++
					if _, ok := t.first[code]; !ok {
						t.first[code] = err.Error()
					}
					t.failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	stopProgress()
	out := &Outcome{Errors: map[string]int64{}, FirstError: map[string]string{}, Elapsed: elapsed, Exhausted: exhausted.Load()}
	var lat []time.Duration
	for _, t := range tallies {
		lat = append(lat, t.lat...)
		out.OK += t.ok.Load()
		for code, n := range t.errs {
			out.Errors[code] += n
			out.Requests += n
			if _, ok := out.FirstError[code]; !ok {
				out.FirstError[code] = t.first[code]
			}
		}
	}
	out.Requests += out.OK
	out.Latency = summarize(lat)
	if elapsed > 0 {
		out.Throughput = float64(out.OK) / elapsed.Seconds()
	}
	if watch != nil {
		usage, err := watch.stop(elapsed)
		if err != nil {
			return nil, err
		}
		if out.OK > 0 {
			usage.CPUPerRequest = time.Duration(usage.CPUSeconds * float64(time.Second) / float64(out.OK))
		}
		out.Authority = usage
	}
	return out, nil
}

// progress prints a line a second to w until the returned function is
// called.
func progress(w io.Writer, start time.Time, tallies []*tally) func() {
	if w == nil {
		return func() {}
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		var last int64
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				var ok, failed int64
				for _, t := range tallies {
					ok += t.ok.Load()
					failed += t.failed.Load()
				}
				fmt.Fprintf(w, "bench: %4.0fs  %d ok  %d errors  %d/s\n", now.Sub(start).Seconds(), ok, failed, ok-last)
				last = ok
			}
		}
	}()
	return func() { close(done); <-stopped }
}

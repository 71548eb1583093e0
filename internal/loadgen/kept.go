package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// keptOp is an operation whose requests can each ride a connection
// opened, handshaken and readied before the clock starts (ConnKept).
type keptOp interface {
	// keptDial makes request seq's connection, not yet connected, as the
	// request needs it: from its source, presenting its certificate.
	keptDial(seq int64) (*grpc.ClientConn, error)
	// doOn sends request seq over conn.
	doOn(ctx context.Context, conn *grpc.ClientConn, seq int64) error
	// keptLimits are how many requests were prepared (-1: no limit) and
	// the most one batch may hold (0: no limit).
	keptLimits() (prepared int64, perBatch int)
}

// KeptRun is what a run over kept connections (RunKept) did besides its
// requests: its batches, and the authority's CPU for the untimed part.
type KeptRun struct {
	Batches int `json:"batches"`
	// BatchSize is the most requests (and connections) a batch held.
	BatchSize int `json:"batch_size"`
	// Connections is how many connections were made ready.
	Connections int64 `json:"connections"`
	// OpenElapsed is the wall time of the untimed parts: the batches'
	// connections opened and readied, and the settling after.
	OpenElapsed time.Duration `json:"open_elapsed_ns"`
	// OpenCPUSeconds is the authority's CPU during the untimed parts
	// (TLS handshakes, the connections' class, a health check each);
	// OpenCPUPerConnection is that per connection made ready.
	OpenCPUSeconds       float64       `json:"open_cpu_seconds,omitempty"`
	OpenCPUPerConnection time.Duration `json:"open_cpu_per_connection_ns,omitempty"`
	// CPUPerRequestError is the most the authority's CPU per request
	// can be off by: /proc counts user and system time each in whole
	// ticks of 10 ms, so each batch's reading is within 20 ms.
	CPUPerRequestError time.Duration `json:"cpu_per_request_error_ns,omitempty"`
}

// keptSettle is how long the bench waits after a batch's connections are
// ready before reading the authority's CPU: what the authority still does
// for them (a reply's last writes, a collection under way) lands before
// the timed part rather than in it.
var keptSettle = 50 * time.Millisecond

// RunKept drives op over kept connections, in batches: for each batch it
// opens one connection per request (cfg.Batch, fewer at the end of the
// run or of what was prepared) and readies each with a TLS handshake and
// a health check, untimed; then it reads the authority's CPU, sends every
// request of the batch over its own connection with cfg.Concurrency
// workers, reads the CPU again and closes the batch. The run's elapsed
// time, throughput and the authority's CPU per request are the timed
// parts' alone; KeptRun says what the untimed ones cost. With a
// duration, batches are started until it has passed (each runs whole).
func RunKept(ctx context.Context, op Operation, cfg RunConfig) (*Outcome, error) {
	k, ok := op.(keptOp)
	if !ok {
		return nil, errors.New("loadgen: this operation does not run over kept connections")
	}
	if cfg.Concurrency < 1 || cfg.Batch < 1 {
		return nil, fmt.Errorf("loadgen: concurrency %d, batch %d: want at least 1 each", cfg.Concurrency, cfg.Batch)
	}
	if cfg.Duration <= 0 && cfg.Requests <= 0 {
		return nil, errors.New("loadgen: give a duration or a request count")
	}
	watch, err := watchIf(cfg.PID)
	if err != nil {
		return nil, err
	}
	var cpu func() (float64, error)
	if cfg.PID > 0 {
		cpu = func() (float64, error) { return procCPU(cfg.PID) }
	}
	out, err := runKept(ctx, k, cfg, healthCheck, cpu)
	if watch != nil {
		usage, werr := watch.stop(out.Elapsed)
		if err == nil && werr != nil {
			err = werr
		}
		if out.Authority != nil && usage != nil {
			out.Authority.PeakRSSBytes = usage.PeakRSSBytes
		}
	}
	return out, err
}

// healthCheck readies a kept connection: its handshake, the authority's
// class for it and the first call's HTTP/2 set-up are done once a call
// has been answered, so the timed request is its second.
func healthCheck(ctx context.Context, conn *grpc.ClientConn) error {
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// batchLen is how many requests the batch starting at request next
// holds: batch, or fewer where the run's request count (0: none), what
// was prepared (-1: no limit) or one batch's limit (0: none) ends first.
func batchLen(next, requests, prepared int64, batch, perBatch int) int {
	n := int64(batch)
	if perBatch > 0 {
		n = min(n, int64(perBatch))
	}
	if requests > 0 {
		n = min(n, requests-next)
	}
	if prepared >= 0 {
		n = min(n, prepared-next)
	}
	return int(max(n, 0))
}

// batchCPU is the authority's CPU seconds during one batch's untimed
// opening and its timed requests.
type batchCPU struct{ open, timed float64 }

// keptCPU attributes a kept run's CPU: the timed parts' sum per
// successful request, the untimed parts' per connection made ready, and
// the most the first can be off by (each batch's timed reading is a
// difference of two /proc readings, each of two counts in whole ticks:
// within 2 ticks).
func keptCPU(batches []batchCPU, conns, ok int64) (timed, open float64, perRequest, perConn, maxError time.Duration) {
	for _, b := range batches {
		timed += b.timed
		open += b.open
	}
	if ok > 0 {
		perRequest = time.Duration(math.Round(timed * float64(time.Second) / float64(ok)))
		maxError = time.Duration(len(batches)) * 2 * time.Second / clockTicks / time.Duration(ok)
	}
	if conns > 0 {
		perConn = time.Duration(math.Round(open * float64(time.Second) / float64(conns)))
	}
	return timed, open, perRequest, perConn, maxError
}

// runKept is RunKept with the connection's readying call and the
// authority's CPU reading (nil: not on this machine) given.
func runKept(ctx context.Context, k keptOp, cfg RunConfig, ready func(context.Context, *grpc.ClientConn) error,
	cpu func() (float64, error)) (*Outcome, error) {
	prepared, perBatch := k.keptLimits()
	out := &Outcome{Errors: map[string]int64{}, FirstError: map[string]string{}}
	kept := &KeptRun{}
	t := &tally{errs: out.Errors, first: out.FirstError}
	var batches []batchCPU
	var mu sync.Mutex
	fail := func(prefix string, err error) {
		mu.Lock()
		defer mu.Unlock()
		code := status.Code(err).String()
		t.errs[code]++
		if _, ok := t.first[code]; !ok {
			t.first[code] = prefix + err.Error()
		}
		t.failed.Add(1)
	}
	var cpuErr error
	read := func() float64 {
		if cpu == nil || cpuErr != nil {
			return 0
		}
		v, err := cpu()
		if err != nil {
			cpuErr = fmt.Errorf("loadgen: the authority (pid %d) during the run: %w", cfg.PID, err)
		}
		return v
	}
	start := time.Now()
	var next int64
	for ctx.Err() == nil && (cfg.Duration <= 0 || time.Since(start) < cfg.Duration) {
		n := batchLen(next, cfg.Requests, prepared, cfg.Batch, perBatch)
		if n == 0 {
			out.Exhausted = prepared >= 0 && next >= prepared && (cfg.Requests <= 0 || next < cfg.Requests)
			break
		}
		kept.BatchSize = max(kept.BatchSize, n)
		var b batchCPU
		c0, o0 := read(), time.Now()
		conns := make([]*grpc.ClientConn, n)
		eachOf(n, cfg.Concurrency, func(i int) {
			conn, err := k.keptDial(next + int64(i))
			if err == nil {
				if err = ready(ctx, conn); err != nil {
					conn.Close()
				}
			}
			if err != nil {
				if ctx.Err() == nil {
					fail("readying a kept connection: ", err)
				}
				return
			}
			conns[i] = conn
		})
		time.Sleep(keptSettle)
		c1 := read()
		kept.OpenElapsed += time.Since(o0)
		t0 := time.Now()
		lat, answered := make([]time.Duration, n), make([]bool, n)
		eachOf(n, cfg.Concurrency, func(i int) {
			if conns[i] == nil {
				return
			}
			s := time.Now()
			err := k.doOn(ctx, conns[i], next+int64(i))
			switch {
			case err == nil:
				lat[i], answered[i] = time.Since(s), true
				t.ok.Add(1)
			case ctx.Err() != nil:
				// Interrupted (^C): not the authority's answer.
			default:
				fail("", err)
			}
		})
		out.Elapsed += time.Since(t0)
		c2 := read()
		for i, c := range conns {
			if c != nil {
				c.Close()
				kept.Connections++
			}
			if answered[i] {
				t.lat = append(t.lat, lat[i])
			}
		}
		b.open, b.timed = c1-c0, c2-c1
		batches = append(batches, b)
		kept.Batches++
		next += int64(n)
		if cfg.Progress != nil {
			line := fmt.Sprintf("bench: batch %d: %d connections readied, %d ok, %d errors in all", kept.Batches, n, t.ok.Load(), t.failed.Load())
			if cpu != nil {
				line += fmt.Sprintf("; the authority's CPU %.2f s readying, %.2f s for the requests", b.open, b.timed)
			}
			fmt.Fprintln(cfg.Progress, line)
		}
	}
	if cpuErr != nil {
		return out, cpuErr
	}
	out.OK = t.ok.Load()
	out.Requests = out.OK + t.failed.Load()
	out.Latency = summarize(t.lat)
	if out.Elapsed > 0 {
		out.Throughput = float64(out.OK) / out.Elapsed.Seconds()
	}
	out.Kept = kept
	if cpu != nil {
		timed, open, perReq, perConn, maxErr := keptCPU(batches, kept.Connections, out.OK)
		out.Authority = &ProcUsage{PID: cfg.PID, CPUSeconds: timed, CPUPerRequest: perReq}
		if out.Elapsed > 0 {
			out.Authority.Cores = timed / out.Elapsed.Seconds()
		}
		kept.OpenCPUSeconds, kept.OpenCPUPerConnection, kept.CPUPerRequestError = open, perConn, maxErr
	}
	return out, nil
}

// eachOf calls f(i) for every i < n from workers goroutines at most.
func eachOf(n, workers int, f func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				f(i)
			}
		})
	}
	wg.Wait()
}

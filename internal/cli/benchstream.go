package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/muster-dev/muster/internal/loadgen"
)

// streamBenchReport is muster bench --op stream's output.
type streamBenchReport struct {
	Op        string                 `json:"op"`
	Authority string                 `json:"authority"`
	Run       *loadgen.StreamOutcome `json:"run"`
}

func runStreamBench(ctx context.Context, env *Env, out output, st *loadgen.Streams, addr string, streams, tasks, pid int, hold time.Duration,
	pprof string, logf func(string, ...any)) error {
	if pid > 0 {
		// Each stream is one open file at the authority too.
		if limit, err := loadgen.ProcOpenFiles(pid); err == nil && limit != 0 && limit < uint64(streams)+64 {
			logf("warning: the authority (pid %d) may open %d files, fewer than %d streams need; raise its LimitNOFILE / ulimit -n", pid, limit, streams)
		}
	}
	logf("opening %d agent streams to %s, then %d task(s) to all of them", streams, addr, tasks)
	run, err := loadgen.RunStreams(ctx, st, loadgen.StreamConfig{Tasks: tasks, Progress: env.Stderr, PID: pid, Hold: hold, Pprof: pprof})
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	rep := streamBenchReport{Op: loadgen.OpStream, Authority: addr, Run: run}
	if out.structured() {
		return out.write(env.Stdout, rep)
	}
	printStreamBench(env.Stdout, rep)
	return nil
}

func printStreamBench(w io.Writer, r streamBenchReport) {
	run := r.Run
	fmt.Fprintf(w, "Operation:    stream (%d agent streams) against %s\n", run.Streams, r.Authority)
	fmt.Fprintf(w, "Opened:       %d in %s\n", run.Opened, run.OpenElapsed.Round(time.Millisecond))
	if run.Target == loadgen.TargetAll {
		fmt.Fprintln(w, "Target:       all (more streams than a task may name: every node in the store is queued the task)")
	}
	if m := run.Memory; m != nil && m.AfterBytes > 0 {
		fmt.Fprintf(w, "Memory:       RSS %.1f MiB before, %.1f MiB after: %.1f KiB a stream\n", float64(m.BeforeBytes)/(1<<20),
			float64(m.AfterBytes)/(1<<20), float64(m.PerStreamBytes)/1024)
	}
	if m := run.Memory; m != nil && m.StreamLive != nil {
		l := m.StreamLive
		fmt.Fprintf(w, "Live memory:  heap %.1f → %.1f MiB, stacks %.1f → %.1f MiB: %.1f KiB a stream\n",
			float64(l.HeapBeforeBytes)/(1<<20), float64(l.HeapAfterBytes)/(1<<20), float64(l.StackBeforeBytes)/(1<<20),
			float64(l.StackAfterBytes)/(1<<20), float64(l.PerStreamBytes)/1024)
		fmt.Fprintf(w, "Goroutines:   %d before the setup, %d → %d around the streams\n", l.GoroutinesBeforeSetup, l.GoroutinesBefore, l.GoroutinesAfter)
	}
	for i, f := range run.Tasks {
		fmt.Fprintf(w, "Task %d:       %s reached %d streams in %s (SendTask %s, queued for %d nodes)\n", i+1, f.TaskID, f.Delivered,
			f.All.Round(time.Millisecond), f.Send.Round(time.Millisecond), f.Queued)
	}
	l := run.Delivery
	fmt.Fprintf(w, "Delivery:     p50 %s  p95 %s  p99 %s  max %s\n", l.P50.Round(time.Microsecond), l.P95.Round(time.Microsecond),
		l.P99.Round(time.Microsecond), l.Max.Round(time.Microsecond))
	printErrors(w, run.Errors, run.FirstError)
	if a := run.Authority; a != nil {
		fmt.Fprintf(w, "Authority:    pid %d, %.2f CPU seconds during the fan-out, peak RSS %.1f MiB\n", a.PID, a.CPUSeconds,
			float64(a.PeakRSSBytes)/(1<<20))
	}
}

package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/loadgen"
)

// benchReport is muster bench's output, text or -o json.
type benchReport struct {
	Op          string           `json:"op"`
	Authority   string           `json:"authority"`
	Connection  string           `json:"connection"`
	Concurrency int              `json:"concurrency"`
	Run         *loadgen.Outcome `json:"run"`
	Bound       *loadgen.Bound   `json:"bound"`
	// CPUEfficiency is the bound's time per operation divided by the
	// authority's CPU time per request (from /proc): 1.0 would mean the
	// authority spends nothing beyond the crypto the server must do. Only
	// when the authority runs on this machine.
	CPUEfficiency float64 `json:"cpu_efficiency,omitempty"`
	// OfBound is the throughput divided by the bound's operations per
	// second on one core: 1.0 is one core's worth of the server's crypto
	// done every second (on a machine with more cores, more is possible).
	OfBound float64 `json:"of_bound"`
	// OfBoundWithoutHandshake is the same ratio with the bound's TLS
	// handshake left out (when it has one): the operation's own crypto
	// alone, as on a connection kept open.
	OfBoundWithoutHandshake float64 `json:"of_bound_without_handshake,omitempty"`
}

func newBenchCmd(env *Env) *cobra.Command {
	var af adminFlags
	var out output
	var op, conn string
	var concurrency, prepared, batch int
	var unlimited bool
	var duration, hold time.Duration
	var requests int64
	var pid int
	var authorityPprof string
	cmd := &cobra.Command{
		Use:   "bench --op OP",
		Short: "Drive a running authority with simulated agents and measure what it carries",
		Long: `Drive a running authority over its real protocol from many simulated agents,
and print throughput, latency percentiles (p50, p95, p99, max), errors by
gRPC code and, when the authority runs on this machine, its CPU time and
peak resident memory during the run (from /proc).

Operations (--op):
  token-join      ExchangeJoinToken, a node ID of its own per request
  psk-join        RequestCertificate with the bootstrap PSK
  renew           RequestCertificate over mTLS, one agent per worker renewing
                  generation after generation with a fresh key each time
  bound-recovery  the bound-keypair stream of a bot with no certificate
  bound-refresh   the bound-keypair stream of a bot presenting its valid
                  certificate: a refresh, which consumes nothing
  stream          --concurrency agents each hold an AgentService stream open
                  (as "muster agent run" does); --requests tasks (default 1)
                  are sent to all of them through SendTask, one after another,
                  each timed until every stream has it (past 1,024 streams,
                  the most a task may name, the task goes to all nodes).
                  Prints the authority's resident memory per stream (with
                  --authority-pprof its live heap and stacks too) and
                  the fan-out time (p50/p95/p99/max per agent); --hold
                  keeps the streams open, idle, that long afterwards, to
                  profile the authority while it holds them

A setup step first creates what the run needs through the admin API with the
operator identity (a join token, the PSK read as "muster psk show" reads it,
agents joined for renewals, bots for recoveries) and makes every key and CSR
before the clock starts. Nodes are named bench-RUNID-N; the run's join token
and bots are deleted at the end, its agents stay (muster agents list).

When the authority is on loopback, each simulated agent connects from its own
127.x.y.z address, as a fleet comes from many addresses; otherwise the
authority's per-source rate limit (20, then 5 a second) applies to joins.

The same run measures, on one core (one thread's CPU clock, best of five
rounds), the crypto the authority itself must do for the operation, primitive
by primitive: for a new connection the server's side of the TLS 1.3 handshake
(its key share, its key schedule, Finished MACs and transcript hash over
messages of a real agent handshake's sizes, its CertificateVerify signature,
and, when the agent presents its certificate, that certificate's check and the
check of the agent's CertificateVerify signature); then the operation's own
(join: the token or PSK secret check; recovery and refresh: the Ed25519
challenge answer verified and the join state signed; every op: the CSR
signature checked and the certificate signed). The record layer's symmetric
encryption is not counted. It prints cpu_efficiency, that bound divided by the
authority's CPU time per request, and the throughput as a fraction of the
bound's rate on one core (of_bound), with and without the handshake.
Joins and recoveries leave state in the authority: bench a test authority.

Connections (--connection):
  new     a TLS connection per request, as an agent makes one (the default);
          the bound counts the server's side of its handshake
  shared  one connection per simulated agent for the whole run (joins only:
          a connection presents one certificate, and a renewal must present
          the newest); its joins come from one source address per agent, so
          past the per-source burst they are refused ResourceExhausted
  kept    a request whose handshake is done (renew, token-join, psk-join):
          in batches of --batch, a connection per request is opened from the
          request's own source (presenting the renewing agent's newest
          certificate) and readied with a health check, untimed; then the
          authority's CPU is read, every request of the batch is sent over its
          own connection, the CPU is read again and the batch is closed. CPU a
          request is the batches' timed CPU over the successful requests (the
          untimed part is printed per connection), within 20 ms a batch (the
          /proc tick); the bound has no handshake. Renewals join --batch
          agents, each renewed once a batch, so a run may be any length; hold
          --batch connections open at both ends (open files, and about 50 KiB
          of authority memory each)`,
		Example: `  muster bench --data ./muster-data --op token-join --concurrency 32 --duration 10s
  muster bench --data ./muster-data --op renew --concurrency 8 --requests 2000 -o json
  muster bench --data ./muster-data --op psk-join --connection shared --requests 500
  muster bench --data ./muster-data --op renew --connection kept --batch 2000 --requests 10000 -o json
  muster bench --data ./muster-data --op stream --concurrency 1000 --requests 3
  muster bench --data ./muster-data --op stream --concurrency 2000 --requests 1 --hold 2m
  muster bench --data ./muster-data --op stream --concurrency 2000 --authority-pprof 127.0.0.1:6060`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			switch {
			case !validOp(op):
				return fmt.Errorf("bench: --op %q: want one of %s", op, strings.Join(loadgen.Operations, ", "))
			case concurrency < 1:
				return fmt.Errorf("bench: --concurrency %d: want at least 1", concurrency)
			case op == loadgen.OpStream && duration > 0:
				return errors.New("bench: --op stream sends --requests tasks (default 1), not for a --duration")
			case op != loadgen.OpStream && hold != 0:
				return errors.New("bench: --hold keeps agent streams open: it is for --op stream")
			case hold < 0:
				return fmt.Errorf("bench: --hold %s: want a positive duration", hold)
			case op != loadgen.OpStream && authorityPprof != "":
				return errors.New("bench: --authority-pprof reads the authority's memory around agent streams: it is for --op stream")
			case op == loadgen.OpStream && requests == 0:
				requests = 1
			}
			switch {
			case duration <= 0 && requests <= 0:
				return errors.New("bench: give --duration or --requests")
			case duration > 0 && requests > 0:
				return errors.New("bench: give --duration or --requests, not both")
			case requests < 0:
				return fmt.Errorf("bench: --requests %d: want a positive count", requests)
			}
			if requests > 0 {
				prepared = int(requests)
			}
			if unlimited && op != loadgen.OpTokenJoin {
				return fmt.Errorf("bench: --unlimited-token is for --op %s", loadgen.OpTokenJoin)
			}
			conn = firstOf(conn, loadgen.ConnNew)
			switch {
			case conn != loadgen.ConnKept && cmd.Flags().Changed("batch"):
				return fmt.Errorf("bench: --batch is for --connection %s", loadgen.ConnKept)
			case conn == loadgen.ConnKept && batch < 1:
				return fmt.Errorf("bench: --batch %d: want at least 1", batch)
			case conn == loadgen.ConnKept && requests > 0:
				batch = int(min(int64(batch), requests))
			case conn == loadgen.ConnKept && op != loadgen.OpRenew:
				// No batch longer than the joins prepared.
				batch = min(batch, prepared)
			}
			if conn == loadgen.ConnKept {
				// A connection per request of a batch, here and at the
				// authority.
				if limit, err := loadgen.RaiseFileLimit(); err == nil && limit < uint64(batch)+64 {
					return fmt.Errorf("bench: --batch %d holds as many connections open, and this process may open %d files (lower --batch or raise ulimit -n)", batch, limit)
				}
				if pid > 0 {
					if limit, err := loadgen.ProcOpenFiles(pid); err == nil && limit != 0 && limit < uint64(batch)+256 {
						return fmt.Errorf("bench: --batch %d holds as many connections open, and the authority (pid %d) may open %d files (lower --batch or raise its LimitNOFILE / ulimit -n)", batch, pid, limit)
					}
				}
			}
			if op == loadgen.OpStream {
				// One connection per stream, here and at the authority.
				if limit, err := loadgen.RaiseFileLimit(); err == nil && limit < uint64(concurrency)+64 {
					return fmt.Errorf("bench: %d streams need as many open files, and this process may open %d (raise ulimit -n)", concurrency, limit)
				}
			}
			data := datadir.Dir(firstOf(af.data, env.Getenv("MUSTER_DATA"), "muster-data"))
			addr := firstOf(af.authority, env.Getenv("MUSTER_AUTHORITY"))
			if addr == "" {
				rec, err := data.ReadAddress()
				if err != nil {
					return fmt.Errorf("bench: %w", err)
				}
				addr = rec.Address
				if pid == 0 {
					pid = lockHolder(data)
				}
			}
			idPath := firstOf(af.identity, env.Getenv("MUSTER_IDENTITY"), data.OperatorFile())
			operator, err := identity.Load(idPath)
			if err != nil {
				return fmt.Errorf("bench: %w (give an operator identity with --identity or MUSTER_IDENTITY)", err)
			}
			af.authority = addr
			admin, err := af.dial(env)
			if err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			defer admin.Close()
			ctx := cmd.Context()
			logf := func(format string, args ...any) { fmt.Fprintf(env.Stderr, "bench: "+format+"\n", args...) }
			if authorityPprof != "" {
				// Read once now, so a wrong address stops the bench
				// before thousands of agents are joined.
				setupCtx, cancel := af.context(ctx)
				_, err := loadgen.ReadLiveMemory(setupCtx, authorityPprof)
				cancel()
				if err != nil {
					return fmt.Errorf("bench: --authority-pprof: %w", err)
				}
			}
			// --timeout bounds a setup of a few calls; one that joins
			// thousands of agents (for streams, or a batch of kept
			// renewals) says how far it got every thousand instead, and
			// ^C ends it: on a loaded machine 3,000 joins outlast any
			// fixed bound.
			setupCtx, cancel := af.context(ctx)
			if op == loadgen.OpStream || (op == loadgen.OpRenew && conn == loadgen.ConnKept) {
				setupCtx, cancel = context.WithCancel(ctx)
			}
			p, err := loadgen.Prepare(setupCtx, loadgen.Setup{Op: op, Addr: addr, Connection: conn, Concurrency: concurrency,
				Prepared: prepared, Batch: batch, UnlimitedToken: unlimited, Operator: operator, Admin: admin, Log: logf, Pprof: authorityPprof})
			cancel()
			if err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			defer func() {
				cctx, cancel := af.context(context.WithoutCancel(ctx))
				defer cancel()
				if err := p.Close(cctx); err != nil {
					logf("cleaning up: %v", err)
				}
			}()
			if op == loadgen.OpStream {
				return runStreamBench(ctx, env, out, p.Streams, addr, concurrency, int(requests), pid, hold, authorityPprof, logf)
			}
			logf("measuring the crypto bound of %s", op)
			// Only a new connection's request pays a handshake.
			bound, err := loadgen.MeasureBound(op, conn == loadgen.ConnNew)
			if err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			logf("running %s against %s: concurrency %d, connection %s", op, addr, concurrency, conn)
			runCfg := loadgen.RunConfig{Concurrency: concurrency, Duration: duration, Requests: requests, Progress: env.Stderr, PID: pid}
			var run *loadgen.Outcome
			if conn == loadgen.ConnKept {
				runCfg.Batch = batch
				run, err = loadgen.RunKept(ctx, p.Operation, runCfg)
			} else {
				run, err = loadgen.Run(ctx, p, runCfg)
			}
			if err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			rep := benchReport{Op: op, Authority: addr, Connection: conn, Concurrency: concurrency,
				Run: run, Bound: bound, OfBound: run.Throughput / bound.PerCore}
			if a := run.Authority; a != nil && a.CPUPerRequest > 0 {
				rep.CPUEfficiency = bound.PerOp.Seconds() / a.CPUPerRequest.Seconds()
			}
			if per := bound.KeptConnection; per > 0 {
				rep.OfBoundWithoutHandshake = run.Throughput * per.Seconds()
			}
			if out.structured() {
				return out.write(env.Stdout, rep)
			}
			printBench(env.Stdout, rep)
			return nil
		},
	}
	af.register(cmd)
	out.register(cmd)
	cmd.AddCommand(newBenchSeedCmd(env))
	f := cmd.Flags()
	f.StringVar(&op, "op", "", "operation: "+strings.Join(loadgen.Operations, ", "))
	f.IntVar(&concurrency, "concurrency", 8, "simulated agents sending at once")
	f.DurationVar(&duration, "duration", 0, "how long to run (or --requests)")
	f.Int64Var(&requests, "requests", 0, "how many requests to send (or --duration)")
	f.StringVar(&conn, "connection", loadgen.ConnNew, "new: a TLS connection per request, as an agent makes; shared: one per simulated agent for the run (not for renew); kept: a connection per request opened and readied before the clock, in batches (renew, token-join, psk-join)")
	f.IntVar(&batch, "batch", 2000, "with --connection kept: connections opened and readied before each batch of requests (renewals join this many agents)")
	f.IntVar(&prepared, "prepare", 20000, "with --duration: join requests (nodes and CSRs) made before the run; the run ends early if they are used up")
	f.BoolVar(&unlimited, "unlimited-token", false, "with --op token-join: join with one token of unlimited uses (valid for an hour) instead of one of as many uses as requests prepared")
	f.DurationVar(&hold, "hold", 0, "with --op stream: keep the streams open, idle, this long after the last task (to profile the authority while it holds them)")
	f.StringVar(&authorityPprof, "authority-pprof", "", "with --op stream: the authority's --pprof-listen address (loopback HOST:PORT), to read its live heap and stacks before and after the streams open")
	f.IntVar(&pid, "authority-pid", 0, "the authority's process on this machine, for its CPU and memory (default: the pid in DIR/authority.lock when the address comes from DIR)")
	return cmd
}

func validOp(op string) bool {
	for _, o := range loadgen.Operations {
		if o == op {
			return true
		}
	}
	return false
}

// lockHolder is the pid the running authority wrote to DIR/authority.lock,
// or 0 when there is none this machine runs.
func lockHolder(d datadir.Dir) int {
	pid := d.LockHolder()
	if pid <= 0 {
		return 0
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d/stat", pid)); err != nil {
		return 0
	}
	return pid
}

func printBench(w io.Writer, r benchReport) {
	run := r.Run
	fmt.Fprintf(w, "Operation:    %s (%s connection, concurrency %d) against %s\n", r.Op, r.Connection, r.Concurrency, r.Authority)
	fmt.Fprintf(w, "Requests:     %d in %s, %d ok", run.Requests, run.Elapsed.Round(time.Millisecond), run.OK)
	if run.Exhausted {
		fmt.Fprint(w, " (stopped: the prepared requests were used up; raise --prepare)")
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Throughput:   %.1f/s\n", run.Throughput)
	l := run.Latency
	fmt.Fprintf(w, "Latency:      p50 %s  p95 %s  p99 %s  max %s\n", l.P50.Round(time.Microsecond), l.P95.Round(time.Microsecond),
		l.P99.Round(time.Microsecond), l.Max.Round(time.Microsecond))
	printErrors(w, run.Errors, run.FirstError)
	if a := run.Authority; a != nil {
		fmt.Fprintf(w, "Authority:    pid %d, %.2f CPU seconds (%.2f cores, %s a request), peak RSS %.1f MiB\n", a.PID, a.CPUSeconds, a.Cores,
			a.CPUPerRequest.Round(time.Microsecond), float64(a.PeakRSSBytes)/(1<<20))
	} else {
		// Said, not left out: a reader comparing runs would otherwise
		// take a missing cpu_efficiency for a run without a bound.
		fmt.Fprintln(w, "Authority:    not measured: its CPU and cpu_efficiency need its process on this machine (give --authority-pid PID, or run without --authority so the pid comes from DIR/authority.lock)")
	}
	if k := run.Kept; k != nil {
		fmt.Fprintf(w, "Kept:         %d batches of up to %d connections, each opened and readied (handshake, health check) before the clock in %s\n",
			k.Batches, k.BatchSize, k.OpenElapsed.Round(time.Millisecond))
		if run.Authority != nil {
			fmt.Fprintf(w, "              the authority's CPU a request within ±%s (/proc's tick); untimed, %.2f CPU seconds, %s a connection\n",
				k.CPUPerRequestError.Round(time.Microsecond), k.OpenCPUSeconds, k.OpenCPUPerConnection.Round(time.Microsecond))
		}
	}
	fmt.Fprintf(w, "Crypto bound: %s per operation at the server, one core (%.0f/s):\n", r.Bound.PerOp.Round(time.Microsecond), r.Bound.PerCore)
	for _, p := range r.Bound.Parts {
		fmt.Fprintf(w, "              %9s  %s\n", p.PerOp.Round(time.Microsecond), p.What)
	}
	if r.Bound.KeptConnection > 0 {
		fmt.Fprintf(w, "              %9s  without the handshake (on a kept connection)\n", r.Bound.KeptConnection.Round(time.Microsecond))
	}
	if r.CPUEfficiency > 0 {
		fmt.Fprintf(w, "CPU efficiency: %.2f (the bound %s / the authority's CPU a request %s)\n", r.CPUEfficiency,
			r.Bound.PerOp.Round(time.Microsecond), r.Run.Authority.CPUPerRequest.Round(time.Microsecond))
	}
	fmt.Fprintf(w, "Of the bound: %.2f", r.OfBound)
	if r.OfBoundWithoutHandshake > 0 {
		fmt.Fprintf(w, " (%.2f without the handshake)", r.OfBoundWithoutHandshake)
	}
	fmt.Fprintln(w)
}

// printErrors prints a run's errors by gRPC code with the first message.
func printErrors(w io.Writer, errs map[string]int64, first map[string]string) {
	if len(errs) == 0 {
		fmt.Fprintln(w, "Errors:       none")
		return
	}
	fmt.Fprintln(w, "Errors:")
	for code, n := range errs {
		fmt.Fprintf(w, "  %-16s %d  (first: %s)\n", code, n, first[code])
	}
}

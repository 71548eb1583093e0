package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/task"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// Streams are N joined agents, each of which holds one AgentService
// stream open as muster agent run does, and the tasks sent to all of
// them: what the authority's memory per stream and the fan-out of one
// signed task are measured on.
type Streams struct {
	t      *target
	admin  musterv1.AdminServiceClient
	agents []*identity.Identity
	nodes  []string
	// goroutines is the authority's goroutine count before the joins,
	// with Setup.Pprof (otherwise 0).
	goroutines int
}

// setupParallel is how many joins the stream setup makes at once.
const setupParallel = 16

func prepareStreams(ctx context.Context, s Setup, t *target) (*Prepared, error) {
	n := s.Concurrency
	s.Log("setup: joining %d agents to hold streams, %d keys and CSRs", n, min(n, csrPool))
	// Agents may share a key: the authority names a certificate by its
	// node, and a stream is authorised by the certificate it presents.
	csrs, err := makeCSRs(min(n, csrPool), nil)
	if err != nil {
		return nil, err
	}
	st := &Streams{t: t, admin: s.Admin, agents: make([]*identity.Identity, n), nodes: make([]string, n)}
	if s.Pprof != "" {
		// After Prepare's first admin call: the admin connection's
		// goroutines are there before the joins and after them.
		if st.goroutines, err = ReadGoroutines(ctx, s.Pprof); err != nil {
			return nil, err
		}
	}
	secret, id, err := createToken(ctx, s, t, int64(n))
	if err != nil {
		return nil, err
	}
	defer deleteToken(s, id)(ctx)
	if err := joinAll(ctx, s, n, setupParallel, func(i int) error {
		return st.join(ctx, secret, i, csrs[i%len(csrs)])
	}); err != nil {
		return nil, err
	}
	return &Prepared{Streams: st}, nil
}

// joinAll runs join for agents 0..n-1, parallel at once, and returns the
// first errors (each worker stops at its first) or ctx's, logging every
// thousandth agent joined.
func joinAll(ctx context.Context, s Setup, n, parallel int, join func(i int) error) error {
	var next atomic.Int64
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range min(max(parallel, 1), n) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := join(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				if done := i + 1; done%1000 == 0 {
					s.Log("setup: %d of %d agents joined", done, n)
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(append(errs, ctx.Err())...)
}

func (st *Streams) join(ctx context.Context, token string, i int, k keyCSR) error {
	st.nodes[i] = fmt.Sprintf("%s-%d", st.t.run, i)
	conn, err := st.t.dial(int64(i), nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	resp, err := musterv1.NewBootstrapServiceClient(conn).ExchangeJoinToken(ctx, &musterv1.ExchangeJoinTokenRequest{
		JoinToken: token, NodeId: st.nodes[i], Csr: k.csr})
	if err != nil {
		return fmt.Errorf("loadgen: join agent %d to hold a stream: %w", i, err)
	}
	st.agents[i], err = st.t.identity(resp.GetCertificateChainPem(), k.key)
	return err
}

// taskWait bounds how long a task may take to reach every stream.
const taskWait = 2 * time.Minute

// StreamConfig says how many tasks to send to the open streams.
type StreamConfig struct {
	// Tasks is how many tasks are sent, one after another, each to every
	// stream.
	Tasks int
	// Progress, if set, gets a line as the streams open and as each task
	// reaches them.
	Progress io.Writer
	// PID, if not zero, is the authority's process on this machine: its
	// resident memory before and after the streams open.
	PID int
	// Hold, if positive, keeps the streams open this long after the last
	// task's fan-out, idle, so the authority can be profiled while it
	// holds them (its heap and goroutines through --pprof-listen).
	Hold time.Duration
	// Pprof, if set, is the authority's --pprof-listen address: its live
	// heap and stacks are read there before and after the streams open.
	Pprof string
}

// StreamOutcome is what a stream run measured.
type StreamOutcome struct {
	Streams int `json:"streams"`
	// Opened is how many streams received the authority's first message
	// (its verifier set) after their first heartbeat.
	Opened int `json:"opened"`
	// OpenElapsed is the time the streams took to open, all of them
	// together (TLS handshakes with client certificates and the first
	// message; not part of the fan-out).
	OpenElapsed time.Duration `json:"open_elapsed_ns"`
	// Target is how the tasks were addressed: "node_ids" (the run's
	// agents by name) or, past the most node IDs a task may name, "all"
	// (every node in the store, streams or not).
	Target     string            `json:"target"`
	Errors     map[string]int64  `json:"errors"`
	FirstError map[string]string `json:"first_error,omitempty"`
	// Memory is the authority's resident memory before and after the
	// streams opened, and the difference divided by the streams opened.
	Memory *StreamMemory `json:"memory,omitempty"`
	// Tasks is each task's fan-out.
	Tasks []FanOut `json:"tasks"`
	// Delivery is the time from SendTask to a stream's receipt of the
	// task, over every stream and task.
	Delivery Latency `json:"delivery"`
	// Authority is the authority's CPU and peak memory over the fan-out.
	Authority *ProcUsage `json:"authority,omitempty"`
}

// StreamMemory is the authority's resident memory around the opening of
// the streams (zero when its process is not known), and with
// StreamConfig.Pprof its live memory too.
type StreamMemory struct {
	BeforeBytes    int64 `json:"rss_before_bytes"`
	AfterBytes     int64 `json:"rss_after_bytes"`
	PerStreamBytes int64 `json:"rss_per_stream_bytes"`
	*StreamLive
}

// StreamLive is the authority's live memory around the opening of the
// streams: the heap after a forced collection and the goroutine stacks in
// use. The resident set also holds what the runtime has freed but not yet
// returned to the system, and so moves with the collector's timing; this
// is what the streams themselves hold.
type StreamLive struct {
	HeapBeforeBytes  int64 `json:"live_heap_before_bytes"`
	HeapAfterBytes   int64 `json:"live_heap_after_bytes"`
	StackBeforeBytes int64 `json:"stack_before_bytes"`
	StackAfterBytes  int64 `json:"stack_after_bytes"`
	// PerStreamBytes is the growth of heap and stacks together, divided
	// by the streams opened.
	PerStreamBytes int64 `json:"live_per_stream_bytes"`
	// GoroutinesBeforeSetup is the authority's goroutine count before
	// the setup's joins; GoroutinesBefore and GoroutinesAfter are its
	// counts at the two readings. The first reading waits (up to
	// setupGone) for the count to fall back to GoroutinesBeforeSetup:
	// until the authority has seen a join's connection close, the
	// connection's goroutines (its transport's reader, writer and
	// keepalive), their stacks and what they hold would be counted as
	// there before the streams, and freed by the second reading.
	GoroutinesBeforeSetup int `json:"goroutines_before_setup"`
	GoroutinesBefore      int `json:"goroutines_before"`
	GoroutinesAfter       int `json:"goroutines_after"`
}

// FanOut is one task sent to every stream.
type FanOut struct {
	TaskID string `json:"task_id"`
	// Send is the SendTask call's own latency (signing, queueing for
	// every node, audit).
	Send time.Duration `json:"send_ns"`
	// All is the time from the call to the last stream's receipt.
	All time.Duration `json:"all_ns"`
	// Queued is how many nodes the task was queued for; Delivered how
	// many of the run's streams received it.
	Queued    int `json:"queued"`
	Delivered int `json:"delivered"`
}

// How a stream run's tasks are addressed.
const (
	TargetNodes = "node_ids"
	TargetAll   = "all"
)

// settle is how long the authority is left after the streams open before
// its memory is read, so the connections' first allocations are done.
const settle = time.Second

// setupGone bounds how long RunStreams waits for the setup's join
// connections to be gone at the authority before it reads its memory.
const setupGone = 30 * time.Second

// waitSetupGone reads the authority's goroutine count every 50 ms until
// it is no more than base (its count before the setup's joins), and
// returns the last count read: base or less, or more if within passed
// first (the authority may serve other clients too). Each join closes
// its connection once it has its answer, but the authority's side of it
// (three goroutines and the connection's buffers) ends only when the
// authority has read the close, later on a loaded machine.
func waitSetupGone(ctx context.Context, addr string, base int, within time.Duration) (int, error) {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		n, err := ReadGoroutines(ctx, addr)
		if err != nil || n <= base {
			return n, err
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			return n, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// RunStreams opens every agent's stream, reads the authority's memory
// before and after, then sends cfg.Tasks tasks to all of them one after
// another, each timed until every stream has it.
//
// A task that has not reached every stream within taskWait is reported
// DeadlineExceeded.
func RunStreams(ctx context.Context, st *Streams, cfg StreamConfig) (*StreamOutcome, error) {
	if cfg.Tasks < 1 {
		return nil, fmt.Errorf("loadgen: tasks %d: want at least 1", cfg.Tasks)
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	n := len(st.agents)
	out := &StreamOutcome{Streams: n, Target: TargetNodes, Errors: map[string]int64{}, FirstError: map[string]string{}}
	if n > task.MaxNodeIDs {
		out.Target = TargetAll
	}
	var mu sync.Mutex
	fail := func(err error) {
		code := status.Code(err).String()
		mu.Lock()
		defer mu.Unlock()
		out.Errors[code]++
		if _, ok := out.FirstError[code]; !ok {
			out.FirstError[code] = err.Error()
		}
	}
	var live *StreamLive
	if cfg.Pprof != "" {
		live = &StreamLive{GoroutinesBeforeSetup: st.goroutines}
		// Without a count before the setup (Setup.Pprof not given)
		// there is nothing to wait for.
		within := setupGone
		if st.goroutines == 0 {
			within = 0
		}
		gone, err := waitSetupGone(ctx, cfg.Pprof, st.goroutines, within)
		if err != nil {
			return nil, err
		}
		if live.GoroutinesBefore = gone; gone > st.goroutines && st.goroutines > 0 {
			fmt.Fprintf(cfg.Progress, "bench: warning: the authority still runs %d goroutines %s after the setup, %d before it: "+
				"the memory read before the streams may count some of the setup's connections, or those of another client that connected meanwhile\n",
				gone, setupGone, st.goroutines)
		}
	}
	if cfg.PID > 0 {
		before, err := procRSS(cfg.PID)
		if err != nil {
			return nil, err
		}
		out.Memory = &StreamMemory{BeforeBytes: before}
	}
	if live != nil {
		m, err := ReadLiveMemory(ctx, cfg.Pprof)
		if err != nil {
			return nil, err
		}
		if out.Memory == nil {
			out.Memory = &StreamMemory{}
		}
		live.HeapBeforeBytes, live.StackBeforeBytes = m.HeapAlloc, m.Stack
		out.Memory.StreamLive = live
	}

	// Every stream's receipt of task k, as the time since its SendTask.
	deliveries := make([][]time.Duration, cfg.Tasks)
	for k := range deliveries {
		deliveries[k] = make([]time.Duration, n)
	}
	var (
		current  atomic.Pointer[pending]
		opened   sync.WaitGroup
		streams  sync.WaitGroup
		nOpened  atomic.Int64
		streamCx context.Context
	)
	streamCx, stopStreams := context.WithCancel(ctx)
	defer func() { stopStreams(); streams.Wait() }()
	start := time.Now()
	opened.Add(n)
	// Streams open a few at a time: each is a TLS handshake with a
	// client certificate, and the authority's accept queue is finite.
	gate := make(chan struct{}, 64)
	for i := range n {
		streams.Go(func() {
			gate <- struct{}{}
			err := st.hold(streamCx, i, func(ok bool) {
				if ok {
					nOpened.Add(1)
				}
				opened.Done()
				<-gate
			}, func(raw []byte, at time.Time) {
				p := current.Load()
				if p == nil {
					return
				}
				env, err := task.Decode(raw)
				if err != nil {
					return
				}
				p.received(receipt{stream: i, task: env.TaskID, at: at}, deliveries[p.k])
			})
			if err != nil && streamCx.Err() == nil {
				fail(err)
			}
		})
	}
	waitOpen := make(chan struct{})
	go func() { opened.Wait(); close(waitOpen) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for open := false; !open; {
		select {
		case <-waitOpen:
			open = true
		case <-tick.C:
			fmt.Fprintf(cfg.Progress, "bench: %4.0fs  %d of %d streams open\n", time.Since(start).Seconds(), nOpened.Load(), n)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	out.OpenElapsed = time.Since(start)
	out.Opened = int(nOpened.Load())
	if out.Opened == 0 {
		return out, nil
	}
	if out.Memory != nil {
		time.Sleep(settle)
	}
	if cfg.PID > 0 {
		after, err := procRSS(cfg.PID)
		if err != nil {
			return nil, err
		}
		out.Memory.AfterBytes = after
		out.Memory.PerStreamBytes = (after - out.Memory.BeforeBytes) / int64(out.Opened)
	}
	// Read after the resident set: the forced collection may start
	// returning memory to the system.
	if cfg.Pprof != "" {
		l := out.Memory.StreamLive
		live, err := ReadLiveMemory(ctx, cfg.Pprof)
		if err != nil {
			return nil, err
		}
		l.HeapAfterBytes, l.StackAfterBytes = live.HeapAlloc, live.Stack
		if l.GoroutinesAfter, err = ReadGoroutines(ctx, cfg.Pprof); err != nil {
			return nil, err
		}
		l.PerStreamBytes = (l.HeapAfterBytes - l.HeapBeforeBytes + l.StackAfterBytes - l.StackBeforeBytes) / int64(out.Opened)
	}
	fmt.Fprintf(cfg.Progress, "bench: %d streams open in %s\n", out.Opened, out.OpenElapsed.Round(time.Millisecond))

	watch, err := watchIf(cfg.PID)
	if err != nil {
		return nil, err
	}
	fanStart := time.Now()
	var all []time.Duration
	for k := range cfg.Tasks {
		p := &pending{k: k, all: make(chan struct{}), start: time.Now(), left: out.Opened}
		current.Store(p)
		req := &musterv1.SendTaskRequest{TaskType: task.TypeReport, Expires: durationpb.New(10 * time.Minute)}
		if out.Target == TargetAll {
			req.All = true
		} else {
			req.NodeIds = st.nodes
		}
		resp, err := st.admin.SendTask(ctx, req)
		f := FanOut{Send: time.Since(p.start), Queued: int(resp.GetNodeCount())}
		if err != nil {
			return nil, fmt.Errorf("loadgen: send task %d: %w", k, err)
		}
		f.TaskID = resp.GetTaskId()
		p.known(f.TaskID, deliveries[k])
		timer := time.NewTimer(taskWait)
		select {
		case <-p.all:
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		}
		timer.Stop()
		f.All = time.Since(p.start)
		p.mu.Lock()
		got := slices.Clone(deliveries[k])
		p.mu.Unlock()
		for _, d := range got {
			if d > 0 {
				f.Delivered++
				all = append(all, d)
			}
		}
		if f.Delivered < out.Opened {
			fail(status.Errorf(codes.DeadlineExceeded, "task %s reached %d of %d streams within %s", f.TaskID, f.Delivered, out.Opened, taskWait))
		} else {
			f.All = slices.Max(got)
		}
		fmt.Fprintf(cfg.Progress, "bench: task %d reached %d of %d streams in %s\n", k+1, f.Delivered, out.Opened, f.All.Round(time.Millisecond))
		out.Tasks = append(out.Tasks, f)
	}
	out.Delivery = summarize(all)
	if watch != nil {
		usage, err := watch.stop(time.Since(fanStart))
		if err != nil {
			return nil, err
		}
		out.Authority = usage
	}
	if out.Opened < n {
		fail(fmt.Errorf("%d of %d streams did not open", n-out.Opened, n))
	}
	if cfg.Hold > 0 {
		fmt.Fprintf(cfg.Progress, "bench: holding %d streams open for %s\n", out.Opened, cfg.Hold)
		select {
		case <-time.After(cfg.Hold):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return out, nil
}

// pending is the task being fanned out. A stream may receive it before
// SendTask has answered with its ID: such receipts wait in early.
type pending struct {
	k     int
	start time.Time
	all   chan struct{}

	mu    sync.Mutex
	id    string
	early []receipt
	left  int
}

type receipt struct {
	stream int
	task   string
	at     time.Time
}

// received records a stream's receipt of a task, counted if it is this one.
func (p *pending) received(r receipt, into []time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.id == "" {
		p.early = append(p.early, r)
		return
	}
	p.count(r, into)
}

// known sets the task's ID and counts the receipts that came before it.
func (p *pending) known(id string, into []time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.id = id
	for _, r := range p.early {
		p.count(r, into)
	}
	p.early = nil
}

func (p *pending) count(r receipt, into []time.Duration) {
	if r.task != p.id || into[r.stream] > 0 {
		return
	}
	into[r.stream] = r.at.Sub(p.start)
	if p.left--; p.left == 0 {
		close(p.all)
	}
}

// hold opens agent i's stream as muster agent run does (its certificate,
// a heartbeat first) and reads it until ctx ends: opened is called once,
// with true at the authority's first message or false if the stream ended
// before it (so a stream that never opened is not counted as open); got at
// every task.
func (st *Streams) hold(ctx context.Context, i int, opened func(ok bool), got func(raw []byte, at time.Time)) error {
	var once sync.Once
	defer once.Do(func() { opened(false) })
	// Small buffers: ten thousand streams in this process would otherwise
	// hold 64 KiB each on this side for nothing.
	conn, err := st.t.dial(int64(i), st.agents[i], grpc.WithReadBufferSize(4096), grpc.WithWriteBufferSize(4096))
	if err != nil {
		return err
	}
	defer conn.Close()
	stream, err := musterv1.NewAgentServiceClient(conn).Connect(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&musterv1.AgentMessage{Body: &musterv1.AgentMessage_Heartbeat{Heartbeat: &musterv1.Heartbeat{}}}); err != nil {
		return err
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		at := time.Now()
		once.Do(func() { opened(true) })
		if raw := m.GetTask(); raw != nil {
			got(raw, at)
		}
	}
}

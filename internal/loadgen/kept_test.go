package loadgen

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

func TestBatchLen(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		next, requests, prepare int64
		batch, perBatch, want   int
	}{
		{"a whole batch", 0, 10000, -1, 2000, 0, 2000},
		{"the run's last requests", 8000, 9000, -1, 2000, 0, 1000},
		{"the run's requests sent", 9000, 9000, -1, 2000, 0, 0},
		{"a duration: no request count", 4000, 0, -1, 2000, 0, 2000},
		{"the joins prepared end first", 1500, 0, 2000, 1000, 0, 500},
		{"the joins prepared used up", 2000, 0, 2000, 1000, 0, 0},
		{"prepared and requested alike", 0, 40, 40, 2000, 0, 40},
		{"renewals: one a batch per agent", 0, 0, -1, 2000, 300, 300},
		{"renewals: the last, fewer than the agents", 600, 700, -1, 2000, 300, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := batchLen(tc.next, tc.requests, tc.prepare, tc.batch, tc.perBatch); got != tc.want {
				t.Errorf("batchLen(%d, %d, %d, %d, %d) = %d; want %d", tc.next, tc.requests, tc.prepare, tc.batch, tc.perBatch, got, tc.want)
			}
		})
	}
}

func TestKeptCPU(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		batches                   []batchCPU
		conns, ok                 int64
		timed, open               float64
		perReq, perConn, maxError time.Duration
	}{
		{"two batches of 1000", []batchCPU{{open: 2.5, timed: 1.2}, {open: 2.7, timed: 1.3}}, 2000, 2000,
			2.5, 5.2, 1250 * time.Microsecond, 2600 * time.Microsecond, 20 * time.Microsecond},
		// Failed requests are not in the count: their CPU is the
		// successful ones'.
		{"some refused", []batchCPU{{open: 1, timed: 1}}, 1000, 500, 1, 1, 2 * time.Millisecond, time.Millisecond, 40 * time.Microsecond},
		{"nothing answered", []batchCPU{{open: 0.5, timed: 0.01}}, 10, 0, 0.01, 0.5, 0, 50 * time.Millisecond, 0},
		{"no batch", nil, 0, 0, 0, 0, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			timed, open, perReq, perConn, maxErr := keptCPU(tc.batches, tc.conns, tc.ok)
			if !near(timed, tc.timed) || !near(open, tc.open) || perReq != tc.perReq || perConn != tc.perConn || maxErr != tc.maxError {
				t.Errorf("keptCPU = %v s, %v s, %s, %s, ±%s; want %v s, %v s, %s, %s, ±%s", timed, open, perReq, perConn, maxErr,
					tc.timed, tc.open, tc.perReq, tc.perConn, tc.maxError)
			}
		})
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

func TestKeptAgentAndKey(t *testing.T) {
	for _, tc := range []struct {
		seq        int64
		n          int
		agent, key int
		round      int64
	}{
		{0, 300, 0, 0, 0},
		{299, 300, 299, 43, 0}, // 299 mod 256
		{300, 300, 0, 1, 1},
		{301, 300, 1, 2, 1},
		{256 * 5, 256, 0, 5, 5},
		{256*5 + 1, 256, 1, 6, 5},
	} {
		agent, round := keptAgent(tc.seq, tc.n)
		if agent != tc.agent || round != tc.round || keptKey(agent, round) != tc.key {
			t.Errorf("request %d of %d agents: agent %d, round %d, key %d; want %d, %d, %d", tc.seq, tc.n, agent, round,
				keptKey(agent, round), tc.agent, tc.round, tc.key)
		}
	}
	// Whatever the agents' count, one round to the next an agent asks
	// for another key.
	for _, n := range []int{1, 7, 256, 512, 2000} {
		for seq := int64(0); seq < int64(3*n); seq++ {
			i, round := keptAgent(seq, n)
			if round > 0 && keptKey(i, round) == keptKey(i, round-1) {
				t.Fatalf("%d agents: agent %d renews with key %d in rounds %d and %d", n, i, keptKey(i, round), round-1, round)
			}
		}
	}
}

// fakeKept counts the CPU an authority would spend: readying a
// connection costs 10 ms, a request 20 ms; requests in refuse are refused.
type fakeKept struct {
	prepared int64
	perBatch int
	refuse   func(seq int64) bool
	cpuUs    atomic.Int64

	mu sync.Mutex
	// batches are the request numbers sent together (between readings).
	batches [][]int64
	cur     []int64
	reads   int
}

func (f *fakeKept) keptDial(int64) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///fake", grpc.WithTransportCredentials(insecure.NewCredentials()))
}

func (f *fakeKept) doOn(_ context.Context, _ *grpc.ClientConn, seq int64) error {
	f.mu.Lock()
	f.cur = append(f.cur, seq)
	f.mu.Unlock()
	if f.refuse != nil && f.refuse(seq) {
		return status.Error(codes.PermissionDenied, "refused")
	}
	f.cpuUs.Add(20000)
	return nil
}

func (f *fakeKept) Do(context.Context, int, int64) error {
	return errors.New("not over a kept connection")
}

func (f *fakeKept) keptLimits() (int64, int) { return f.prepared, f.perBatch }

func (f *fakeKept) ready(context.Context, *grpc.ClientConn) error {
	f.cpuUs.Add(10000)
	return nil
}

func (f *fakeKept) cpu() (float64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	// Every third reading closes a batch's timed part.
	if f.reads++; f.reads%3 == 0 {
		f.batches, f.cur = append(f.batches, f.cur), nil
	}
	return float64(f.cpuUs.Load()) / 1e6, nil
}

// noSettle makes RunKept's wait after readying a batch none for t.
func noSettle(t *testing.T) {
	old := keptSettle
	keptSettle = 0
	t.Cleanup(func() { keptSettle = old })
}

func TestRunKept(t *testing.T) {
	noSettle(t)
	for _, tc := range []struct {
		name        string
		op          *fakeKept
		cfg         RunConfig
		sizes       []int
		ok, refused int64
		exhausted   bool
	}{
		{"requests in batches", &fakeKept{prepared: -1}, RunConfig{Concurrency: 3, Batch: 4, Requests: 10}, []int{4, 4, 2}, 10, 0, false},
		{"renewals: a batch per agents' round", &fakeKept{prepared: -1, perBatch: 3}, RunConfig{Concurrency: 2, Batch: 5, Requests: 7},
			[]int{3, 3, 1}, 7, 0, false},
		{"joins until the prepared are used", &fakeKept{prepared: 5}, RunConfig{Concurrency: 4, Batch: 2, Duration: time.Minute},
			[]int{2, 2, 1}, 5, 0, true},
		{"refusals counted apart", &fakeKept{prepared: -1, refuse: func(seq int64) bool { return seq%4 == 0 }},
			RunConfig{Concurrency: 2, Batch: 8, Requests: 16}, []int{8, 8}, 12, 4, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runKept(context.Background(), tc.op, tc.cfg, tc.op.ready, tc.op.cpu)
			if err != nil {
				t.Fatal(err)
			}
			var sizes []int
			seen := map[int64]bool{}
			for _, b := range tc.op.batches {
				sizes = append(sizes, len(b))
				agents := map[int]bool{}
				for _, seq := range b {
					if seen[seq] {
						t.Errorf("request %d sent twice", seq)
					}
					seen[seq] = true
					if tc.op.perBatch > 0 {
						i, _ := keptAgent(seq, tc.op.perBatch)
						if agents[i] {
							t.Errorf("batch %v: agent %d twice", b, i)
						}
						agents[i] = true
					}
				}
			}
			if !slices.Equal(sizes, tc.sizes) || out.Kept.Batches != len(tc.sizes) {
				t.Errorf("batches of %v (%d counted); want %v", sizes, out.Kept.Batches, tc.sizes)
			}
			if out.OK != tc.ok || out.Requests != tc.ok+tc.refused || out.Errors["PermissionDenied"] != tc.refused || out.Exhausted != tc.exhausted {
				t.Errorf("ok %d, requests %d, errors %v, exhausted %v; want %d ok, %d refused, exhausted %v", out.OK, out.Requests,
					out.Errors, out.Exhausted, tc.ok, tc.refused, tc.exhausted)
			}
			conns := tc.ok + tc.refused
			// Each request's 20 ms is in the timed readings (the refused
			// ones' 0), each connection's 10 ms in the untimed ones.
			a, k := out.Authority, out.Kept
			if a == nil || !near(a.CPUSeconds, float64(tc.ok)*0.02) || a.CPUPerRequest != 20*time.Millisecond {
				t.Fatalf("authority %+v: want %d × 20 ms, 20 ms a request", a, tc.ok)
			}
			if k.Connections != conns || !near(k.OpenCPUSeconds, float64(conns)*0.01) || k.OpenCPUPerConnection != 10*time.Millisecond {
				t.Errorf("kept %+v: want %d connections of 10 ms each", k, conns)
			}
			if want := time.Duration(len(tc.sizes)) * 20 * time.Millisecond / time.Duration(tc.ok); k.CPUPerRequestError != want {
				t.Errorf("error bound %s; want %s (20 ms a batch over %d)", k.CPUPerRequestError, want, tc.ok)
			}
			if out.Latency.Max <= 0 || out.Throughput <= 0 || out.Elapsed <= 0 {
				t.Errorf("latency %+v, throughput %v, elapsed %s: want them measured", out.Latency, out.Throughput, out.Elapsed)
			}
		})
	}
}

func TestRunKeptReadyFails(t *testing.T) {
	noSettle(t)
	op := &fakeKept{prepared: -1}
	n := 0
	var mu sync.Mutex
	ready := func(context.Context, *grpc.ClientConn) error {
		mu.Lock()
		defer mu.Unlock()
		if n++; n == 2 {
			return status.Error(codes.ResourceExhausted, "connection closed: its caller holds its share")
		}
		return nil
	}
	out, err := runKept(context.Background(), op, RunConfig{Concurrency: 1, Batch: 3, Requests: 3}, ready, nil)
	if err != nil {
		t.Fatal(err)
	}
	if out.OK != 2 || out.Requests != 3 || out.Errors["ResourceExhausted"] != 1 ||
		!strings.HasPrefix(out.FirstError["ResourceExhausted"], "readying a kept connection: ") || out.Kept.Connections != 2 {
		t.Errorf("ok %d, requests %d, errors %v %v, connections %d: want the one not readied counted as an error and not sent",
			out.OK, out.Requests, out.Errors, out.FirstError, out.Kept.Connections)
	}
	if out.Authority != nil {
		t.Errorf("authority %+v without a CPU reading", out.Authority)
	}
}

func TestRunKeptCPUGone(t *testing.T) {
	noSettle(t)
	op := &fakeKept{prepared: -1}
	gone := func() (float64, error) { return 0, errors.New("no such process") }
	if _, err := runKept(context.Background(), op, RunConfig{Concurrency: 1, Batch: 2, Requests: 2}, op.ready, gone); err == nil ||
		!strings.Contains(err.Error(), "no such process") {
		t.Errorf("the authority gone from /proc: %v; want the run to fail with it", err)
	}
}

func TestRunKeptRefusesOthers(t *testing.T) {
	op := opFunc(func(context.Context, int, int64) error { return nil })
	if _, err := RunKept(context.Background(), op, RunConfig{Concurrency: 1, Batch: 1, Requests: 1}); err == nil {
		t.Error("RunKept ran an operation that cannot ride kept connections")
	}
	for _, cfg := range []RunConfig{{Concurrency: 1, Batch: 0, Requests: 1}, {Concurrency: 1, Batch: 1}} {
		if _, err := RunKept(context.Background(), &fakeKept{prepared: -1}, cfg); err == nil {
			t.Errorf("RunKept(%+v) ran", cfg)
		}
	}
}

func TestPrepareKeptRefusals(t *testing.T) {
	for _, tc := range []struct {
		s    Setup
		want string
	}{
		{Setup{Op: OpBoundRefresh, Connection: ConnKept, Batch: 10}, "renew, token-join, psk-join"},
		{Setup{Op: OpBoundRecovery, Connection: ConnKept, Batch: 10}, "renew, token-join, psk-join"},
		{Setup{Op: OpStream, Connection: ConnKept, Batch: 10}, "renew, token-join, psk-join"},
		{Setup{Op: OpRenew, Connection: ConnKept}, "a batch of 0"},
		{Setup{Op: OpRenew, Connection: "pooled", Batch: 10}, "want new, shared or kept"},
	} {
		// Refused before the authority is asked anything (no Admin).
		if _, err := Prepare(context.Background(), tc.s); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Prepare(%+v) = %v; want it refused (%s)", tc.s, err, tc.want)
		}
	}
}

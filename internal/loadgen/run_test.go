package loadgen

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type opFunc func(ctx context.Context, worker int, seq int64) error

func (f opFunc) Do(ctx context.Context, worker int, seq int64) error { return f(ctx, worker, seq) }

func TestRunCountsByCode(t *testing.T) {
	op := opFunc(func(_ context.Context, _ int, seq int64) error {
		switch seq % 4 {
		case 1:
			return status.Error(codes.PermissionDenied, "no")
		case 2:
			return status.Error(codes.ResourceExhausted, "slow down")
		}
		return nil
	})
	out, err := Run(context.Background(), op, RunConfig{Concurrency: 3, Requests: 100})
	if err != nil {
		t.Fatal(err)
	}
	if out.Requests != 100 || out.OK != 50 || out.Errors["PermissionDenied"] != 25 || out.Errors["ResourceExhausted"] != 25 {
		t.Errorf("requests %d, ok %d, errors %v: want 100, 50, 25 of each refusal", out.Requests, out.OK, out.Errors)
	}
	if out.FirstError["PermissionDenied"] == "" || out.Throughput <= 0 {
		t.Errorf("first errors %v, throughput %v", out.FirstError, out.Throughput)
	}
}

func TestRunStopsWhenExhausted(t *testing.T) {
	op := opFunc(func(_ context.Context, _ int, seq int64) error {
		if seq >= 10 {
			return ErrExhausted
		}
		return nil
	})
	out, err := Run(context.Background(), op, RunConfig{Concurrency: 4, Duration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if !out.Exhausted || out.OK != 10 || out.Requests != 10 {
		t.Errorf("exhausted %v, ok %d, requests %d: want the run to stop after the 10 prepared", out.Exhausted, out.OK, out.Requests)
	}
}

func TestRunRefusesNoBound(t *testing.T) {
	op := opFunc(func(context.Context, int, int64) error { return nil })
	for _, cfg := range []RunConfig{{Concurrency: 1}, {Concurrency: 0, Requests: 1}} {
		if _, err := Run(context.Background(), op, cfg); err == nil {
			t.Errorf("Run(%+v) ran", cfg)
		}
	}
}

func TestParseStatCPU(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       float64
		ok         bool
	}{
		{"plain", "42 (muster) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 8 0", 3.0, true},
		{"a name with spaces and parentheses", "42 (a b) c)) R 1 42 42 0 -1 0 0 0 0 0 7 3 0 0", 0.1, true},
		{"truncated", "42 (muster) S 1 2", 0, false},
		{"no name", "42 muster S", 0, false},
		{"not numbers", "42 (m) S 1 42 42 0 -1 0 0 0 0 0 x y", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStatCPU([]byte(tc.stat))
			if (err == nil) != tc.ok || got != tc.want {
				t.Errorf("parseStatCPU = %v, %v; want %v, ok %v", got, err, tc.want, tc.ok)
			}
		})
	}
}

func TestSourceAddrStaysOnLoopbackHosts(t *testing.T) {
	seen := map[string]bool{}
	for _, n := range []int64{0, 1, 253, 254, 255, 254 * 256, 254*256*254 - 1, 254 * 256 * 254, 1 << 40} {
		ip := sourceAddr(n)
		if !ip.IsLoopback() || ip.To4()[3] == 0 || ip.To4()[3] == 255 || ip.To4()[1] == 0 {
			t.Errorf("sourceAddr(%d) = %v", n, ip)
		}
		seen[ip.String()] = true
	}
	if !seen[net.IPv4(127, 1, 0, 1).String()] || len(seen) < 7 {
		t.Errorf("addresses %v: want 127.1.0.1 first and distinct ones", seen)
	}
}

func TestParseOpenFiles(t *testing.T) {
	const header = "Limit                     Soft Limit           Hard Limit           Units     \n" +
		"Max cpu time              unlimited            unlimited            seconds   \n"
	for _, tc := range []struct {
		name, limits string
		want         uint64
		ok           bool
	}{
		{"a number", header + "Max open files            1024                 524288               files     \n", 1024, true},
		{"unlimited", header + "Max open files            unlimited            unlimited            files     \n", 0, true},
		{"missing", header, 0, false},
		{"garbled", header + "Max open files            many                 many                 files     \n", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseOpenFiles([]byte(tc.limits))
			if (err == nil) != tc.ok || got != tc.want {
				t.Errorf("parseOpenFiles = %v, %v; want %v, ok %v", got, err, tc.want, tc.ok)
			}
		})
	}
}

func TestPendingCountsReceiptsBeforeAndAfterTheID(t *testing.T) {
	start := time.Now()
	p := &pending{all: make(chan struct{}), start: start, left: 3}
	into := make([]time.Duration, 3)
	p.received(receipt{stream: 0, task: "t1", at: start.Add(time.Millisecond)}, into)
	p.received(receipt{stream: 1, task: "other", at: start.Add(time.Millisecond)}, into)
	p.known("t1", into)
	p.received(receipt{stream: 0, task: "t1", at: start.Add(5 * time.Millisecond)}, into) // a redelivery: the first counts
	p.received(receipt{stream: 1, task: "t1", at: start.Add(2 * time.Millisecond)}, into)
	select {
	case <-p.all:
		t.Fatal("done with one stream still to receive the task")
	default:
	}
	p.received(receipt{stream: 2, task: "t1", at: start.Add(3 * time.Millisecond)}, into)
	select {
	case <-p.all:
	default:
		t.Fatal("not done after every stream received the task")
	}
	want := []time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond}
	if !slices.Equal(into, want) {
		t.Errorf("deliveries %v, want %v", into, want)
	}
}

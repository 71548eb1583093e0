package e2e

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestBench runs muster bench against a real authority for each operation,
// a small request count each (this is a smoke of the tool, not a timing:
// timing aims live in docs/performance.md), and checks its JSON: every
// request answered, none refused, a throughput, the same-run crypto bound
// and the ratio to it, and the authority's CPU and memory found from
// DIR/authority.lock.
func TestBench(t *testing.T) {
	dir, _ := initDir(t)
	a := startAuthority(t, dir)
	for _, tc := range []struct {
		op, conn string
	}{
		{"token-join", "new"},
		{"psk-join", "new"},
		{"renew", "new"},
		{"bound-recovery", "new"},
		// Few enough requests per simulated agent to stay in the
		// per-source burst on one connection.
		{"token-join", "shared"},
	} {
		t.Run(tc.op+"/"+tc.conn, func(t *testing.T) {
			r := muster(t, nil, "bench", "--data", dir, "--op", tc.op, "--connection", tc.conn,
				"--concurrency", "4", "--requests", "40", "-o", "json")
			if r.code != 0 {
				t.Fatalf("muster bench: exit %d\nstdout: %s\nstderr: %s\nauthority: %s", r.code, r.stdout, r.stderr, a.Logs())
			}
			var rep struct {
				Op  string `json:"op"`
				Run struct {
					Requests   int64             `json:"requests"`
					OK         int64             `json:"ok"`
					Errors     map[string]int64  `json:"errors"`
					FirstError map[string]string `json:"first_error"`
					Throughput float64           `json:"throughput"`
					Latency    struct {
						P50 int64 `json:"p50_ns"`
						P99 int64 `json:"p99_ns"`
						Max int64 `json:"max_ns"`
					} `json:"latency"`
					Authority *struct {
						PID          int     `json:"pid"`
						CPUSeconds   float64 `json:"cpu_seconds"`
						PeakRSSBytes int64   `json:"peak_rss_bytes"`
					} `json:"authority"`
				} `json:"run"`
				Bound struct {
					What    string  `json:"what"`
					PerOp   int64   `json:"per_op_ns"`
					PerCore float64 `json:"ops_per_second_per_core"`
				} `json:"bound"`
				OfBound float64 `json:"of_bound"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
				t.Fatalf("bench -o json printed %q: %v", r.stdout, err)
			}
			run := rep.Run
			if rep.Op != tc.op || run.Requests != 40 || run.OK != 40 || len(run.Errors) != 0 {
				t.Fatalf("op %q: %d requests, %d ok, errors %v %v; want 40 ok, no errors", rep.Op, run.Requests, run.OK, run.Errors, run.FirstError)
			}
			if run.Throughput <= 0 || run.Latency.P50 <= 0 || run.Latency.P50 > run.Latency.P99 || run.Latency.P99 > run.Latency.Max {
				t.Errorf("throughput %v, latency %+v: want positive and ordered", run.Throughput, run.Latency)
			}
			if rep.Bound.PerOp <= 0 || rep.Bound.PerCore <= 0 || rep.Bound.What == "" || rep.OfBound <= 0 {
				t.Errorf("bound %+v, of_bound %v: want a measured bound and a ratio", rep.Bound, rep.OfBound)
			}
			if run.Authority == nil || run.Authority.PID != a.cmd.Process.Pid || run.Authority.PeakRSSBytes <= 0 {
				t.Errorf("authority usage %+v: want the authority's pid %d with its RSS", run.Authority, a.cmd.Process.Pid)
			}
			if !strings.Contains(r.stderr, "setup:") {
				t.Errorf("stderr %q: want the setup step said", r.stderr)
			}
		})
	}
	// Renewals cannot share a connection: one presents one certificate.
	if got := mustFail(t, "bench", "--data", dir, "--op", "renew", "--connection", "shared", "--requests", "1"); !strings.Contains(got, "new connection") {
		t.Errorf("renew over a shared connection: %q", got)
	}
	if got := mustFail(t, "bench", "--data", dir, "--op", "nope", "--requests", "1"); !strings.Contains(got, "token-join") {
		t.Errorf("an unknown op: %q", got)
	}
}

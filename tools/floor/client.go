package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// clientConfig is one client run.
type clientConfig struct {
	addr        string
	pid         int
	kept        bool
	concurrency int
	// requests is the renewals to make, or with duration > 0 the keys and
	// CSRs made beforehand (used in turn when the run needs more).
	requests int
	duration time.Duration
	// conns is the kept connections (kept only; 0: one per worker). Equal
	// to requests, each connection carries one timed renewal, as muster
	// bench --connection kept does.
	conns int
}

// result is what a run prints.
type result struct {
	Connection      string  `json:"connection"`
	Concurrency     int     `json:"concurrency"`
	Conns           int     `json:"kept_connections,omitempty"`
	OK              int     `json:"ok"`
	Errors          int     `json:"errors"`
	FirstError      string  `json:"first_error,omitempty"`
	ElapsedSeconds  float64 `json:"elapsed_seconds"`
	PerSecond       float64 `json:"renewals_per_second"`
	ServerCPUNs     int64   `json:"server_cpu_per_renewal_ns"`
	ServerUserNs    int64   `json:"server_user_per_renewal_ns"`
	ServerSysNs     int64   `json:"server_system_per_renewal_ns"`
	UserShare       float64 `json:"server_user_share"`
	CPUErrorNs      int64   `json:"server_cpu_per_renewal_error_ns"`
	P50Ns           int64   `json:"p50_ns"`
	P99Ns           int64   `json:"p99_ns"`
	UntimedCPUPerNs int64   `json:"untimed_server_cpu_per_kept_connection_ns,omitempty"`
}

// prepared is a renewal's new key and its CSR, made before the clock starts.
type prepared struct {
	key *ecdsa.PrivateKey
	csr []byte
}

func prepare(n int) ([]prepared, error) {
	out := make([]prepared, n)
	for i := range out {
		k, err := newKey()
		if err != nil {
			return nil, err
		}
		csr, err := x509.CreateCertificateRequest(nil, &x509.CertificateRequest{}, k)
		if err != nil {
			return nil, err
		}
		out[i] = prepared{k, csr}
	}
	return out, nil
}

// identity is a client certificate (the leaf alone, as muster's agent
// presents it) and its key.
type identity struct {
	cert tls.Certificate
}

func mint(p *clientPKI, name string) (identity, error) {
	k, err := newKey()
	if err != nil {
		return identity{}, err
	}
	leaf, err := sign(leafTemplate(name, agentID(name), time.Now(), nil), p.agentCA, k.Public(), p.key)
	if err != nil {
		return identity{}, err
	}
	return identity{tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: k, Leaf: leaf}}, nil
}

func dial(addr string, roots *x509.CertPool, id identity) (*grpc.ClientConn, error) {
	cert := id.cert
	cfg := &tls.Config{
		RootCAs: roots,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &cert, nil
		},
	}
	return grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
}

func renewOn(ctx context.Context, cc *grpc.ClientConn, csr []byte) ([]byte, error) {
	var chain []byte
	if err := cc.Invoke(ctx, renewMethod, csr, &chain); err != nil {
		return nil, err
	}
	return chain, nil
}

// leafOf is the first certificate of a chain PEM.
func leafOf(chain []byte) ([]byte, error) {
	blk, _ := pem.Decode(chain)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("answer holds no certificate")
	}
	return blk.Bytes, nil
}

// runClient makes the renewals and reads the server's CPU around the timed
// part.
func runClient(ctx context.Context, p *clientPKI, c clientConfig) (*result, error) {
	if c.concurrency < 1 || c.requests < 1 {
		return nil, errors.New("concurrency and requests must be at least 1")
	}
	work, err := prepare(c.requests)
	if err != nil {
		return nil, err
	}
	res := &result{Connection: "new", Concurrency: c.concurrency}

	// Untimed: the workers' identities (new), or the kept connections
	// opened and readied with a first renewal (kept).
	var ids []identity
	var conns []*grpc.ClientConn
	var untimed perOp
	if !c.kept {
		for w := range c.concurrency {
			id, err := mint(p, "w"+strconv.Itoa(w))
			if err != nil {
				return nil, err
			}
			ids = append(ids, id)
		}
	} else {
		n := c.conns
		if n <= 0 {
			n = c.concurrency
		}
		res.Connection, res.Conns = "kept", n
		conns = make([]*grpc.ClientConn, n)
		defer func() {
			for _, cc := range conns {
				if cc != nil {
					cc.Close()
				}
			}
		}()
		before, err := readCPU(c.pid)
		if err != nil {
			return nil, err
		}
		ready, err := prepare(min(n, 256))
		if err != nil {
			return nil, err
		}
		var next atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, c.concurrency)
		for range c.concurrency {
			wg.Go(func() {
				for {
					i := int(next.Add(1) - 1)
					if i >= n {
						return
					}
					id, err := mint(p, "k"+strconv.Itoa(i))
					if err == nil {
						conns[i], err = dial(c.addr, p.roots, id)
					}
					if err == nil {
						_, err = renewOn(ctx, conns[i], ready[i%len(ready)].csr)
					}
					if err != nil {
						errs <- fmt.Errorf("readying kept connection %d: %w", i, err)
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return nil, err
		}
		// As muster bench: let the server finish what it still does for
		// them (a reply's last writes, a collection under way).
		time.Sleep(50 * time.Millisecond)
		after, err := readCPU(c.pid)
		if err != nil {
			return nil, err
		}
		if untimed, err = cpuPerOp(before, after, n); err != nil {
			return nil, err
		}
		res.UntimedCPUPerNs = untimed.CPU.Nanoseconds()
	}

	var (
		next     atomic.Int64
		ok, bad  atomic.Int64
		firstErr atomic.Value
		wg       sync.WaitGroup
		mu       sync.Mutex
		lat      []time.Duration
	)
	deadline := time.Time{}
	before, err := readCPU(c.pid)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if c.duration > 0 {
		deadline = start.Add(c.duration)
	}
	for w := range c.concurrency {
		wg.Go(func() {
			var mine []time.Duration
			defer func() {
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			}()
			for {
				i := int(next.Add(1) - 1)
				if deadline.IsZero() && i >= c.requests || !deadline.IsZero() && time.Now().After(deadline) {
					return
				}
				job := work[i%len(work)]
				t0 := time.Now()
				var err error
				if c.kept {
					_, err = renewOn(ctx, conns[i%len(conns)], job.csr)
				} else {
					err = renewNew(ctx, c.addr, p.roots, &ids[w], job)
				}
				if err != nil {
					bad.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				mine = append(mine, time.Since(t0))
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	after, err := readCPU(c.pid)
	if err != nil {
		return nil, err
	}
	res.OK, res.Errors = int(ok.Load()), int(bad.Load())
	if e, _ := firstErr.Load().(string); e != "" {
		res.FirstError = e
	}
	res.ElapsedSeconds = elapsed.Seconds()
	res.PerSecond = float64(res.OK) / elapsed.Seconds()
	per, err := cpuPerOp(before, after, res.OK)
	if err != nil {
		return res, err
	}
	res.ServerCPUNs, res.ServerUserNs, res.ServerSysNs = per.CPU.Nanoseconds(), per.User.Nanoseconds(), per.Sys.Nanoseconds()
	res.UserShare, res.CPUErrorNs = per.UserShare, per.Error.Nanoseconds()
	slices.Sort(lat)
	res.P50Ns, res.P99Ns = rank(lat, 0.50).Nanoseconds(), rank(lat, 0.99).Nanoseconds()
	return res, nil
}

// renewNew renews over a connection of its own, presenting the worker's
// newest certificate, and keeps the new one for the worker's next renewal
// (as an agent does, and muster bench --op renew).
func renewNew(ctx context.Context, addr string, roots *x509.CertPool, id *identity, job prepared) error {
	cc, err := dial(addr, roots, *id)
	if err != nil {
		return err
	}
	defer cc.Close()
	chain, err := renewOn(ctx, cc, job.csr)
	if err != nil {
		return err
	}
	leaf, err := leafOf(chain)
	if err != nil {
		return err
	}
	id.cert = tls.Certificate{Certificate: [][]byte{leaf}, PrivateKey: job.key}
	return nil
}

// rank is the nearest-rank quantile q of sorted durations.
func rank(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// serverInfo reads the PID and address the server wrote.
func serverInfo(dir string) (int, string, error) {
	b, err := os.ReadFile(filepath.Join(dir, serverFile))
	if err != nil {
		return 0, "", err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, "", fmt.Errorf("%s: want PID and address", serverFile)
	}
	pid, err := strconv.Atoi(f[0])
	return pid, f[1], err
}

func clientMain(args []string) error {
	fs := flag.NewFlagSet("floor client", flag.ContinueOnError)
	dir := fs.String("dir", "floor-data", "the server's directory")
	addr := fs.String("addr", "", "server address (default: from DIR/server.txt)")
	pid := fs.Int("pid", 0, "server PID whose /proc CPU is read (default: from DIR/server.txt)")
	conn := fs.String("conn", "new", "new: a TLS connection per renewal; kept: renewals over connections opened and readied (one renewal each) before the timed part")
	conc := fs.Int("c", 16, "concurrent workers")
	n := fs.Int("n", 3000, "renewals; with -d, the keys and CSRs made beforehand, used in turn")
	d := fs.Duration("d", 0, "run for this long instead of -n renewals")
	conns := fs.Int("conns", 0, "kept: connections (0: one per worker; equal to -n: one timed renewal each, as muster bench --connection kept)")
	out := fs.String("o", "text", "text or json")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *conn != "new" && *conn != "kept" {
		return fmt.Errorf("-conn %q: want new or kept", *conn)
	}
	if *addr == "" || *pid == 0 {
		p, a, err := serverInfo(*dir)
		if err != nil {
			return err
		}
		if *addr == "" {
			*addr = a
		}
		if *pid == 0 {
			*pid = p
		}
	}
	p, err := readClientPKI(*dir)
	if err != nil {
		return err
	}
	res, err := runClient(context.Background(), p, clientConfig{
		addr: *addr, pid: *pid, kept: *conn == "kept", concurrency: *conc,
		requests: *n, duration: *d, conns: *conns,
	})
	if err != nil {
		return err
	}
	return printResult(os.Stdout, res, *out)
}

func printResult(w io.Writer, r *result, format string) error {
	if format == "json" {
		e := json.NewEncoder(w)
		e.SetIndent("", "  ")
		return e.Encode(r)
	}
	us := func(ns int64) float64 { return float64(ns) / 1e3 }
	fmt.Fprintf(w, "connection %s, concurrency %d", r.Connection, r.Concurrency)
	if r.Conns > 0 {
		fmt.Fprintf(w, ", %d kept connections (readying: %.0f µs server CPU each)", r.Conns, us(r.UntimedCPUPerNs))
	}
	fmt.Fprintf(w, "\nrenewals ok %d, errors %d, %.2f s, %.1f/s, p50 %.2f ms, p99 %.2f ms\n",
		r.OK, r.Errors, r.ElapsedSeconds, r.PerSecond, float64(r.P50Ns)/1e6, float64(r.P99Ns)/1e6)
	if r.FirstError != "" {
		fmt.Fprintf(w, "first error: %s\n", r.FirstError)
	}
	fmt.Fprintf(w, "server CPU per renewal %.0f µs (±%.0f): user %.0f µs, system %.0f µs (%.0f %% user)\n",
		us(r.ServerCPUNs), us(r.CPUErrorNs), us(r.ServerUserNs), us(r.ServerSysNs), 100*r.UserShare)
	return nil
}

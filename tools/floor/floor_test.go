package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	// A command name with spaces and parentheses; utime 1234, stime 56.
	s := "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 56 0 0 20 0 7 0 100 0 0\n"
	got, err := parseStat(s)
	if err != nil {
		t.Fatal(err)
	}
	if want := (cpuTimes{user: 12340 * time.Millisecond, sys: 560 * time.Millisecond}); got != want {
		t.Errorf("parseStat = %+v, want %+v", got, want)
	}
	for _, bad := range []string{"", "1 (x", "1 (x) S 1 2 3", "1 (x) S 1 2 3 4 5 6 7 8 9 10 x 5 6"} {
		if _, err := parseStat(bad); err == nil {
			t.Errorf("parseStat(%q) took it", bad)
		}
	}
}

func TestParseStatOwnProcess(t *testing.T) {
	if _, err := readCPU(os.Getpid()); err != nil {
		t.Fatal(err)
	}
}

func TestCPUPerOp(t *testing.T) {
	before := cpuTimes{user: 1 * time.Second, sys: 500 * time.Millisecond}
	after := cpuTimes{user: 4 * time.Second, sys: 1500 * time.Millisecond}
	got, err := cpuPerOp(before, after, 2000)
	if err != nil {
		t.Fatal(err)
	}
	want := perOp{
		CPU:       2000 * time.Microsecond, // 4 s over 2000
		User:      1500 * time.Microsecond,
		Sys:       500 * time.Microsecond,
		UserShare: 0.75,
		Error:     10 * time.Microsecond, // 20 ms over 2000
	}
	if got != want {
		t.Errorf("cpuPerOp = %+v, want %+v", got, want)
	}
	if _, err := cpuPerOp(before, after, 0); err == nil {
		t.Error("no ops: took it")
	}
	if _, err := cpuPerOp(after, before, 1); err == nil {
		t.Error("CPU going backwards: took it")
	}
}

func TestRank(t *testing.T) {
	d := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if got := rank(d, 0.5); got != 5 {
		t.Errorf("p50 = %v, want 5", got)
	}
	if got := rank(d, 0.99); got != 10 {
		t.Errorf("p99 = %v, want 10", got)
	}
	if got := rank(nil, 0.5); got != 0 {
		t.Errorf("empty: %v", got)
	}
}

// TestRenewals runs the server in process and renews over new and kept
// connections: every renewal is answered, a new connection presents the
// certificate its previous renewal got, and the answer is a leaf of the
// client's identity the agent intermediate signed.
func TestRenewals(t *testing.T) {
	dir := t.TempDir()
	h, err := newHierarchy(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := h.write(dir); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := newGRPCServer(h)
	go gs.Serve(lis)
	defer gs.Stop()
	p, err := readClientPKI(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []clientConfig{
		{concurrency: 2, requests: 6},
		{kept: true, concurrency: 2, requests: 6},
		{kept: true, concurrency: 2, requests: 6, conns: 6},
	} {
		c.addr, c.pid = lis.Addr().String(), os.Getpid()
		res, err := runClient(ctx, p, c)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if res.OK != 6 || res.Errors != 0 {
			t.Errorf("%+v: %d ok, %d errors (%s)", c, res.OK, res.Errors, res.FirstError)
		}
	}

	// One renewal by hand: the answer's leaf.
	id, err := mint(p, "n1")
	if err != nil {
		t.Fatal(err)
	}
	work, err := prepare(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := renewNew(ctx, lis.Addr().String(), p.roots, &id, work[0]); err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(id.cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := leaf.CheckSignatureFrom(h.agentCA); err != nil {
		t.Errorf("leaf not signed by the agent intermediate: %v", err)
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != "spiffe://floor.test/agent/n1" {
		t.Errorf("leaf URIs %v", leaf.URIs)
	}
	if !leaf.PublicKey.(*ecdsa.PublicKey).Equal(work[0].key.Public()) {
		t.Error("leaf is not for the CSR's key")
	}
	if d := leaf.NotAfter.Sub(leaf.NotBefore); d != leafTTL+backdate {
		t.Errorf("leaf valid %v", d)
	}
	if len(leaf.ExtKeyUsage) != 1 || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
		t.Errorf("leaf EKU %v", leaf.ExtKeyUsage)
	}

	// The handshake is the authority's: TLS 1.3, X25519MLKEM768 (Go's
	// default), no session ticket offered.
	tc, err := tls.Dial("tcp", lis.Addr().String(), &tls.Config{RootCAs: p.roots, Certificates: []tls.Certificate{id.cert}, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	st := tc.ConnectionState()
	tc.Close()
	if st.Version != tls.VersionTLS13 || st.CurveID != tls.X25519MLKEM768 || st.NegotiatedProtocol != "h2" {
		t.Errorf("handshake: version %x, group %v, ALPN %q", st.Version, st.CurveID, st.NegotiatedProtocol)
	}
	// Without a client certificate there is no connection.
	if tc, err := tls.Dial("tcp", lis.Addr().String(), &tls.Config{RootCAs: p.roots, NextProtos: []string{"h2"}}); err == nil {
		// TLS 1.3: the server's refusal arrives with the first read.
		_, err = tc.Read(make([]byte, 1))
		tc.Close()
		if err == nil {
			t.Error("a client without a certificate was served")
		}
	}

	// A CSR whose signature does not verify is refused.
	bad := append([]byte(nil), work[0].csr...)
	bad[len(bad)-3] ^= 1
	cc, err := dial(lis.Addr().String(), p.roots, id)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if _, err := renewOn(ctx, cc, bad); err == nil {
		t.Error("a CSR with a broken signature was answered")
	}
}

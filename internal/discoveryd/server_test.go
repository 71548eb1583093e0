package discoveryd

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/discoveryclient"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

func TestServerCertificate(t *testing.T) {
	e := start(t)
	tc, err := discoveryclient.TLSConfig(e.srv.Fingerprint())
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", e.addr, tc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	chain := conn.ConnectionState().PeerCertificates
	if len(chain) != 2 {
		t.Fatalf("chain of %d certificates, want the leaf and the CA", len(chain))
	}
	leaf, root := chain[0], chain[1]
	// The security property: never an authority's SPIFFE ID, nor any URI.
	if len(leaf.URIs) != 0 {
		t.Errorf("the server certificate carries URI SANs %v", leaf.URIs)
	}
	if leaf.IsCA || !slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) {
		t.Errorf("leaf is CA %v with usages %v, want a server-auth leaf", leaf.IsCA, leaf.ExtKeyUsage)
	}
	var ips []string
	for _, ip := range leaf.IPAddresses {
		ips = append(ips, ip.String())
	}
	if !slices.Contains(ips, "127.0.0.1") || !slices.Contains(ips, "::1") || !slices.Contains(leaf.DNSNames, "localhost") {
		t.Errorf("SANs %v %v, want the loopback names", leaf.DNSNames, ips)
	}
	if life := leaf.NotAfter.Sub(leaf.NotBefore); life < ServerCertTTL || life > ServerCertTTL+2*time.Minute {
		t.Errorf("leaf lifetime %v, want about %v", life, ServerCertTTL)
	}
	if ca.Fingerprint(root) != e.srv.Fingerprint() {
		t.Errorf("presented CA %s, want the pinned %s", ca.Fingerprint(root), e.srv.Fingerprint())
	}
	onDisk, err := ReadCA(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	if ca.Fingerprint(onDisk) != e.srv.Fingerprint() {
		t.Errorf("the CA in the directory is %s, the server's %s", ca.Fingerprint(onDisk), e.srv.Fingerprint())
	}
	// Health over gRPC, on the same listener.
	resp, err := healthpb.NewHealthClient(e.conn).Check(ctxT(t), &healthpb.HealthCheckRequest{Service: "muster.v1.DiscoveryService"})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health check: %v %v", resp, err)
	}
}

func TestHTTPS(t *testing.T) {
	e := start(t)
	tc, _ := discoveryclient.TLSConfig(e.srv.Fingerprint())
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}}
	defer client.CloseIdleConnections()
	tests := []struct {
		method, path string
		code         int
		header       map[string]string
		body         string
	}{
		{method: "GET", path: discoveryclient.JWKSPath, code: 200,
			header: map[string]string{"Cache-Control": "max-age=60", "Content-Type": "application/json"}, body: `"kty":"OKP"`},
		{method: "HEAD", path: discoveryclient.JWKSPath, code: 200},
		{method: "POST", path: discoveryclient.JWKSPath, code: 405},
		{method: "GET", path: "/healthz", code: 200, body: "ok"},
		{method: "GET", path: "/", code: 404},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(ctxT(t), tt.method, "https://"+e.addr+tt.path, strings.NewReader(""))
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.code {
				t.Fatalf("status %d, want %d", resp.StatusCode, tt.code)
			}
			for k, v := range tt.header {
				if got := resp.Header.Get(k); got != v {
					t.Errorf("%s: %q, want %q", k, got, v)
				}
			}
			if !strings.Contains(string(body), tt.body) {
				t.Errorf("body %q, want it to contain %q", body, tt.body)
			}
		})
	}
	// The metrics listener is plain HTTP.
	resp, err := http.Get("http://" + e.srv.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, name := range []string{"muster_discovery_tickets_denied_total", "muster_discovery_tickets_issued_total"} {
		if !strings.Contains(string(body), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

func TestRestartKeepsIdentityAndKeys(t *testing.T) {
	e := start(t)
	fp := e.srv.Fingerprint()
	key, _ := e.srv.keys.activeSince()
	e.stop()
	e.run()
	if e.srv.Fingerprint() != fp {
		t.Errorf("fingerprint after restart %s, want %s", e.srv.Fingerprint(), fp)
	}
	if k, _ := e.srv.keys.activeSince(); k != key {
		t.Errorf("ticket key after restart %s, want %s", k, key)
	}
	a, err := Dir(e.dir).ReadAddress()
	if err != nil || a.Issuer != "https://"+e.addr || a.Listen != e.addr {
		t.Errorf("address file %+v, %v", a, err)
	}
}

func TestInit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	// Several processes starting on a new directory end up with one
	// identity.
	var wg sync.WaitGroup
	fps := make([]string, 4)
	errs := make([]error, 4)
	for i := range fps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := Init(dir)
			errs[i] = err
			if err == nil {
				fps[i] = id.Fingerprint()
			}
		}()
	}
	wg.Wait()
	for i := range fps {
		if errs[i] != nil {
			t.Fatalf("Init %d: %v", i, errs[i])
		}
		if fps[i] != fps[0] {
			t.Fatalf("concurrent Inits made different CAs: %v", fps)
		}
	}
	id, err := Init(dir)
	if err != nil || id.Fingerprint() != fps[0] {
		t.Fatalf("Init again: %v, %v", id, err)
	}
	d := Dir(dir)
	for path, want := range map[string]os.FileMode{
		dir: 0o700 | os.ModeDir, d.StorageKeyFile(): 0o600, d.TLSDir(): 0o700 | os.ModeDir, d.CAKeyFile(): 0o600,
	} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s has mode %v, want %v", path, fi.Mode(), want)
		}
	}
	c := id.CA
	if c.Subject.CommonName != "muster discovery CA" || !c.IsCA || !c.MaxPathLenZero || c.CheckSignatureFrom(c) != nil {
		t.Errorf("CA %v: want a self-signed CA named muster discovery CA that signs leaves only", c.Subject)
	}
	if k, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("CA key %T, want ECDSA P-256", c.PublicKey)
	}
	if life := c.NotAfter.Sub(c.NotBefore); life < CATTL || life > CATTL+2*time.Minute {
		t.Errorf("CA lifetime %v, want about 10 years", life)
	}
	entries, _ := os.ReadDir(dir)
	for _, en := range entries {
		if strings.HasPrefix(en.Name(), ".") {
			t.Errorf("Init left %s behind", en.Name())
		}
	}

	// Loading refuses what it must.
	if _, err := Load(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("Load of a missing directory succeeded")
	}
	if err := os.Chmod(d.CAKeyFile(), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("Load with a readable CA key: %v", err)
	}
	authorityDir := t.TempDir()
	os.WriteFile(filepath.Join(authorityDir, "authority.json"), []byte("{}"), 0o600)
	if _, err := Init(authorityDir); err == nil {
		t.Error("Init in an authority's data directory succeeded")
	}
}

func TestNewValidates(t *testing.T) {
	e := start(t)
	for name, cfg := range map[string]Config{
		"no store":          {Dir: e.dir},
		"no dir":            {Store: e.st},
		"negative rotation": {Dir: e.dir, Store: e.st, KeyRotation: -time.Hour},
		"bad advertise":     {Dir: e.dir, Store: e.st, Advertise: "host-without-port"},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
	// A listener that cannot bind fails Run with the reason.
	srv, err := New(Config{Dir: e.dir, Store: e.st, Listen: e.addr})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Run(ctx); err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("Run on a used port: %v", err)
	}
}

func TestRefusesAnAuthorityStore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "discovery")
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "muster.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.InsertPSK(context.Background(), store.PSK{ID: "psk-1", Ciphertext: []byte("c"), Nonce: []byte("n"),
		Status: store.PSKActive, CreatedAt: time.Now()}, setupLink); err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Dir: dir, Store: st, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Run(ctx); err == nil || !strings.Contains(err.Error(), "database of its own") {
		t.Errorf("Run on an authority's store: %v", err)
	}
	if _, err := RotateKey(ctx, dir, st, false); err == nil || !strings.Contains(err.Error(), "database of its own") {
		t.Errorf("RotateKey on an authority's store: %v", err)
	}
	if keys, _ := st.ListTicketKeys(ctx); len(keys) != 0 {
		t.Errorf("ticket keys written to an authority's store: %v", keys)
	}
}

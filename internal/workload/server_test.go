package workload

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"log/slog"
	"math/big"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/identity"
)

// newIdentity is a root and an agent leaf of td, like the agent holds.
func newIdentity(t testing.TB, td string, serial int64) *identity.Identity {
	t.Helper()
	return newIdentityUntil(t, td, serial, time.Now().Add(time.Hour))
}

// newIdentityUntil is newIdentity with a leaf valid until notAfter.
func newIdentityUntil(t testing.TB, td string, serial int64, notAfter time.Time) *identity.Identity {
	t.Helper()
	rk, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	root := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "root"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour)}
	rder, err := x509.CreateCertificate(rand.Reader, root, root, &rk.PublicKey, rk)
	if err != nil {
		t.Fatal(err)
	}
	root, _ = x509.ParseCertificate(rder)
	lk, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	u, _ := url.Parse("spiffe://" + td + "/agent/web-1")
	leaf := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "web-1"}, URIs: []*url.URL{u},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		NotBefore: notAfter.Add(-2 * time.Hour), NotAfter: notAfter}
	lder, err := x509.CreateCertificate(rand.Reader, leaf, root, &lk.PublicKey, rk)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ = x509.ParseCertificate(lder)
	return &identity.Identity{Chain: []*x509.Certificate{leaf}, Key: lk, Roots: []*x509.Certificate{root}}
}

// holder is a load function whose identity a test swaps.
type holder struct {
	mu sync.Mutex
	id *identity.Identity
}

func (h *holder) load() (*identity.Identity, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.id == nil {
		return nil, fmt.Errorf("no identity")
	}
	return h.id, nil
}

func (h *holder) set(id *identity.Identity) {
	h.mu.Lock()
	h.id = id
	h.mu.Unlock()
}

// serve starts a server on a socket in a fresh directory others can
// traverse, and returns its address.
func serve(t *testing.T, src *Source, cfg Config, mode os.FileMode) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "wapi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	path := filepath.Join(dir, "agent.sock")
	lis, err := Listen(Socket{Path: path, Mode: mode, UID: -1, GID: -1})
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != mode {
		t.Fatalf("socket mode: %v %v", fi, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- NewServer(src, cfg).Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return "unix://" + path
}

type updates chan *workloadapi.X509Context

func (u updates) OnX509ContextUpdate(c *workloadapi.X509Context) { u <- c }
func (u updates) OnX509ContextWatchError(error)                  {}

// The agent's renewal path (Reload) reaches an open stream at once, and a
// load that fails keeps serving the identity before it.
func TestReloadPushesToStreams(t *testing.T) {
	h := &holder{}
	src := NewSource(h.load, slog.New(slog.DiscardHandler))
	src.Reload() // nothing yet: streams wait
	addr := serve(t, src, Config{AllowUIDs: []uint32{uint32(os.Geteuid())}}, 0o600)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch := make(updates, 4)
	go workloadapi.WatchX509Context(ctx, ch, workloadapi.WithAddr(addr))
	select {
	case c := <-ch:
		t.Fatalf("an update before any identity: %v", c.DefaultSVID().ID)
	case <-time.After(300 * time.Millisecond):
	}
	first := newIdentity(t, "prod-a3f2e1", 10)
	h.set(first)
	src.Reload()
	got := <-ch
	if got.DefaultSVID().ID.String() != "spiffe://prod-a3f2e1/agent/web-1" || !got.DefaultSVID().Certificates[0].Equal(first.Leaf()) {
		t.Fatalf("first update: %v", got.DefaultSVID().ID)
	}
	// Reloading the same identity sends nothing.
	src.Reload()
	h.set(nil)
	src.Reload()
	second := newIdentity(t, "prod-a3f2e1", 11)
	h.set(second)
	src.Reload()
	select {
	case got = <-ch:
		if !got.DefaultSVID().Certificates[0].Equal(second.Leaf()) {
			t.Fatal("the update after a reload without a change, or after a failed load, was not the new identity")
		}
	case <-ctx.Done():
		t.Fatal("no update after Reload")
	}
}

// dialRaw is a client that adds the security header only when told.
func dialRaw(t *testing.T, addr string) workloadpb.SpiffeWorkloadAPIClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return workloadpb.NewSpiffeWorkloadAPIClient(conn)
}

func withHeader(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, headerKey, headerValue)
}

// One UID holds at most MaxStreamsPerUID streams; a closed one frees its
// place. Without the header a call is INVALID_ARGUMENT.
func TestStreamsCappedPerUID(t *testing.T) {
	h := &holder{id: newIdentity(t, "td", 1)}
	src := NewSource(h.load, slog.New(slog.DiscardHandler))
	src.Reload()
	addr := serve(t, src, Config{AllowUIDs: []uint32{uint32(os.Geteuid())}, MaxStreamsPerUID: 2}, 0o600)
	c := dialRaw(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	open := func(ctx context.Context) error {
		s, err := c.FetchX509Bundles(withHeader(ctx), &workloadpb.X509BundlesRequest{})
		if err == nil {
			_, err = s.Recv()
		}
		return err
	}
	c1, cancel1 := context.WithCancel(ctx)
	if err := open(c1); err != nil {
		t.Fatal(err)
	}
	if err := open(ctx); err != nil {
		t.Fatal(err)
	}
	if err := open(ctx); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a third stream: %v, want RESOURCE_EXHAUSTED", err)
	}
	cancel1()
	deadline := time.Now().Add(5 * time.Second)
	for err := open(ctx); err != nil; err = open(ctx) {
		if time.Now().After(deadline) {
			t.Fatalf("a stream after one closed: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	s, err := c.FetchX509SVID(ctx, &workloadpb.X509SVIDRequest{})
	if err == nil {
		_, err = s.Recv()
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("without the header: %v, want INVALID_ARGUMENT", err)
	}
	if _, err := c.FetchJWTSVID(ctx, &workloadpb.JWTSVIDRequest{Audience: []string{"x"}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a unary call without the header: %v, want INVALID_ARGUMENT", err)
	}
}

// childEnv makes the test binary a Workload API client (childClient).
const childEnv = "MUSTER_WORKLOAD_TEST_CLIENT"

// TestChildClient is the client run as another user by
// TestRefusesOtherUIDs; run directly it does nothing.
func TestChildClient(t *testing.T) {
	addr := os.Getenv(childEnv)
	if addr == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	svid, err := workloadapi.FetchX509SVID(ctx, workloadapi.WithAddr(addr))
	if err != nil {
		fmt.Printf("RESULT %s %s\n", status.Code(err), err)
		return
	}
	fmt.Printf("RESULT OK %s\n", svid.ID)
}

// A caller is admitted by its kernel-reported UID or primary GID: another
// user is refused PERMISSION_DENIED until its GID is allowed.
func TestRefusesOtherUIDs(t *testing.T) {
	if runtime.GOOS != "linux" || os.Geteuid() != 0 {
		t.Skip("needs root on Linux to run a client as another user")
	}
	const nobody = 65534
	// The test binary sits in a directory only root may enter: the
	// child runs a copy.
	bin := filepath.Join(t.TempDir(), "client.test")
	os.Chmod(filepath.Dir(bin), 0o755)
	os.Chmod(filepath.Dir(filepath.Dir(bin)), 0o755)
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(addr string) string {
		cmd := exec.Command(bin, "-test.run", "^TestChildClient$", "-test.v")
		cmd.Env = []string{childEnv + "=" + addr}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		out, err := cmd.CombinedOutput()
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "RESULT ") {
				return l
			}
		}
		t.Fatalf("the child printed no result (%v):\n%s", err, out)
		return ""
	}
	h := &holder{id: newIdentity(t, "td", 1)}
	src := NewSource(h.load, slog.New(slog.DiscardHandler))
	src.Reload()
	refused := serve(t, src, Config{AllowUIDs: []uint32{0}}, 0o666)
	if got := run(refused); !strings.HasPrefix(got, "RESULT PermissionDenied") || !strings.Contains(got, "UID 65534") {
		t.Fatalf("uid %d not allowed: %s", nobody, got)
	}
	allowed := serve(t, src, Config{AllowUIDs: []uint32{0}, AllowGIDs: []uint32{nobody}}, 0o666)
	if got := run(allowed); got != "RESULT OK spiffe://td/agent/web-1" {
		t.Fatalf("gid %d allowed: %s", nobody, got)
	}
}

// A caller that opens a stream and stops reading is ended once a send
// waits Config.SendTimeout, so its place among its UID's streams is freed.
func TestNonReadingStreamEnds(t *testing.T) {
	h := &holder{id: newIdentity(t, "td", 1)}
	src := NewSource(h.load, slog.New(slog.DiscardHandler))
	src.Reload()
	addr := serve(t, src, Config{AllowUIDs: []uint32{uint32(os.Geteuid())}, MaxStreamsPerUID: 1, SendTimeout: 300 * time.Millisecond}, 0o600)
	c := dialRaw(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.FetchX509SVID(withHeader(ctx), &workloadpb.X509SVIDRequest{}); err != nil {
		t.Fatal(err)
	}
	// New identities until the unread stream's flow-control window is
	// full and a send waits.
	ids := []*identity.Identity{newIdentity(t, "td", 2), newIdentity(t, "td", 3)}
	open := func() error {
		s, err := c.FetchX509Bundles(withHeader(ctx), &workloadpb.X509BundlesRequest{})
		if err == nil {
			_, err = s.Recv()
		}
		return err
	}
	for i := 0; ; i++ {
		h.set(ids[i%2])
		src.Reload()
		time.Sleep(2 * time.Millisecond)
		if i%50 == 49 {
			if err := open(); err == nil {
				return // the non-reading stream was ended and its place freed
			} else if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("a stream beside the unread one: %v", err)
			}
		}
		if ctx.Err() != nil {
			t.Fatal("the stream that reads nothing still holds its UID's only place after 30 s")
		}
	}
}

// An expired certificate is never served: a stream opened while the agent
// holds one (started after its certificate expired) waits, and its first
// message is the next valid identity, the one a bound-keypair recovery
// writes.
func TestExpiredIdentityIsNotServed(t *testing.T) {
	expired := newIdentityUntil(t, "td", 1, time.Now().Add(-time.Second))
	h := &holder{id: expired}
	src := NewSource(h.load, slog.New(slog.DiscardHandler))
	src.Reload()
	if snap, _ := src.Current(); snap != nil {
		t.Fatalf("an expired certificate was made current (not after %v)", snap.Chain[0].NotAfter)
	}
	addr := serve(t, src, Config{AllowUIDs: []uint32{uint32(os.Geteuid())}}, 0o600)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := dialRaw(t, addr).FetchX509SVID(withHeader(ctx), &workloadpb.X509SVIDRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// Whether the server opens the stream before or after the valid
	// identity arrives, its first message is the valid one.
	valid := newIdentity(t, "td", 2)
	h.set(valid)
	src.Reload()
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(resp.Svids[0].X509Svid)
	if err != nil {
		t.Fatal(err)
	}
	if !leaf.Equal(valid.Leaf()) {
		t.Fatalf("the first SVID served is serial %v (not after %v), want the valid one", leaf.SerialNumber, leaf.NotAfter)
	}
}

// Reload judges expiry by the source's clock (now), not time.Now: a
// certificate valid by the wall clock but expired by that clock is not
// made current.
func TestReloadUsesTheSourcesClock(t *testing.T) {
	id := newIdentity(t, "td", 1)
	src := NewSource((&holder{id: id}).load, slog.New(slog.DiscardHandler))
	src.now = func() time.Time { return id.Leaf().NotAfter.Add(time.Minute) }
	src.Reload()
	if snap, _ := src.Current(); snap != nil {
		t.Fatalf("a certificate expired by the source's clock (not after %v) was made current", snap.Chain[0].NotAfter)
	}
	src.now = func() time.Time { return id.Leaf().NotAfter.Add(-time.Minute) }
	src.Reload()
	if snap, _ := src.Current(); snap == nil {
		t.Fatal("a certificate valid by the source's clock was not made current")
	}
}

// The expiry of the certificate served is judged by the server's clock
// (s.now), as the rest of the server is: a snapshot past its NotAfter by
// that clock is not served. It was judged by time.Now.
func TestX509SVIDResponseUsesTheServersClock(t *testing.T) {
	h := &holder{id: newIdentity(t, "td", 1)}
	src := NewSource(h.load, slog.New(slog.DiscardHandler))
	src.Reload()
	snap, _ := src.Current()
	if snap == nil {
		t.Fatal("no current snapshot")
	}
	s := NewServer(src, Config{})
	for _, tc := range []struct {
		at   time.Time
		want bool
	}{
		{snap.Chain[0].NotAfter.Add(-time.Minute), true},
		{snap.Chain[0].NotAfter, false},
		{snap.Chain[0].NotAfter.Add(time.Minute), false},
	} {
		s.now = func() time.Time { return tc.at }
		resp, err := s.x509SVIDResponse(snap)
		if err != nil {
			t.Fatal(err)
		}
		if got := resp != nil; got != tc.want {
			t.Errorf("at %v (not after %v): served %v, want %v", tc.at, snap.Chain[0].NotAfter, got, tc.want)
		}
	}
}

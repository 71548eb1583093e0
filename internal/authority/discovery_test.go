package authority

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/discovery"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// fakeDiscovery answers ReportJoin with the code set for the node, after
// checking the signature as discovery does; it records what it accepted.
type fakeDiscovery struct {
	musterv1.DiscoveryServiceClient
	policy *ca.Issuer

	mu      sync.Mutex
	answers map[string]codes.Code // by node ID; OK by default
	got     []discovery.JoinReport
}

func (f *fakeDiscovery) answer(node string, c codes.Code) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answers[node] = c
}

func (f *fakeDiscovery) received() []discovery.JoinReport {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.got)
}

func (f *fakeDiscovery) ReportJoin(ctx context.Context, req *musterv1.ReportJoinRequest, _ ...grpc.CallOption) (*musterv1.ReportJoinResponse, error) {
	r := discovery.JoinReport{AuthorityID: req.GetAuthorityId(), NodeID: req.GetNodeId(), InstanceID: req.GetInstanceId(),
		TicketID: req.GetTicketId(), JoinedAt: req.GetJoinedAt().AsTime()}
	if err := r.Verify(f.policy.Cert, req.GetSignature()); err != nil {
		return nil, status.Error(codes.PermissionDenied, err.Error())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.answers[r.NodeID]; c != codes.OK {
		return nil, status.Error(c, "refused by the test")
	}
	f.got = append(f.got, r)
	return &musterv1.ReportJoinResponse{Recorded: true}, nil
}

// metricValue reads a counter or a gauge.
func metricValue(m prometheus.Metric) float64 {
	var pb dto.Metric
	if err := m.Write(&pb); err != nil {
		return -1
	}
	if g := pb.GetGauge(); g != nil {
		return g.GetValue()
	}
	return pb.GetCounter().GetValue()
}

// newReportLink is a discovery link to a fake discovery, on a fresh
// SQLite store.
func newReportLink(t *testing.T) (*discoveryLink, *fakeDiscovery, store.Store) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	h, err := ca.Create("test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{info: datadir.Info{AuthorityID: "test-abcdef"}, ca: h, store: st, metrics: newMetrics("test"),
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	f := &fakeDiscovery{policy: h.Issuer(ca.RolePolicy), answers: map[string]codes.Code{}}
	d := &discoveryLink{s: s, cfg: DiscoveryConfig{Address: "discovery.test:7450"}, client: f, joined: make(chan struct{}, 1)}
	return d, f, st
}

// ticketJoin commits a PSK join of node that used a referral ticket, so
// the store holds its pending report, and returns the instance.
func ticketJoin(t *testing.T, st store.Store, node string) store.Instance {
	t.Helper()
	now := time.Now().UTC().Truncate(time.Microsecond)
	key := sha256.Sum256([]byte(node))
	res, err := st.CommitJoin(t.Context(), store.Join{
		Credential: "psk-1",
		NodeID:     node,
		Ticket:     &store.TicketUse{ID: "jti-" + node, KeepUntil: now.Add(time.Hour)},
		Instance:   store.Instance{ID: "instance-" + node, JoinMethod: store.JoinMethodPSK, CreatedAt: now},
		Certificate: store.Certificate{Serial: "5e" + node[len(node)-1:], PublicKey: key[:],
			NotBefore: now, NotAfter: now.Add(time.Hour), IssuedAt: now},
	})
	if err != nil {
		t.Fatal(err)
	}
	return res.Instance
}

func pendingIDs(t *testing.T, st store.Store) []string {
	t.Helper()
	rs, err := st.ListPendingReports(t.Context(), 100)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range rs {
		ids = append(ids, r.InstanceID)
	}
	return ids
}

// TestDeliverReports: a pass sends the pending reports oldest first,
// signed with the policy key, and deletes those discovery answered or
// refused for good; an unavailable discovery ends the pass and keeps the
// rest.
func TestDeliverReports(t *testing.T) {
	d, f, st := newReportLink(t)
	in1 := ticketJoin(t, st, "node-1")
	ticketJoin(t, st, "node-2")
	ticketJoin(t, st, "node-3")
	ticketJoin(t, st, "node-4")
	f.answer("node-2", codes.PermissionDenied)
	f.answer("node-3", codes.InvalidArgument)
	f.answer("node-4", codes.Unavailable)

	more, err := d.deliverReports(t.Context())
	if err == nil || more {
		t.Fatalf("deliverReports = %v, %v; want the Unavailable error", more, err)
	}
	if got := pendingIDs(t, st); !slices.Equal(got, []string{"instance-node-4"}) {
		t.Errorf("pending after the pass: %v, want node-4's only (delivered and refused-for-good ones dropped)", got)
	}
	got := f.received()
	want := discovery.JoinReport{AuthorityID: "test-abcdef", NodeID: "node-1", InstanceID: in1.ID, TicketID: "jti-node-1", JoinedAt: in1.CreatedAt}
	if len(got) != 1 || got[0] != want {
		t.Errorf("discovery received %+v, want [%+v]", got, want)
	}
	for code, n := range map[string]float64{"OK": 1, "PermissionDenied": 1, "InvalidArgument": 1, "Unavailable": 1} {
		if v := metricValue(d.s.metrics.discovery.WithLabelValues("report", code)); v != n {
			t.Errorf("muster_discovery_calls_total{operation=report,code=%s} = %v, want %v", code, v, n)
		}
	}

	// Once discovery is back, the report goes, and the pass is clean.
	f.answer("node-4", codes.OK)
	if more, err := d.deliverReports(t.Context()); err != nil || more {
		t.Fatalf("deliverReports = %v, %v", more, err)
	}
	if got := pendingIDs(t, st); len(got) != 0 {
		t.Errorf("pending after the second pass: %v", got)
	}
}

// TestReportLoop: the leader job delivers at once after a join, backs off
// while discovery is unavailable, and keeps the gauge.
func TestReportLoop(t *testing.T) {
	d, f, st := newReportLink(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- d.reportLoop(ctx) }()
	defer func() { cancel(); <-done }()

	waitFor := func(what string, within time.Duration, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(within); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v", what, within)
			}
		}
	}
	gauge := func() float64 { return metricValue(d.s.metrics.reportsPending) }

	// The first pass finds nothing; a join wakes the loop well before
	// its poll.
	time.Sleep(50 * time.Millisecond)
	ticketJoin(t, st, "node-1")
	d.reportJoined()
	waitFor("the report delivered after the nudge", reportPoll/2, func() bool { return len(f.received()) == 1 })
	waitFor("the gauge back to 0", time.Second, func() bool { return gauge() == 0 })

	// Discovery unavailable: the report stays, and the gauge says so.
	f.answer("node-2", codes.Unavailable)
	ticketJoin(t, st, "node-2")
	d.reportJoined()
	waitFor("the gauge at 1", time.Second, func() bool { return gauge() == 1 })
	// Back: delivered after the backoff, with no nudge.
	f.answer("node-2", codes.OK)
	waitFor("the report delivered after the backoff", 3*reportBackoff, func() bool { return len(f.received()) == 2 })
	waitFor("the gauge back to 0", time.Second, func() bool { return gauge() == 0 })
	if got := pendingIDs(t, st); len(got) != 0 {
		t.Errorf("pending: %v", got)
	}
}

// TestRegistrationBundleAcrossRootRotations: the authority registers the
// root its ID names alone until a root rotation; then that root, the
// trusted roots (signing first) and the links to them, taking a first
// rotation's link from what discovery holds once the second rotation's
// record no longer has it. Each bundle passes discovery's check.
func TestRegistrationBundleAcrossRootRotations(t *testing.T) {
	now := time.Now()
	h, err := ca.Create("prod", now)
	if err != nil {
		t.Fatal(err)
	}
	b := h.Root
	newRoot := func() (*x509.Certificate, crypto.Signer) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		serial, _ := ca.NewSerial()
		r, err := ca.NewRoot("prod", serial, key, now)
		if err != nil {
			t.Fatal(err)
		}
		return r, key
	}
	cross := func(sub, iss *x509.Certificate, key crypto.Signer) *x509.Certificate {
		c, err := ca.CrossSign(sub, iss, key, now)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	r1, k1 := newRoot()
	r2, k2 := newRoot()
	r1ByB, bByR1 := cross(r1, b, h.RootKey), cross(b, r1, k1)
	r2ByR1, r1ByR2 := cross(r2, r1, k1), cross(r1, r2, k2)

	check := func(name, bundle string, want ...*x509.Certificate) {
		t.Helper()
		roots, err := discovery.ParseRoots(bundle)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !roots.Anchor.Equal(b) {
			t.Errorf("%s: the bundle does not start with the root the ID names", name)
		}
		if err := roots.Check(now); err != nil {
			t.Errorf("%s: discovery would refuse it: %v", name, err)
		}
		var wantFP []string
		for _, c := range want {
			wantFP = append(wantFP, ca.Fingerprint(c))
		}
		if !slices.Equal(roots.Fingerprints(), wantFP) {
			t.Errorf("%s: roots %v; want %v", name, roots.Fingerprints(), wantFP)
		}
	}
	bundle, err := registrationBundle(b, &ca.RootSet{Trusted: []*x509.Certificate{b}, Signing: b}, "", now)
	if err != nil || bundle != string(ca.EncodeCertPEM(b)) {
		t.Fatalf("no rotation: %v; want the root alone, as before root rotation", err)
	}
	phases := []struct {
		name  string
		roots *ca.RootSet
		want  []*x509.Certificate
	}{
		{"init", &ca.RootSet{Trusted: []*x509.Certificate{b, r1}, Cross: []*x509.Certificate{r1ByB, bByR1}, Signing: b}, []*x509.Certificate{b, r1}},
		{"update_servers", &ca.RootSet{Trusted: []*x509.Certificate{r1, b}, Cross: []*x509.Certificate{r1ByB, bByR1}, Signing: r1}, []*x509.Certificate{r1, b}},
		{"standby", &ca.RootSet{Trusted: []*x509.Certificate{r1}, Cross: []*x509.Certificate{r1ByB}, Signing: r1}, []*x509.Certificate{r1}},
		// The second rotation's record has only its own links.
		{"second init", &ca.RootSet{Trusted: []*x509.Certificate{r1, r2}, Cross: []*x509.Certificate{r2ByR1, r1ByR2}, Signing: r1}, []*x509.Certificate{r1, r2}},
		{"second standby", &ca.RootSet{Trusted: []*x509.Certificate{r2}, Cross: []*x509.Certificate{r2ByR1}, Signing: r2}, []*x509.Certificate{r2}},
	}
	registered := bundle
	for _, p := range phases {
		if registered, err = registrationBundle(b, p.roots, registered, now); err != nil {
			t.Fatalf("%s: %v", p.name, err)
		}
		check(p.name, registered, p.want...)
	}
	// Without what discovery held (the registration forgotten), the
	// second rotation's roots cannot be linked, and the error says so.
	if _, err := registrationBundle(b, phases[4].roots, "", now); !errors.Is(err, discovery.ErrRootNotLinked) || !strings.Contains(err.Error(), "forgotten") {
		t.Errorf("second rotation with nothing registered: %v", err)
	}
}

// TestKeysPinMismatchSaidOnce: a fetch of discovery's ticket keys refused
// for a pin mismatch, every minute on every replica, is logged once until
// a fetch succeeds or fails otherwise; other failures are logged each
// time.
func TestKeysPinMismatchSaidOnce(t *testing.T) {
	d, _, _ := newReportLink(t)
	var buf strings.Builder
	d.s.log = slog.New(slog.NewTextHandler(&buf, nil))
	pin := errors.New(`Get "https://discovery.test:7450/.well-known/jwks.json": discoveryclient: the discovery's certificate does not match the pinned fingerprint sha256:00: nothing was sent"`)
	other := errors.New("connection refused")
	for _, c := range []struct {
		err  error
		logs int
	}{{pin, 1}, {pin, 1}, {pin, 1}, {nil, 1}, {pin, 2}, {pin, 2}, {other, 3}, {other, 4}, {pin, 5}} {
		d.keysRefreshed(c.err)
		if n := strings.Count(buf.String(), "cannot fetch discovery's ticket keys"); n != c.logs {
			t.Fatalf("after %v: %d warnings, want %d\n%s", c.err, n, c.logs, buf.String())
		}
	}
}

// TestKeysRefreshConfigured: discovery.keys_refresh sets the period of
// the scheduled fetch of discovery's ticket keys (a minute when unset),
// and one longer than the default says at start what it costs: a revoked
// key's tickets accepted for longer.
func TestKeysRefreshConfigured(t *testing.T) {
	h, err := ca.Create("test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		configured, want time.Duration
		warn             bool
	}{{0, time.Minute, false}, {30 * time.Second, 30 * time.Second, false}, {time.Minute, time.Minute, false}, {5 * time.Minute, 5 * time.Minute, true}} {
		var buf strings.Builder
		s := &Server{info: datadir.Info{AuthorityID: "test-abcdef"}, ca: h, log: slog.New(slog.NewTextHandler(&buf, nil))}
		d, err := newDiscoveryLink(s, DiscoveryConfig{Address: "discovery.test:7450", Policy: discovery.DefaultPolicy(), KeysRefresh: tt.configured})
		if err != nil {
			t.Fatal(err)
		}
		d.conn.Close()
		if d.keys.Every != tt.want {
			t.Errorf("keys_refresh %s: the keys are fetched every %s, want %s", tt.configured, d.keys.Every, tt.want)
		}
		if got := strings.Contains(buf.String(), "may be accepted for up to "+tt.want.String()); got != tt.warn {
			t.Errorf("keys_refresh %s: warned %v, want %v:\n%s", tt.configured, got, tt.warn, buf.String())
		}
	}
}

package authority

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

// storeIntermediate stores an agent intermediate issued at issued for ttl
// and activates it, so the test can place a rotation's deadlines.
func storeIntermediate(t *testing.T, ctx context.Context, a *benchAuthority, issued time.Time, ttl time.Duration) store.CACert {
	t.Helper()
	in := a.srvs[0].inter
	serial, _ := ca.NewSerial()
	k, err := in.custody.Create(ctx, keyName("agent", serial.Text(16)), custody.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := a.h.NewIntermediate(ca.RoleAgent, serial, k.Public, a.h.RootKey, issued, ttl)
	if err != nil {
		t.Fatal(err)
	}
	row := store.CACert{Role: "agent", Serial: serial.Text(16), CertDER: cert.Raw, KeyRef: k.Ref, State: store.CAPrepared, NotAfter: cert.NotAfter}
	if err := a.store.InsertCACert(ctx, row, setupLink); err != nil {
		t.Fatal(err)
	}
	if err := a.store.ActivateCACert(ctx, "agent", row.Serial, setupLink); err != nil {
		t.Fatal(err)
	}
	return row
}

// noCAClock is the startReplicas option of tests that take the CA clock's
// steps themselves (caStepAt) on rows they write to the store: every
// replica is a follower, so no background clock steps in between at the
// real now. One that did, between the test's activation of an expired
// intermediate and its insert of the next, prepared a successor of its
// own: the test's insert then conflicted on the one prepared row a role
// may have, or the clock's lost and it destroyed its new key (a
// destruction the test did not expect).
func noCAClock(c *Config) { c.Store = followerStore{c.Store.(*sqlite.SQLite)} }

// TestCAClockRotates: the leader's step prepares a successor once half the
// active intermediate's life has passed, activates it at two thirds, and
// retires a retiring one whose not-after has passed, each audited.
func TestCAClockRotates(t *testing.T) {
	a := startReplicas(t, nil, 1, noCAClock, func(c *Config) { c.CAIntermediateTTL = 3 * time.Minute })
	ctx := t.Context()
	s := a.srvs[0]
	now := time.Now()
	expired := storeIntermediate(t, ctx, a, now.Add(-10*time.Minute), 5*time.Minute)
	current := storeIntermediate(t, ctx, a, now.Add(-130*time.Second), 3*time.Minute) // past 2/3
	states := func() map[string]string {
		m := map[string]string{}
		rows, err := a.store.ListCACerts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.Role == "agent" {
				m[r.Serial] = r.State
			}
		}
		return m
	}
	if err := s.caStep(ctx); err != nil {
		t.Fatal(err)
	}
	st := states()

	if st[expired.Serial] != store.CARetired || st[current.Serial] != store.CAActive || len(st) != 4 {
		t.Fatalf("after the first step: %v; want the expired one retired, the current one active, a successor prepared", st)
	}
	var next string
	for serial, state := range st {
		if state == store.CAPrepared {
			next = serial
		}
	}
	if next == "" {
		t.Fatalf("no successor prepared: %v", st)
	}
	// Past two thirds, but prepared just now: it is not activated until
	// every replica has had caPublishWindow to publish it.
	if err := s.caStep(ctx); err != nil {
		t.Fatal(err)
	}
	if st := states(); st[next] != store.CAPrepared || st[current.Serial] != store.CAActive {
		t.Fatalf("a step within the publish window: %v; want %s still prepared and %s active", st, next, current.Serial)
	}
	storeNow, err := a.store.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.caStepAt(ctx, storeNow.Add(s.caPublishWindow())); err != nil {
		t.Fatal(err)
	}
	if st := states(); st[next] != store.CAActive || st[current.Serial] != store.CARetiring {
		t.Fatalf("after the publish window: %v; want %s active and %s retiring", st, next, current.Serial)
	}
	// Nothing else is due: the new one is fresh, the other roles a year old.
	if err := s.caStep(ctx); err != nil {
		t.Fatal(err)
	}
	if st := states(); len(st) != 4 {
		t.Fatalf("a third step changed something: %v", st)
	}
	recs, err := a.store.ListAudit(ctx, store.AuditFilter{Action: "ca.*"})
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, r := range recs {
		if r.Action == "ca.destroy_key" {
			continue // after its ca.retire, as TestRetiredIntermediateGivesUpItsKey checks
		}
		actions = append(actions, r.Action+" "+r.Target)
	}
	// The retirement and the preparation are independent steps of one
	// tick (the running leader's own tick may take either first); the
	// activation comes after the preparation.
	want := []string{"ca.retire agent/" + expired.Serial, "ca.prepare agent/" + next, "ca.activate agent/" + next}
	got := actions[len(actions)-3:]
	if got[2] != want[2] || !((got[0] == want[0] && got[1] == want[1]) || (got[0] == want[1] && got[1] == want[0])) {
		t.Fatalf("audited %v, want %v last", actions, want)
	}
}

// TestCAClockFollowsAShorterTTL: intermediates made longer-lived than
// ca.intermediate_ttl (muster init's year) are rotated on the setting's
// schedule, so lowering it takes effect: half of a 2-minute life after
// init, successors are prepared, not before.
func TestCAClockFollowsAShorterTTL(t *testing.T) {
	a := startReplicas(t, nil, 1, func(c *Config) { c.CAIntermediateTTL = 2 * time.Minute })
	ctx := t.Context()
	issued := a.h.Issuers[ca.RoleAgent].Cert.NotBefore.Add(ca.Backdate)
	if err := a.srvs[0].caStepAt(ctx, issued.Add(50*time.Second)); err != nil {
		t.Fatal(err)
	}
	if rows, _ := a.store.ListCACerts(ctx); len(rows) != 4 {
		t.Fatalf("%d CA certificates before half of the 2m life, want init's 4", len(rows))
	}
	if err := a.srvs[0].caStepAt(ctx, issued.Add(61*time.Second)); err != nil {
		t.Fatal(err)
	}
	rows, err := a.store.ListCACerts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	prepared := map[string]bool{}
	for _, r := range rows {
		if r.State == store.CAPrepared {
			prepared[r.Role] = true
			if got := r.NotAfter.Sub(r.CreatedAt); got < time.Minute || got > 2*time.Minute+time.Second {
				t.Errorf("%s successor lives %v from its creation, want the 2m setting", r.Role, got)
			}
		}
	}
	if len(prepared) != 4 {
		t.Fatalf("prepared successors for %v, want every role", prepared)
	}
}

// TestCAClockWarnsOnceWithoutTheRootKey: a successor due with no root key
// is logged as a warning once a day per role, not at every tick, naming
// the command that prepares it with the offline root key.
func TestCAClockWarnsOnceWithoutTheRootKey(t *testing.T) {
	a := startReplicas(t, nil, 1, func(c *Config) { c.CAIntermediateTTL = 2 * time.Minute })
	ctx := t.Context()
	var logs syncBuffer
	s := &Server{store: a.store, ca: &ca.Hierarchy{Root: a.h.Root, Issuers: a.h.Issuers}, cfg: Config{CAIntermediateTTL: 2 * time.Minute},
		log: slog.New(slog.NewTextHandler(&logs, nil))}
	issued := a.h.Issuers[ca.RoleAgent].Cert.NotBefore.Add(ca.Backdate)
	for _, at := range []time.Duration{61 * time.Second, 66 * time.Second, 71 * time.Second} {
		if err := s.caStepAt(ctx, issued.Add(at)); err != nil {
			t.Fatal(err)
		}
	}
	if rows, _ := a.store.ListCACerts(ctx); len(rows) != 4 {
		t.Fatalf("%d CA certificates without the root key, want init's 4", len(rows))
	}
	out := logs.String()
	for _, role := range caRoles {
		if n := strings.Count(out, "role="+string(role)+" "); n != 1 {
			t.Errorf("role %s warned %d times in 3 ticks, want once:\n%s", role, n, out)
		}
	}
	if n := strings.Count(out, "level=WARN"); n != len(caRoles) || !strings.Contains(out, "muster ca rotate agent --root-key FILE") {
		t.Errorf("the warnings (%d) do not say what to do:\n%s", n, out)
	}
	// A day later, once more.
	if err := s.caStepAt(ctx, issued.Add(71*time.Second+caWarnEvery)); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "role=agent "); n != 2 {
		t.Errorf("role agent warned %d times after a day, want twice:\n%s", n, logs.String())
	}
}

// TestRotationBlockedFrom60DaysBeforeHalfLife: with the root key absent
// and no successor prepared, the warning (muster status, the metric, the
// log) starts 60 days before half the active intermediate's life, names
// the command, and stops once a successor is prepared or with the root
// key present.
func TestRotationBlockedFrom60DaysBeforeHalfLife(t *testing.T) {
	h, err := ca.Create("warn", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	a := h.Issuers[ca.RoleAgent].Cert
	due := a.NotBefore.Add(ca.Backdate).Add(a.NotAfter.Sub(a.NotBefore.Add(ca.Backdate)) / 2)
	offline := &Server{ca: &ca.Hierarchy{Root: h.Root, Issuers: h.Issuers}}
	online := &Server{ca: h}
	for _, tt := range []struct {
		name     string
		s        *Server
		prepared bool
		at       time.Time
		warn     bool
	}{
		{"61 days before", offline, false, due.Add(-61 * 24 * time.Hour), false},
		{"59 days before", offline, false, due.Add(-59 * 24 * time.Hour), true},
		{"overdue", offline, false, due.Add(time.Hour), true},
		{"prepared", offline, true, due.Add(time.Hour), false},
		{"root key present", online, false, due.Add(-time.Hour), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := tt.s.rotationBlocked(ca.RoleAgent, a, tt.prepared, tt.at)
			if (w != "") != tt.warn {
				t.Fatalf("warning %q, want one: %v", w, tt.warn)
			}
			if tt.warn && !strings.Contains(w, "muster ca rotate agent --root-key FILE") {
				t.Errorf("the warning does not name the command: %q", w)
			}
		})
	}
}

// TestRetiredWhenItsLastLeafExpired: an intermediate replaced long before
// its own expiry (init's year) is retired once the longest leaf it could
// have signed before it stopped being active has expired, not at its own
// not-after; one whose not-after comes first is retired then.
func TestRetiredWhenItsLastLeafExpired(t *testing.T) {
	a := startReplicas(t, nil, 1, func(*Config) {})
	ctx := t.Context()
	s := a.srvs[0]
	rows, err := a.store.ListCACerts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	old := map[string]store.CACert{}
	for _, r := range rows {
		if r.State == store.CAActive {
			old[r.Role] = r
		}
	}
	for _, role := range caRoles {
		next, err := s.inter.prepare(ctx, role, a.h.RootKey, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.store.ActivateCACert(ctx, string(role), next.Serial, setupLink); err != nil {
			t.Fatal(err)
		}
	}
	stopped, err := a.store.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	state := func(r store.CACert) string {
		rows, err := a.store.ListCACerts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range rows {
			if x.Serial == r.Serial {
				return x.State
			}
		}
		return "gone"
	}
	// Server and bootstrap leaves live a day, agents' at most a week.
	steps := []struct {
		at                time.Duration
		retiring, retired []ca.Role
	}{
		{serverCertTTL, []ca.Role{ca.RoleServer, ca.RoleBootstrap, ca.RoleAgent}, nil},
		{serverCertTTL + retireMargin + time.Second, []ca.Role{ca.RoleAgent}, []ca.Role{ca.RoleServer, ca.RoleBootstrap}},
		{maxLeafTTL, []ca.Role{ca.RoleAgent}, nil},
		{maxLeafTTL + retireMargin + time.Second, nil, []ca.Role{ca.RoleAgent}},
	}
	for _, st := range steps {
		if err := s.caStepAt(ctx, stopped.Add(st.at)); err != nil {
			t.Fatal(err)
		}
		for _, role := range st.retiring {
			if got := state(old[string(role)]); got != store.CARetiring {
				t.Fatalf("%s after %s: %s while a leaf it signed may be valid; want retiring", role, st.at, got)
			}
		}
		for _, role := range st.retired {
			if got := state(old[string(role)]); got != store.CARetired {
				t.Fatalf("%s after %s: %s once its last leaf expired; want retired", role, st.at, got)
			}
		}
	}
	// Operator identities may live a year: the admin intermediate is
	// retired at its own not-after.
	if got := lastLeafExpiry(store.CACert{Role: string(ca.RoleAdmin), RetiringAt: stopped, NotAfter: old["admin"].NotAfter}); !got.Equal(old["admin"].NotAfter) {
		t.Fatalf("admin: retired at %s, want its not-after %s", got, old["admin"].NotAfter)
	}
}

// hangingCAStore hangs its first ListCACerts until the caller's deadline,
// and fails the later ones at once, counting them.
type hangingCAStore struct {
	store.Store
	calls atomic.Int32
}

func (h *hangingCAStore) ListCACerts(ctx context.Context) ([]store.CACert, error) {
	if h.calls.Add(1) == 1 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return nil, errors.New("listing failed")
}

// A CA clock step whose store call hangs ends at the step's deadline and
// the clock ticks again, instead of stopping the leader's rotations.
func TestCAClockStepHasADeadline(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openSQLite(t)
	st := &hangingCAStore{Store: db}
	s := &Server{store: st, log: slog.New(slog.DiscardHandler), caStepTimeout: 200 * time.Millisecond}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.caClock(cctx) }()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(s.caStepTimeout + 3*caTick)
	for st.calls.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("after a hung store call the CA clock took no further step: the step has no deadline")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCAStepFailureReportedOnce: a CA step that fails at every tick in the
// same way (its token away) is logged and audited once, not at every
// tick; another failure, or the same one after the step succeeded, is
// reported again. (A token away for an hour wrote 2,880 ca.prepare error
// records.)
func TestCAStepFailureReportedOnce(t *testing.T) {
	t.Parallel()
	a := startReplicas(t, nil, 1, noCAClock)
	s, ctx := a.srvs[0], t.Context()
	away := errors.New("custody: the PKCS#11 token is unavailable")
	for range 3 {
		s.caChange(ctx, "ca.prepare", "agent", "", "", nil, away)
	}
	s.caChange(ctx, "ca.prepare", "server", "", "", nil, away)
	s.caChange(ctx, "ca.prepare", "agent", "", "", nil, errors.New("custody: another failure"))
	s.caChange(ctx, "ca.prepare", "agent", "ab12", "half of its life", nil, nil)
	s.caChange(ctx, "ca.prepare", "agent", "", "", nil, away)
	recs, err := a.store.ListAudit(ctx, store.AuditFilter{Action: "ca.prepare"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		got = append(got, r.Target+" "+string(r.Result))
	}
	want := []string{"agent error", "server error", "agent error", "agent/ab12 ok", "agent error"}
	if !slices.Equal(got, want) {
		t.Errorf("ca.prepare records %v, want %v", got, want)
	}
}

// TestCAClockDiscardsAnExpiredSuccessor: a prepared successor whose
// not-after has passed by the time the leader looks (the authority was
// stopped past it, or its store restored from a backup that held it) is
// discarded, audited with why, not activated: activated, the role would
// issue nothing ("it issues nothing"), until the next look after that
// prepared and published another. The active one signs on meanwhile.
func TestCAClockDiscardsAnExpiredSuccessor(t *testing.T) {
	a := startReplicas(t, nil, 1, noCAClock, func(c *Config) { c.CAIntermediateTTL = 3 * time.Minute })
	ctx := t.Context()
	s := a.srvs[0]
	current := storeIntermediate(t, ctx, a, time.Now().Add(-130*time.Second), 3*time.Minute) // past 2/3
	if err := s.caStep(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := a.store.ListCACerts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var next store.CACert
	for _, r := range rows {
		if r.Role == "agent" && r.State == store.CAPrepared {
			next = r
		}
	}
	if next.Serial == "" {
		t.Fatal("no successor prepared")
	}
	if err := s.caStepAt(ctx, next.NotAfter.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	rows, err = a.store.ListCACerts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		switch r.Serial {
		case next.Serial:
			if r.State != store.CARetired {
				t.Errorf("the successor that expired before its activation is %s, want discarded (retired)", r.State)
			}
		case current.Serial:
			if r.State != store.CAActive {
				t.Errorf("the active intermediate is %s, want still active", r.State)
			}
		}
	}
	recs, err := a.store.ListAudit(ctx, store.AuditFilter{Action: "ca.discard"})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Target != "agent/"+next.Serial || !strings.Contains(recs[0].Reason, "expired at") {
		t.Fatalf("ca.discard records: %+v; want one for agent/%s saying it expired", recs, next.Serial)
	}
}

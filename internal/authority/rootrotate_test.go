package authority

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	crand "crypto/rand"
	"crypto/x509"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/pgtest"
	"github.com/muster-dev/muster/internal/store/postgres"
	"github.com/muster-dev/muster/internal/trustbundle"
)

// rootModel is the phase machine as the design states it: rotate from none
// or standby to init; next-phase init → update_agents → update_servers →
// standby; rollback one phase back, from init to none (abandoning the new
// root).
type rootModel struct {
	phase string
	// made counts the roots made so far; cur is the index of the root a
	// rotation replaces, next the one replacing it (-1: none).
	made, cur, next int
}

func (m *rootModel) apply(op string) bool {
	switch op {
	case "rotate":
		if m.phase != store.RootPhaseNone && m.phase != store.RootPhaseStandby {
			return false
		}
		if m.phase == store.RootPhaseStandby {
			m.cur = m.next
		}
		m.next = m.made
		m.made++
		m.phase = store.RootPhaseInit
	case "next":
		i := phaseIndex(m.phase)
		if i < 0 || m.phase == store.RootPhaseStandby {
			return false
		}
		m.phase = rootPhases[i+1]
	case "rollback":
		switch i := phaseIndex(m.phase); {
		case i < 0:
			return false
		case i == 0:
			m.phase, m.next = store.RootPhaseNone, -1
		default:
			m.phase = rootPhases[i-1]
		}
	}
	return true
}

func phaseIndex(p string) int {
	for i, q := range rootPhases {
		if q == p {
			return i
		}
	}
	return -1
}

// fastCAClock has the leader's CA clock step every 100 ms and activate an
// intermediate 200 ms after it was prepared, for the tests that step a
// root rotation to update_servers or roll it back to update_agents: the
// step answers once the leader has prepared and activated intermediates
// under the root that signs (awaitIntermediatesUnder), which the 10 s publish
// window makes about 10 s each time (the clock wakes at its end,
// TestCAClockWakesAtPublishWindowEnd). What these tests
// check (the phases, the roots, which intermediates are active and under
// which root) is the same at any tick; the publish window is
// TestActivateOnceAcrossReplicas's and TestCALifecycleModel's.
func fastCAClock(c *Config) {
	c.CATick = 100 * time.Millisecond
	c.CAPublishWindow = 200 * time.Millisecond
}

// TestRootRotationModel drives the authority's root rotation with a fixed
// random sequence of rotate, next-phase and rollback, checked against
// rootModel after every step, with the leader's CA steps taken between
// them. Invariants: the trusted set never empties; it holds the root every
// active intermediate is signed by, which is the phase's signing root (the
// new one from update_servers on); the listener's chain verifies for an
// agent that pins any trusted root; in standby the old root is not
// trusted; and a refused step (the model says it is not allowed) changes
// nothing.
func TestRootRotationModel(t *testing.T) {
	t.Parallel()
	a := startReplicas(t, nil, 1, fastCAClock)
	s := a.srvs[0]
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(21, 4))
	m := &rootModel{phase: store.RootPhaseNone, made: 1, next: -1}
	// fps[i] is the fingerprint of the model's root i.
	fps := []string{ca.Fingerprint(a.h.Root)}
	ops := []string{"rotate", "next", "next", "rollback"}
	// rolledBack records the phases a rollback left, so the sequence is
	// known to cover every one.
	rolledBack := map[string]bool{}
	for step := range 60 {
		op := ops[rng.IntN(len(ops))]
		before, err := s.rootStatus(ctx)
		if err != nil {
			t.Fatal(err)
		}
		allowed := m.apply(op)
		var st RootStatus
		switch op {
		case "rotate":
			st, err = s.rotateRoot(ctx, "test", nil)
		case "next":
			_, st, err = s.stepRoot(ctx, "test", rootNext)
		case "rollback":
			_, st, err = s.stepRoot(ctx, "test", rootBackNow)
		}
		if allowed != (err == nil) {
			t.Fatalf("step %d %s from %s: err %v, model allows: %v", step, op, before.Phase, err, allowed)
		}
		if err != nil {
			if !errors.As(err, new(rootRule)) {
				t.Fatalf("step %d %s: refusal %v is not a rootRule (FAILED_PRECONDITION)", step, op, err)
			}
			after, _ := s.rootStatus(ctx)
			if after.Version != before.Version {
				t.Fatalf("step %d: a refused %s wrote the rotation (version %d → %d)", step, op, before.Version, after.Version)
			}
			continue
		}
		if op == "rotate" {
			fps = append(fps, ca.Fingerprint(st.New))
			if len(fps) != m.made {
				t.Fatalf("step %d: the model counts %d roots, the authority made %d", step, m.made, len(fps))
			}
		}
		if op == "rollback" {
			rolledBack[before.Phase] = true
		}
		if st.Phase != m.phase {
			t.Fatalf("step %d %s: phase %s, model %s", step, op, st.Phase, m.phase)
		}
		// The leader's steps, until none is due.
		for range 3 {
			if err := s.caStep(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.inter.load(ctx); err != nil {
			t.Fatal(err)
		}
		checkRootInvariants(t, ctx, a, s, m, fps, step)
	}
	for _, p := range rootPhases {
		if !rolledBack[p] {
			t.Errorf("the sequence never rolled back from %s; change the seed or the length", p)
		}
	}
	if len(fps) < 3 {
		t.Errorf("the sequence made %d roots; want at least two rotations", len(fps))
	}
}

func checkRootInvariants(t *testing.T, ctx context.Context, a *benchAuthority, s *Server, m *rootModel, fps []string, step int) {
	t.Helper()
	rs := s.ca.Roots()
	if len(rs.Trusted) == 0 {
		t.Fatalf("step %d: the trusted set is empty", step)
	}
	trusted := map[string]bool{}
	for _, r := range rs.Trusted {
		trusted[ca.Fingerprint(r)] = true
	}
	wantSigning, wantTrusted := fps[m.cur], []int{m.cur}
	switch m.phase {
	case store.RootPhaseInit, store.RootPhaseUpdateAgents:
		wantTrusted = []int{m.cur, m.next}
	case store.RootPhaseUpdateServers:
		wantSigning, wantTrusted = fps[m.next], []int{m.cur, m.next}
	case store.RootPhaseStandby:
		wantSigning, wantTrusted = fps[m.next], []int{m.next}
	}
	if ca.Fingerprint(rs.Signing) != wantSigning || ca.Fingerprint(rs.Trusted[0]) != wantSigning {
		t.Fatalf("step %d (%s): signing root %s, model %s", step, m.phase, ca.Fingerprint(rs.Signing), wantSigning)
	}
	if len(trusted) != len(wantTrusted) {
		t.Fatalf("step %d (%s): %d trusted roots, model %d", step, m.phase, len(trusted), len(wantTrusted))
	}
	for _, i := range wantTrusted {
		if !trusted[fps[i]] {
			t.Fatalf("step %d (%s): root %d not trusted", step, m.phase, i)
		}
	}
	rows, err := a.store.ListCACerts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	active := 0
	for _, r := range rows {
		if r.State != store.CAActive {
			continue
		}
		active++
		c, _ := x509.ParseCertificate(r.CertDER)
		if c.CheckSignatureFrom(rs.Signing) != nil {
			t.Fatalf("step %d (%s): the active %s intermediate is not signed by the signing root", step, m.phase, r.Role)
		}
	}
	if active != len(caRoles) {
		t.Fatalf("step %d: %d active intermediates, want %d", step, active, len(caRoles))
	}
	// An agent trusting every root of the bundle takes all of it: the
	// bundle offers nothing under a root no longer trusted (in standby the
	// old root's retiring intermediates and its cross-certificate were
	// offered, and every agent logged each as not taken at every renewal).
	b := s.trustBundle().set
	taken, err := trustbundle.Take(trustbundle.Set{AuthorityID: b.AuthorityID, Roots: b.Roots}, nil, b, time.Now())
	if err != nil || len(taken.Refused) != 0 {
		t.Fatalf("step %d (%s): an agent trusting the bundle's roots refuses part of it: %v %q", step, m.phase, err, taken.Refused)
	}
	// The listener's chain: an agent pinning any trusted root accepts it.
	cert, err := s.certificate(ca.RoleServer, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	var chain []*x509.Certificate
	for _, der := range cert.Certificate {
		c, _ := x509.ParseCertificate(der)
		chain = append(chain, c)
	}
	want, _ := spiffeid.New(a.info.TrustDomain, spiffeid.RoleAuthority, a.info.AuthorityID)
	for _, r := range rs.Trusted {
		pool := x509.NewCertPool()
		pool.AddCert(r)
		if err := identity.VerifyPeer(chain, pool, identity.MatchID(want), x509.ExtKeyUsageServerAuth, time.Now()); err != nil {
			t.Fatalf("step %d (%s): an agent pinning trusted root %s refuses the listener: %v", step, m.phase, ca.Fingerprint(r), err)
		}
	}
	if !ca.MatchesFingerprint(chain[len(chain)-1], wantSigning) {
		t.Fatalf("step %d: the listener's chain does not end at the signing root", step)
	}
}

// TestRootRotationRefusals: the refusals say what to do.
func TestRootRotationRefusals(t *testing.T) {
	a := startReplicas(t, nil, 1)
	s := a.srvs[0]
	ctx := t.Context()
	for _, c := range []struct {
		do   func() error
		want string
	}{
		{func() error { _, _, err := s.stepRoot(ctx, "t", rootNext); return err }, "muster ca root rotate"},
		{func() error { _, _, err := s.stepRoot(ctx, "t", rootBackNow); return err }, "no root rotation to roll back"},
		{func() error { _, err := s.rotateRoot(ctx, "t", nil); return err }, ""},
		{func() error { _, err := s.rotateRoot(ctx, "t", nil); return err }, "muster ca root next-phase"},
	} {
		err := c.do()
		if c.want == "" {
			if err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("got %v, want a refusal naming %q", err, c.want)
		}
	}
}

// TestRootRotationWithoutRootKey: with the root key out of the data
// directory, rotate names --root-key; a prepared root whose cross-certificate
// the operator signed with the right key starts the rotation, and one
// signed with another key is refused.
func TestRootRotationWithoutRootKey(t *testing.T) {
	a := startReplicas(t, nil, 1)
	s := a.srvs[0]
	ctx := t.Context()
	rootKey := a.h.RootKey
	s.ca.RootKey = nil
	s.inter.load(ctx)
	if _, err := s.rotateRoot(ctx, "t", nil); err == nil || !strings.Contains(err.Error(), "--root-key") {
		t.Fatalf("rotate without the root key: %v; want a refusal naming --root-key", err)
	}
	root, cur, sealed, _, err := s.prepareRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := ca.Create("stranger", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	wrong, err := ca.CrossSign(root, stranger.Root, stranger.RootKey, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.rotateRoot(ctx, "t", &preparedRoot{cert: root.Raw, sealedKey: sealed, crossNewByOld: wrong.Raw}); err == nil {
		t.Fatal("a cross-certificate signed by another key started the rotation")
	}
	cross, err := ca.CrossSign(root, cur, rootKey, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.rotateRoot(ctx, "t", &preparedRoot{cert: root.Raw, sealedKey: []byte("forged"), crossNewByOld: cross.Raw}); err == nil {
		t.Fatal("a sealed key the authority did not make started the rotation")
	}
	st, err := s.rotateRoot(ctx, "t", &preparedRoot{cert: root.Raw, sealedKey: sealed, crossNewByOld: cross.Raw})
	if err != nil {
		t.Fatal(err)
	}
	if st.Phase != store.RootPhaseInit || !st.New.Equal(root) || len(st.Cross) != 2 {
		t.Fatalf("after rotate: %+v", st)
	}
}

// TestRootStandbyNeedsTheOperatorUnderTheNewRoot: next-phase to standby,
// asked with an operator certificate under the old root, is refused with
// the way out (muster admin renew), so the operator does not lock
// themself out; with one under the new root it goes on. Abandoning from
// init is refused the same way to an operator under the new root.
// update_servers answers once every active intermediate is under the new
// root, a rollback to update_agents once they are under the old one.
func TestRootStandbyNeedsTheOperatorUnderTheNewRoot(t *testing.T) {
	t.Parallel()
	a := startReplicas(t, nil, 1, fastCAClock)
	s := a.srvs[0]
	ctx := t.Context()
	if _, err := s.rotateRoot(ctx, "t", nil); err != nil {
		t.Fatal(err)
	}
	leafAs := func(issuer *ca.Issuer, role spiffeid.Role, name string) *x509.Certificate {
		t.Helper()
		k, _ := ecdsa.GenerateKey(elliptic.P256(), crand.Reader)
		id, _ := spiffeid.New(a.info.TrustDomain, role, name)
		leaf, err := issuer.Issue(ca.LeafRequest{PublicKey: k.Public(), SPIFFEID: id.URL(), CommonName: name, ClientAuth: true, NotBefore: time.Now(), TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return leaf
	}
	leafOf := func(issuer *ca.Issuer) *x509.Certificate { return leafAs(issuer, spiffeid.RoleAdmin, "op") }
	old := leafOf(s.ca.Issuer(ca.RoleAdmin))
	// An agent that will not renew before standby.
	oldAgent := leafAs(s.ca.Issuer(ca.RoleAgent), spiffeid.RoleAgent, "web-01")
	for range 2 {
		if _, _, err := s.stepRoot(ctx, "t", rootNext); err != nil {
			t.Fatal(err)
		}
	}
	st, err := s.rootStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := s.intermediatesNotUnder(ctx, st.New); err != nil || n != 0 {
		t.Fatalf("update_servers answered with %d intermediates not under the new root (%v)", n, err)
	}
	if _, _, err := s.stepRoot(ctx, "t", rootNext, old); err == nil || !strings.Contains(err.Error(), "muster admin renew") {
		t.Fatalf("standby asked by an operator under the old root: %v; want a refusal naming muster admin renew", err)
	}
	renewed := leafOf(s.ca.Issuer(ca.RoleAdmin))
	// An agent that renews in update_servers and not again before the
	// rotation is abandoned (below).
	newAgent := leafAs(s.ca.Issuer(ca.RoleAgent), spiffeid.RoleAgent, "web-02")
	if _, st, err := s.stepRoot(ctx, "t", rootNext, renewed); err != nil || st.Phase != store.RootPhaseStandby {
		t.Fatalf("standby asked by an operator under the new root: %v %v", st.Phase, err)
	}
	// In standby, a certificate left under the old root is refused with
	// the way back, not only "not issued by this authority" (a running
	// agent that had not renewed stopped there, saying no more).
	if err := s.inter.load(ctx); err != nil {
		t.Fatal(err)
	}
	for leaf, want := range map[*x509.Certificate]string{
		old:      "muster admin add op --offline --data " + shellword.Quote(string(s.cfg.Dir)) + ",",
		oldAgent: "muster agent join --force --data ADIR --node web-01 with a joining URI from muster token create --node web-01",
	} {
		if _, err := s.verifyClientCertsAt([]*x509.Certificate{leaf}, time.Now()); err == nil || !strings.Contains(err.Error(), "no longer trusts") || !strings.Contains(err.Error(), want) {
			t.Errorf("a %s certificate under the old root in standby: %v; want the way back, %q", leaf.Subject.CommonName, err, want)
		} else if !strings.Contains(err.Error(), "muster ca root rollback") || strings.Contains(err.Error(), "no rollback") {
			// A rollback to update_servers trusts the old root again
			// (it used to say "no rollback brings it back" here: the
			// check looked for the old root's key in a
			// cross-certificate standby no longer carries).
			t.Errorf("a %s certificate under the old root in standby: %v; want the rollback offered", leaf.Subject.CommonName, err)
		}
	}
	// Back to init: abandoning the rotation drops the new root, so it is
	// refused to an operator under it.
	for range 3 {
		if _, _, err := s.stepRoot(ctx, "t", rootBackNow); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.stepRoot(ctx, "t", rootBackNow, renewed); err == nil || !strings.Contains(err.Error(), "muster admin renew") {
		t.Fatalf("abandoning asked by an operator under the new root: %v; want a refusal naming muster admin renew", err)
	}
	// An agent still under the new root when the rotation is abandoned
	// (it renewed in update_servers, not since the rollback) is refused
	// with the way back that works: a join. No rollback trusts the
	// abandoned root again, so the refusal does not offer one (it used to
	// say the rotation went to standby, and to roll back to
	// update_servers, from phase none).
	if _, st, err := s.stepRoot(ctx, "t", rootBackNow, leafOf(s.ca.Issuer(ca.RoleAdmin))); err != nil || st.Phase != store.RootPhaseNone {
		t.Fatalf("abandoning asked by an operator under the old root: %v %v", st.Phase, err)
	}
	if err := s.inter.load(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = s.verifyClientCertsAt([]*x509.Certificate{newAgent}, time.Now())
	if want := "muster agent join --force --data ADIR --node web-02 with a joining URI from muster token create --node web-02"; err == nil || !strings.Contains(err.Error(), "no longer trusts") || !strings.Contains(err.Error(), want) {
		t.Errorf("an agent under the abandoned root: %v; want the join, %q", err, want)
	}
	if err != nil && (strings.Contains(err.Error(), "rollback") && !strings.Contains(err.Error(), "no rollback") || strings.Contains(err.Error(), "went to standby")) {
		t.Errorf("an agent under the abandoned root is told of a rollback or a standby: %v", err)
	}
	_, err = s.verifyClientCertsAt([]*x509.Certificate{renewed}, time.Now())
	if want := "muster admin add op --offline --data " + shellword.Quote(string(s.cfg.Dir)) + ","; err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "muster ca root rollback") {
		t.Errorf("an operator under the abandoned root: %v; want %q and no rollback", err, want)
	}
}

// TestRootRotationTwoReplicasPostgres: phases stepped through one replica
// are used by the other within moments (its change notifications): its
// roots, the listener chain it presents and the intermediate it signs
// agents with follow; two replicas stepping from the same phase at once
// take one step between them.
func TestRootRotationTwoReplicasPostgres(t *testing.T) {
	t.Parallel()
	benchPGOnce.Do(func() { benchPG, benchPGErr = pgtest.Start() })
	if benchPGErr != nil {
		t.Fatalf("PostgreSQL: %v", benchPGErr)
	}
	url := benchPG.NewDatabase(t)
	a := startReplicas(t, func(ctx context.Context) (store.Store, error) { return postgres.Open(ctx, url) }, 2, fastCAClock)
	ctx := t.Context()
	one, other := a.srvs[0], a.srvs[1]
	st, err := other.rotateRoot(ctx, "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	newRoot := st.New
	// Both replicas step from init at once: one wins, the other is told
	// the rotation changed. Both read the rotation before either writes
	// (left to the scheduler, the two steps could run one after the
	// other, and both succeed: init to update_agents to update_servers).
	var read sync.WaitGroup
	read.Add(2)
	for _, s := range a.srvs {
		s.rootStepRead = func() { read.Done(); read.Wait() }
	}
	errs := make(chan error, 2)
	for _, s := range a.srvs {
		go func() { _, _, err := s.stepRoot(ctx, "t", rootNext); errs <- err }()
	}
	var failed int
	for range 2 {
		if err := <-errs; err != nil {
			if !errors.Is(err, errRootChanged) {
				t.Fatalf("a concurrent step: %v", err)
			}
			failed++
		}
	}
	if failed != 1 {
		t.Fatalf("%d of two concurrent steps from init failed, want exactly one", failed)
	}
	for _, s := range a.srvs {
		s.rootStepRead = nil
	}
	if st, _ := one.rootStatus(ctx); st.Phase != store.RootPhaseUpdateAgents {
		t.Fatalf("after two concurrent steps: phase %s, want update_agents", st.Phase)
	}
	if _, _, err := other.stepRoot(ctx, "t", rootNext); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range a.srvs {
		for {
			agent := s.ca.Issuer(ca.RoleAgent)
			rs := s.ca.Roots()
			if agent.Cert.CheckSignatureFrom(newRoot) == nil && rs.Signing.Equal(newRoot) && len(rs.Trusted) == 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("a replica still signs agents under the old root 20 s after update_servers (roots %d, signing %s)", len(rs.Trusted), ca.Fingerprint(rs.Signing))
			}
			time.Sleep(100 * time.Millisecond)
		}
		cert, err := s.certificate(ca.RoleServer, []string{"127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		if last, _ := x509.ParseCertificate(cert.Certificate[len(cert.Certificate)-1]); !last.Equal(newRoot) {
			t.Fatal("a replica's listener chain does not end at the new root in update_servers")
		}
	}
}

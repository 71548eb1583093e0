package authority

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/agent"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestCALifecycleModel: intermediate rotation driven by a stepped clock
// (the leader's caStepAt at a virtual now, up to half an hour apart with a
// one-hour ca.intermediate_ttl, so prepare, activate and retire all
// happen; the model is the only leader) interleaved with root rotate,
// next-phase and rollback, the operator's `ca rotate ROLE`, `--activate`
// (within and past the publish window), `ca root export-key` and `ca
// rotate ROLE --root-key`, and agents that go offline, come back and
// restart, random with a fixed seed (MUSTER_MODEL_SEED tries another,
// MUSTER_MODEL_STEPS runs longer). Agents still offline come back at the
// end.
//
// The agents are real ones (internal/agent, each with its data
// directory): they join with a token, renew over mTLS against the running
// replica, and take trust bundles only through the agent's own rule
// (trustbundle.Take: a new root only through a cross-certificate under a
// root already trusted). A restart is a new agent.Agent over the same
// directory. An online agent renews whenever its certificate's
// intermediate is no longer active (before the clock's next step, which
// may retire it) and at the end of a step that changed the active
// intermediates or the bundle, as a running agent, renewing well before
// its certificate's end, would.
//
// After every step, the authority: each role has exactly one active
// intermediate, signed by a root the bundle trusts; every non-retired
// intermediate is in the published bundle; an intermediate prepared
// during the run was published the publish window before it was
// activated; the bundle trusts at least one root. Every agent: trusts at
// least one root, and only roots that were the authority's; an online
// agent's renewal succeeded, its certificate verifies under its own
// roots, and the listener's chain verifies under them. An agent coming
// back is refused only for a documented reason, each checked with its
// message: it trusts none of the authority's roots (offline across a
// whole root rotation: the way-out error names `join --force`), its
// certificate is under a root the authority no longer trusts, or it slept
// past its certificate (by the virtual clock) and its intermediate was
// retired; it then joins again as the documented way out says. Otherwise
// it recovers by itself. On failure the seed and the step sequence are
// printed for replay.
//
// The clock is virtual only for the CA clock's decisions: certificates
// and TLS use the real clock, so the virtual clock runs ahead of the
// dates certificates carry. An agent's certificate counts as expired, for
// the model, once the virtual now passes its not-after. The lifetimes are
// long (modelTimeScale) next to the run's real time, a few minutes at
// most on a loaded machine, so no certificate expires by the real clock
// during the run: with a 3-minute ca.intermediate_ttl, a run that took
// that long had an agent's real certificate expire under it, and its
// renewal refused, which the model counts as a failure.
func TestCALifecycleModel(t *testing.T) {
	t.Parallel()
	seed, steps := uint64(21), 30
	for name, v := range map[string]*int{"MUSTER_MODEL_STEPS": &steps} {
		if s := os.Getenv(name); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil {
				t.Fatal(err)
			}
			*v = n
		}
	}
	if v := os.Getenv("MUSTER_MODEL_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seed = n
	}
	runLifecycleModel(t, seed, steps)
}

// followerStore is a store on which this replica never leads the
// background jobs (another replica, here the model, does).
type followerStore struct{ *sqlite.SQLite }

func (followerStore) RunAsLeader(ctx context.Context, _ string, _ func(context.Context) error) error {
	<-ctx.Done()
	return nil
}

// modelAgent is one simulated agent: a real agent over its data
// directory, and what the model knows of it.
type modelAgent struct {
	name   string
	dir    agent.Dir
	a      *agent.Agent
	online bool
	// awaySince is the step it went offline.
	awaySince int
	// renewedAt is the caDigest of its last renewal.
	renewedAt string
}

type lifecycleModel struct {
	t     *testing.T
	seed  uint64
	a     *benchAuthority
	s     *Server
	ctx   context.Context
	rng   *rand.Rand
	skew  time.Duration
	steps []string
	step  int
	// everRoots are the fingerprints of every root the authority ever
	// trusted or rotated to.
	everRoots map[string]bool
	agents    []*modelAgent
	authID    spiffeid.ID

	rotations, renewals, recovered, rejoined      int
	refusedWayOut, refusedOldRoot, refusedExpired int
	// seen is the virtual time each intermediate was first in the store
	// (prepared); the store's own dates are the real clock's.
	seen      map[string]time.Time
	wasActive map[string]bool
	// rootKeys are the keys of roots exported (muster ca root
	// export-key), by fingerprint: the operator's offline media.
	rootKeys map[string]crypto.Signer
	// operator counts the operator's CA steps taken and refused.
	prepared, activated, refusedEarly, exported int
}

// modelTimeScale scales the model's intermediate lifetime and the
// virtual clock's steps alike (the same decisions as a 3-minute lifetime
// and steps of 1 to 90 s): the CA clock decides by fractions of the
// lifetime, and the real time that passes between steps, a few seconds at
// most, is then a small fraction of it.
const modelTimeScale = 20

func runLifecycleModel(t *testing.T, seed uint64, steps int) {
	a := startReplicas(t, nil, 1, func(c *Config) {
		c.CAIntermediateTTL = modelTimeScale * 3 * time.Minute
		// The online agents renew at every step of the virtual clock, a
		// few real seconds apart, far more often than their real
		// certificates' lifetime allows.
		c.RenewalsPerLifetime = math.MaxInt32
		// Short, so an operator's activation can wait it out.
		c.CAPublishWindow = 250 * time.Millisecond
		// The model is the leader, at its virtual now: the replica's
		// own CA clock, at the real now, would step in between the
		// model's steps.
		c.Store = followerStore{c.Store.(*sqlite.SQLite)}
	})
	tok, err := jointoken.Parse(a.token)
	if err != nil {
		t.Fatal(err)
	}
	authID, _ := spiffeid.New(a.info.TrustDomain, spiffeid.RoleAuthority, a.info.AuthorityID)
	m := &lifecycleModel{t: t, seed: seed, a: a, s: a.srvs[0], ctx: t.Context(), rng: rand.New(rand.NewPCG(seed, 7)),
		everRoots: map[string]bool{}, authID: authID, seen: map[string]time.Time{}, wasActive: map[string]bool{},
		rootKeys: map[string]crypto.Signer{}}
	m.noteRoots()
	for i := range 3 {
		g := &modelAgent{name: fmt.Sprintf("node-%d", i), dir: agent.Dir(filepath.Join(t.TempDir(), fmt.Sprintf("agent%d", i))), online: true}
		g.a = agent.New(agent.Options{Dir: g.dir})
		if _, err := g.a.Join(m.ctx, agent.JoinRequest{Token: tok, Node: g.name, Authority: a.conn.Target()}); err != nil {
			t.Fatalf("%s joins: %v", g.name, err)
		}
		m.agents = append(m.agents, g)
	}
	for m.step = range steps {
		m.pickAndApply()
		// A step may have activated an intermediate (an operator's
		// activation): running agents renew before the clock's next
		// step, as afterCAStep says.
		m.afterCAStep(false)
		now := m.storeNow()
		// Two ticks of the leader's clock when the clock moved on;
		// other steps take no time. (Each tick past the half-life of
		// successors born at the real clock prepares or activates one
		// per role: the wall time of the test is in these.)
		ticks := 0
		if strings.Contains(m.steps[len(m.steps)-1], " advance ") {
			ticks = 2
		}
		for range ticks {
			if err := m.s.caStepAt(m.ctx, now.Add(m.skew)); err != nil {
				m.fail("caStep: %v", err)
			}
			m.afterCAStep(false)
		}
		m.afterCAStep(true)
		m.checkCA(now.Add(m.skew))
		m.checkAgents()
	}
	// Every agent still offline comes back at the end.
	m.step = steps
	for _, g := range m.agents {
		if !g.online {
			m.note("agent %s back at the end (away since step %d)", g.name, g.awaySince)
			m.comeBack(g)
		}
	}
	m.checkAgents()
	if m.rotations == 0 {
		t.Errorf("seed %d: no intermediate was rotated during the run; lengthen it", seed)
	}
	t.Logf("seed %d, %d steps: %d intermediates activated, %d renewals, %d agents back by themselves, %d refused and joined again (%d trusting none of the authority's roots, %d under a dropped root, %d expired); operator: %d prepared, %d activated, %d activations refused within the publish window, %d root keys exported",
		seed, steps, m.rotations, m.renewals, m.recovered, m.rejoined, m.refusedWayOut, m.refusedOldRoot, m.refusedExpired,
		m.prepared, m.activated, m.refusedEarly, m.exported)
}

func (m *lifecycleModel) fail(format string, args ...any) {
	m.t.Helper()
	m.t.Fatalf("seed %d, step %d, steps:\n  %s\n%s", m.seed, m.step, strings.Join(m.steps, "\n  "), fmt.Sprintf(format, args...))
}

func (m *lifecycleModel) storeNow() time.Time {
	now, err := m.a.store.Now(m.ctx)
	if err != nil {
		m.t.Fatal(err)
	}
	return now
}

// rejoin is the way out a refused agent is told: a join over its
// identity with a token bound to its node (muster token create --node),
// pinned to the root that signs now.
func (m *lifecycleModel) rejoin(g *modelAgent) error {
	resp, err := (&adminService{s: m.s}).CreateToken(m.ctx, &musterv1.CreateTokenRequest{NodeId: g.name})
	if err != nil {
		return err
	}
	tok, err := jointoken.Parse(resp.GetToken())
	if err != nil {
		return err
	}
	_, err = g.a.Join(m.ctx, agent.JoinRequest{Token: tok, Node: g.name, Authority: m.a.conn.Target(), Force: true,
		CAFingerprint: m.s.joinFingerprint()})
	return err
}

// note records the step about to be taken.
func (m *lifecycleModel) note(format string, args ...any) {
	m.steps = append(m.steps, fmt.Sprintf("%d ", m.step)+fmt.Sprintf(format, args...))
}

// pickAndApply takes one random step, recorded first.
func (m *lifecycleModel) pickAndApply() {
	g := m.agents[m.rng.IntN(len(m.agents))]
	switch k := m.rng.IntN(24); {
	case k < 7:
		d := time.Duration(1+m.rng.IntN(90)) * modelTimeScale * time.Second
		m.note("advance %s", d)
		m.skew += d
	case k < 12:
		// A root step that makes progress, mostly: rotate when none is
		// in progress, else next-phase or (a quarter) rollback; now and
		// then one the authority refuses.
		st, err := m.s.rootStatus(m.ctx)
		if err != nil {
			m.t.Fatal(err)
		}
		switch r := m.rng.IntN(12); {
		case r == 0 || (st.Phase == store.RootPhaseNone && r > 1) || (st.Phase != store.RootPhaseNone && r == 1):
			m.note("root rotate")
			m.drive(func() { _, _ = m.s.rotateRoot(m.ctx, "test", nil) })
		case r < 9:
			m.note("root next-phase")
			m.drive(func() { _, _, _ = m.s.stepRoot(m.ctx, "test", rootNext) })
		default:
			m.note("root rollback")
			m.drive(func() { _, _, _ = m.s.stepRoot(m.ctx, "test", rootBackNow) })
		}
	case k < 15:
		if !g.online {
			m.note("agent %s stays offline", g.name)
			return
		}
		m.note("agent %s offline", g.name)
		g.online, g.awaySince = false, m.step
	case k < 18:
		if g.online {
			m.note("agent %s stays online", g.name)
			return
		}
		m.note("agent %s back (away since step %d)", g.name, g.awaySince)
		m.comeBack(g)
	case k < 23:
		role := caRoles[m.rng.IntN(len(caRoles))]
		switch r := m.rng.IntN(6); {
		case r < 2:
			m.opPrepare(role)
		case r < 5:
			m.opActivate(role, r == 4)
		default:
			m.opExportRootKey()
		}
	default:
		// A restart reads only what the agent holds on disk.
		m.note("agent %s restarts", g.name)
		g.a = agent.New(agent.Options{Dir: g.dir})
		if g.online {
			m.renew(g)
		}
	}
	m.noteRoots()
}

// drive runs op (which may wait for the leader) while stepping the CA
// clock at the virtual now, as the leader would, and renewing the online
// agents after every change.
func (m *lifecycleModel) drive(op func()) {
	done := make(chan struct{})
	go func() { defer close(done); op() }()
	for {
		select {
		case <-done:
			return
		case <-time.After(20 * time.Millisecond):
		}
		if err := m.s.caStepAt(m.ctx, m.storeNow().Add(m.skew)); err != nil {
			m.fail("caStep while driving: %v", err)
		}
		m.afterCAStep(false)
	}
}

// noteRoots adds the authority's roots, trusted and rotated to, to
// everRoots.
func (m *lifecycleModel) noteRoots() {
	for _, r := range m.s.ca.Roots().Trusted {
		m.everRoots[ca.Fingerprint(r)] = true
	}
	if rot, err := m.a.store.GetRootRotation(m.ctx); err == nil {
		for _, der := range [][]byte{rot.NewCertDER} {
			if c, err := x509.ParseCertificate(der); err == nil {
				m.everRoots[ca.Fingerprint(c)] = true
			}
		}
	}
}

// caDigest names the active intermediates and the trust bundle this
// replica publishes.
func (m *lifecycleModel) caDigest() string {
	rows, err := m.a.store.ListCACerts(m.ctx)
	if err != nil {
		m.t.Fatal(err)
	}
	var b strings.Builder
	for _, r := range rows {
		if r.State == store.CAActive {
			fmt.Fprintf(&b, "%s/%s;", r.Role, r.Serial)
		}
	}
	return b.String() + m.s.trustBundle().set.Digest()
}

// afterCAStep makes the replica read the store (it does so by itself on
// the change notification, within moments) and renews the online agents
// as running agents would: each whose certificate's intermediate is no
// longer active (an intermediate is retired only in a CA step after the
// one that made it retiring, so a running agent, which renews well before
// its certificate's end, never holds a certificate of a retired one), and
// at the end of a model step (end) every one, if the active
// intermediates or the bundle changed since they last renewed.
func (m *lifecycleModel) afterCAStep(end bool) {
	if err := m.s.inter.load(m.ctx); err != nil {
		m.fail("load: %v", err)
	}
	m.noteRoots()
	active := map[string]bool{}
	rows, err := m.a.store.ListCACerts(m.ctx)
	if err != nil {
		m.t.Fatal(err)
	}
	for _, r := range rows {
		if r.State == store.CAActive {
			active[string(r.CertDER)] = true
		}
	}
	d := m.caDigest()
	for _, g := range m.agents {
		if !g.online {
			continue
		}
		if end {
			if d == g.renewedAt {
				continue
			}
		} else if id := m.held(g); len(id.Chain) > 1 && active[string(id.Chain[1].Raw)] {
			continue
		}
		m.renew(g)
		g.renewedAt = d
	}
}

// renew renews the online agent g, which must succeed, and checks what
// it holds after.
func (m *lifecycleModel) renew(g *modelAgent) {
	if _, err := g.a.Renew(m.ctx); err != nil {
		m.fail("the online agent %s's renewal failed: %v\n%s", g.name, err, m.describe(g))
	}
	m.renewals++
	m.checkLeaf(g)
}

// held is what g holds on disk.
func (m *lifecycleModel) held(g *modelAgent) *identity.Identity {
	id, err := g.dir.LoadIdentity()
	if err != nil {
		m.fail("%s: reading what it holds: %v", g.name, err)
	}
	return id
}

// checkLeaf: g's certificate verifies under the roots g trusts, with the
// chain it holds.
func (m *lifecycleModel) checkLeaf(g *modelAgent) {
	id := m.held(g)
	pool, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range id.Roots {
		pool.AddCert(r)
	}
	for _, c := range id.Chain[1:] {
		inter.AddCert(c)
	}
	if _, err := id.Leaf().Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		m.fail("%s's certificate (issued by %s) does not verify under its own roots %v: %v", g.name, id.Leaf().Issuer, fingerprints(id.Roots), err)
	}
}

func fingerprints(cs []*x509.Certificate) []string {
	var out []string
	for _, c := range cs {
		fp := ca.Fingerprint(c)
		out = append(out, fp[:min(len(fp), 19)])
	}
	return out
}

// comeBack brings g online: its first renewal must succeed unless a
// documented reason refuses it, checked by its message; a refused agent
// joins again over its identity with a token, the way out the refusal
// names.
func (m *lifecycleModel) comeBack(g *modelAgent) {
	g.online = true
	id := m.held(g)
	rs := m.s.ca.Roots()
	trusted := map[string]bool{}
	for _, r := range rs.Trusted {
		trusted[ca.Fingerprint(r)] = true
	}
	common := false
	for _, r := range id.Roots {
		common = common || trusted[ca.Fingerprint(r)]
	}
	leafRootTrusted := false
	for _, r := range rs.Trusted {
		if len(id.Chain) > 1 && id.Chain[len(id.Chain)-1].CheckSignatureFrom(r) == nil {
			leafRootTrusted = true
		}
	}
	issuerRetired := false
	rows, err := m.a.store.ListCACerts(m.ctx)
	if err != nil {
		m.t.Fatal(err)
	}
	for _, r := range rows {
		if len(id.Chain) > 1 && bytes.Equal(r.CertDER, id.Chain[1].Raw) && r.State == store.CARetired {
			issuerRetired = true
		}
	}
	vnow := m.storeNow().Add(m.skew)
	if issuerRetired && vnow.Before(id.Leaf().NotAfter) {
		m.fail("%s comes back with a certificate valid (by the virtual clock) until %s, but its intermediate was retired at or before %s: retired before its last leaf expired",
			g.name, id.Leaf().NotAfter.UTC(), vnow.UTC())
	}
	_, err = g.a.Renew(m.ctx)
	var why string
	switch {
	case !common:
		why = "join again over this identity, pinned to the current root"
		m.refusedWayOut++
	case !leafRootTrusted:
		why = "client certificate not issued by this authority"
		m.refusedOldRoot++
	case issuerRetired:
		why = "client certificate not issued by this authority"
		m.refusedExpired++
	default:
		if err != nil {
			m.fail("%s, back after being away since step %d, trusting %v (the authority %v), was refused its renewal: %v",
				g.name, g.awaySince, fingerprints(id.Roots), fingerprints(rs.Trusted), err)
		}
		m.recovered++
		m.renewals++
		m.checkLeaf(g)
		g.renewedAt = m.caDigest()
		return
	}
	if err == nil {
		m.fail("%s, back after being away since step %d, renewed; want it refused (%s)", g.name, g.awaySince, why)
	}
	if !strings.Contains(err.Error(), why) {
		m.fail("%s, back after being away since step %d, was refused with %q; want the refusal to say %q", g.name, g.awaySince, err, why)
	}
	if err := m.rejoin(g); err != nil {
		m.fail("%s joins again after its refusal: %v", g.name, err)
	}
	m.rejoined++
	m.checkLeaf(g)
	g.renewedAt = m.caDigest()
}

// checkAgents: every agent trusts at least one root, and only roots that
// were the authority's; every online agent verifies the listener's chain
// under the roots it trusts.
func (m *lifecycleModel) checkAgents() {
	cert, err := m.s.certificate(ca.RoleServer, []string{"127.0.0.1"})
	if err != nil {
		m.t.Fatal(err)
	}
	var chain []*x509.Certificate
	for _, der := range cert.Certificate {
		c, _ := x509.ParseCertificate(der)
		chain = append(chain, c)
	}
	for _, g := range m.agents {
		id := m.held(g)
		if len(id.Roots) == 0 {
			m.fail("%s trusts no root", g.name)
		}
		for _, r := range id.Roots {
			if !m.everRoots[ca.Fingerprint(r)] {
				m.fail("%s trusts root %s, never one of the authority's", g.name, ca.Fingerprint(r))
			}
		}
		if !g.online {
			continue
		}
		if err := identity.VerifyPeer(chain, id.RootPool(), identity.MatchID(m.authID), x509.ExtKeyUsageServerAuth, time.Now()); err != nil {
			m.fail("the online agent %s, trusting %v, refuses the listener's chain: %v", g.name, fingerprints(id.Roots), err)
		}
	}
}

// checkCA checks the authority's intermediates and bundle at the virtual
// now vnow.
func (m *lifecycleModel) checkCA(vnow time.Time) {
	s := m.s
	// The rows first, then the load: the running leader may step
	// between the two, and the bundle loaded after must hold every
	// row read before it.
	rows, err := m.a.store.ListCACerts(m.ctx)
	if err != nil {
		m.t.Fatal(err)
	}
	if err := s.inter.load(m.ctx); err != nil {
		m.fail("load: %v", err)
	}
	b := s.trustBundle()
	if len(b.set.Roots) == 0 {
		m.fail("the bundle trusts no root")
	}
	pool := x509.NewCertPool()
	for _, r := range b.set.Roots {
		pool.AddCert(r)
	}
	published := map[string]bool{}
	for _, c := range b.set.Intermediates {
		published[string(c.Raw)] = true
	}
	active := map[string]int{}
	for _, r := range rows {
		if _, ok := m.seen[r.Serial]; !ok {
			m.seen[r.Serial] = vnow
			if m.step == 0 {
				m.seen[r.Serial] = time.Time{}
			}
		}
		if r.State == store.CARetired {
			continue
		}
		// Every non-retired intermediate a trusted root signed is in the
		// bundle, and no other: from standby on, the old root's retiring
		// ones stay in the store but leave the bundle with their root.
		if c, _ := x509.ParseCertificate(r.CertDER); published[string(r.CertDER)] != signedByOneOf(c, b.set.Roots) {
			st, _ := s.rootStatus(m.ctx)
			m.fail("%s intermediate %s (%s, issued by %s): in the bundle %v, signed by a trusted root %v (phase %s, roots %v)",
				r.Role, r.Serial, r.State, c.Issuer, published[string(r.CertDER)], signedByOneOf(c, b.set.Roots), st.Phase, fingerprints(b.set.Roots))
		}
		if r.State != store.CAActive {
			continue
		}
		active[r.Role]++
		if !m.wasActive[r.Serial] && !m.seen[r.Serial].IsZero() {
			m.wasActive[r.Serial] = true
			m.rotations++
			// The store dates the preparation by its own clock, which
			// the model's virtual now runs ahead of by skew.
			if d := vnow.Sub(r.CreatedAt); d < s.caPublishWindow() {
				m.fail("%s intermediate %s activated %s after it was prepared, less than the publish window", r.Role, r.Serial, d)
			}
		}
		c, _ := x509.ParseCertificate(r.CertDER)
		if _, err := c.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: c.NotBefore.Add(time.Second), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			m.fail("the active %s intermediate %s does not chain to a trusted root: %v", r.Role, r.Serial, err)
		}
	}
	for _, role := range caRoles {
		if active[string(role)] != 1 {
			m.fail("role %s has %d active intermediates", role, active[string(role)])
		}
	}
}

// refusedSaying fails unless err is a refusal whose message says want.
func (m *lifecycleModel) refusedSaying(what string, err error, want string) {
	m.t.Helper()
	if err == nil || !strings.Contains(status.Convert(err).Message(), want) {
		m.fail("%s answered %v; want a refusal saying %q", what, err, want)
	}
}

// opPrepare is `muster ca rotate ROLE` through the admin service the CLI
// calls: with the signing root's key held by the authority it prepares;
// with the key exported it is refused, and `--root-key FILE` (a draft
// signed with the exported key, as the CLI signs it) prepares. Either is
// refused while a successor is prepared already.
func (m *lifecycleModel) opPrepare(role ca.Role) {
	adm := &adminService{s: m.s}
	rows, err := m.a.store.ListCACerts(m.ctx)
	if err != nil {
		m.t.Fatal(err)
	}
	p, _ := preparedOf(rows, role)
	rs := m.s.ca.Roots()
	if rs.SigningKey != nil {
		m.note("ca rotate %s", role)
		_, err := adm.PrepareCAIntermediate(m.ctx, &musterv1.PrepareCAIntermediateRequest{Role: string(role)})
		if p != nil {
			m.refusedSaying("ca rotate "+string(role), err, "already has a prepared successor")
			return
		}
		if err != nil && status.Code(err) != codes.Aborted && !strings.Contains(err.Error(), "already has a prepared successor") {
			m.fail("ca rotate %s: %v", role, err)
		}
		if err == nil {
			m.prepared++
		}
		return
	}
	key := m.rootKeys[ca.Fingerprint(rs.Signing)]
	if key == nil {
		m.fail("the signing root %s's key is neither held by the authority nor exported", ca.Fingerprint(rs.Signing))
	}
	m.note("ca rotate %s --root-key FILE", role)
	_, err = adm.PrepareCAIntermediate(m.ctx, &musterv1.PrepareCAIntermediateRequest{Role: string(role)})
	if p != nil {
		m.refusedSaying("ca rotate "+string(role), err, "already has a prepared successor")
	} else {
		m.refusedSaying("ca rotate "+string(role)+" without the root key", err, "--root-key FILE")
	}
	d, err := adm.DraftCAIntermediate(m.ctx, &musterv1.DraftCAIntermediateRequest{Role: string(role)})
	if p != nil {
		m.refusedSaying("ca rotate "+string(role)+" --root-key", err, "already has a prepared successor")
		return
	}
	if err != nil {
		m.fail("ca rotate %s --root-key: the draft: %v", role, err)
	}
	cert := signDraftWith(m.t, d, rs.Signing, key, nil)
	if _, err := adm.PrepareCAIntermediate(m.ctx, &musterv1.PrepareCAIntermediateRequest{Role: string(role), Serial: d.GetSerial(),
		KeyRef: d.GetKeyRef(), CertificateDer: cert}); err != nil {
		m.fail("ca rotate %s --root-key: %v", role, err)
	}
	m.prepared++
}

// opActivate is `muster ca rotate ROLE --activate`: refused with nothing
// prepared, and within the publish window (by the store's clock, which
// the authority judges by); past it, it activates (or is told the leader
// was first). With wait the operator runs it again once the refusal's
// time has come.
func (m *lifecycleModel) opActivate(role ca.Role, wait bool) {
	if wait {
		m.note("ca rotate %s --activate, again after the publish window if refused", role)
	} else {
		m.note("ca rotate %s --activate", role)
	}
	adm := &adminService{s: m.s}
	if err := m.s.inter.load(m.ctx); err != nil {
		m.fail("load: %v", err)
	}
	rows, err := m.a.store.ListCACerts(m.ctx)
	if err != nil {
		m.t.Fatal(err)
	}
	p, _ := preparedOf(rows, role)
	before := m.storeNow()
	_, err = adm.ActivateCAIntermediate(m.ctx, &musterv1.ActivateCAIntermediateRequest{Role: string(role)})
	after := m.storeNow()
	what := "ca rotate " + string(role) + " --activate"
	// What the leader may have done meanwhile (it runs on the real
	// clock too): activated it first, or replaced it.
	raced := func(err error) bool {
		msg := status.Convert(err).Message()
		return status.Code(err) == codes.Aborted || strings.Contains(msg, "no prepared successor") ||
			strings.Contains(msg, ", not "+p.Serial) ||
			// Documented: with revocation lists, the prepared one's
			// first list is signed within moments of its preparation.
			strings.Contains(msg, "revocation list of the prepared")
	}
	switch {
	case p == nil:
		if err == nil {
			m.fail("%s activated with nothing prepared", what)
		}
		m.refusedSaying(what, err, "no prepared successor")
		return
	case after.Before(p.CreatedAt.Add(m.s.caPublishWindow())):
		m.refusedSaying(what, err, "not published by every replica yet")
		m.refusedEarly++
		if !wait {
			return
		}
		time.Sleep(p.CreatedAt.Add(m.s.caPublishWindow()).Sub(after) + 20*time.Millisecond)
		before = m.storeNow()
		_, err = adm.ActivateCAIntermediate(m.ctx, &musterv1.ActivateCAIntermediateRequest{Role: string(role), Serial: p.Serial})
	case before.Before(p.CreatedAt.Add(m.s.caPublishWindow())):
		// At the edge of the window: either answer.
		if err != nil && !strings.Contains(err.Error(), "not published by every replica yet") && !raced(err) {
			m.fail("%s at the end of the publish window: %v", what, err)
		}
		if err == nil {
			m.activated++
		}
		return
	}
	if err != nil && !raced(err) {
		m.fail("%s, %s after the intermediate %s was prepared: %v", what, before.Sub(p.CreatedAt), p.Serial, err)
	}
	if err == nil {
		m.activated++
	}
}

// opExportRootKey is `muster ca root export-key`: in standby with the new
// root's key in the store, the key is taken out (kept by the model as the
// operator's offline media) and cleared from the rotation record in one
// conditional write, as the CLI does. The authority then holds no signing
// root key.
func (m *lifecycleModel) opExportRootKey() {
	rot, err := m.a.store.GetRootRotation(m.ctx)
	if err != nil {
		m.t.Fatal(err)
	}
	if rot.Phase != store.RootPhaseStandby || rot.NewKeyRef == nil {
		m.note("ca root export-key: nothing to export (phase %s)", rot.Phase)
		return
	}
	m.note("ca root export-key")
	root, err := x509.ParseCertificate(rot.NewCertDER)
	if err != nil {
		m.t.Fatal(err)
	}
	key, err := m.s.inter.custody.Signer(m.ctx, rootKeyName(root), custody.Key{Public: root.PublicKey, Ref: rot.NewKeyRef})
	if err != nil {
		m.fail("opening the new root's key: %v", err)
	}
	next := rot
	next.NewKeyRef = nil
	if err := m.a.store.PutRootRotation(m.ctx, rot, next, false, setupLink); err != nil {
		m.fail("export-key's write: %v", err)
	}
	m.rootKeys[ca.Fingerprint(root)] = key
	m.exported++
	if err := m.s.inter.load(m.ctx); err != nil {
		m.fail("load: %v", err)
	}
	if m.s.ca.Roots().SigningKey != nil {
		m.fail("the authority still holds the signing root's key after it was exported")
	}
}

// describe says, for a failure, what g holds and what the authority's
// intermediates are.
func (m *lifecycleModel) describe(g *modelAgent) string {
	var b strings.Builder
	id := m.held(g)
	fmt.Fprintf(&b, "virtual now %s (skew %s); %s's certificate: serial %x, not after %s, issued by %s", m.storeNow().Add(m.skew).UTC().Format(time.RFC3339),
		m.skew, g.name, id.Leaf().SerialNumber, id.Leaf().NotAfter.UTC().Format(time.RFC3339), id.Leaf().Issuer)
	if len(id.Chain) > 1 {
		fmt.Fprintf(&b, " (intermediate serial %x)", id.Chain[1].SerialNumber)
	}
	rows, _ := m.a.store.ListCACerts(m.ctx)
	for _, r := range rows {
		if r.State != store.CARetired || len(id.Chain) > 1 && r.Serial == id.Chain[1].SerialNumber.Text(16) {
			fmt.Fprintf(&b, "\n  %s %s %s created %s activated %s retiring %s not after %s", r.Role, r.Serial, r.State,
				r.CreatedAt.UTC().Format(time.RFC3339Nano), r.ActivatedAt.UTC().Format(time.RFC3339Nano), r.RetiringAt.UTC().Format(time.RFC3339Nano), r.NotAfter.UTC().Format(time.RFC3339))
		}
	}
	return b.String()
}

package crl

import (
	"context"
	"crypto/x509"
	"errors"
	"maps"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/store"
)

// memStore is the part of the store a Publisher uses, in memory, with the
// same conditional write.
type memStore struct {
	mu      sync.Mutex
	now     time.Time
	revoked []store.RevokedCertificate
	crls    map[string]store.CRL
	puts    int
	// cas are the intermediates as the store holds them (ListCACerts).
	cas []store.CACert
}

func (m *memStore) ListCACerts(context.Context) ([]store.CACert, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]store.CACert(nil), m.cas...), nil
}

// ListLocks: the tests here give no lock an end.
func (m *memStore) ListLocks(context.Context) ([]store.Lock, error) { return nil, nil }

func (m *memStore) Now(context.Context) (time.Time, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now, nil
}

func (m *memStore) ListRevokedCertificates(context.Context, time.Time) ([]store.RevokedCertificate, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]store.RevokedCertificate(nil), m.revoked...), nil
}

func (m *memStore) GetCRL(_ context.Context, issuer string) (store.CRL, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.crls[issuer]
	if !ok {
		return store.CRL{}, store.ErrNotFound
	}
	return c, nil
}

func (m *memStore) PutCRL(_ context.Context, c store.CRL, prev store.CRL) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	held := m.crls[c.Issuer]
	if held.Number != prev.Number || !held.ThisUpdate.Equal(prev.ThisUpdate) || c.Number <= prev.Number {
		return store.ErrConflict
	}
	m.crls[c.Issuer] = c
	m.puts++
	return nil
}

func setup(t *testing.T) (*ca.Hierarchy, *memStore, func() []Issuer) {
	t.Helper()
	now := time.Now().UTC().Truncate(time.Second)
	h, err := ca.Create("test", now.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	st := &memStore{now: now, crls: map[string]store.CRL{}}
	issuers := func() []Issuer {
		var out []Issuer
		for _, r := range []ca.Role{ca.RoleBootstrap, ca.RoleServer, ca.RoleAgent, ca.RoleAdmin} {
			out = append(out, Issuer{Role: string(r), Cert: h.Issuer(r).Cert, Signer: h.Issuer(r).Key})
		}
		return out
	}
	return h, st, issuers
}

// parse reads the stored list of role, checking its signature.
func parse(t *testing.T, h *ca.Hierarchy, st *memStore, role ca.Role) *x509.RevocationList {
	t.Helper()
	is := h.Issuer(role)
	c, ok := st.crls[Issuer{Role: string(role), Cert: is.Cert}.Name()]
	if !ok {
		t.Fatalf("no list stored for %s", role)
	}
	rl, err := x509.ParseRevocationList(c.DER)
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.CheckSignatureFrom(is.Cert); err != nil {
		t.Fatalf("list of %s: %v", role, err)
	}
	if rl.Number.Int64() != c.Number {
		t.Errorf("list of %s says number %v, stored as %d", role, rl.Number, c.Number)
	}
	return rl
}

func serials(rl *x509.RevocationList) map[string]int {
	out := map[string]int{}
	for _, e := range rl.RevokedCertificateEntries {
		out[e.SerialNumber.Text(16)] = e.ReasonCode
	}
	return out
}

func TestPublish(t *testing.T) {
	ctx := context.Background()
	h, st, issuers := setup(t)
	now := st.now
	leaf := func(serial string, operator bool, reason string) store.RevokedCertificate {
		since := now.Add(-time.Minute)
		if reason == store.RevokedReasonDeleted {
			since = time.Time{}
		}
		return store.RevokedCertificate{Serial: serial, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
			Operator: operator, Reason: reason, Since: since}
	}
	st.revoked = []store.RevokedCertificate{
		leaf("a1", false, store.LockNode), leaf("a1", false, store.LockInstance), // one entry
		leaf("a2", false, store.RevokedReasonDeleted),
		leaf("b1", true, store.LockAdmin),
		// Signed before the agent intermediate existed: not its leaf.
		{Serial: "c1", NotBefore: now.Add(-2 * time.Hour), NotAfter: now.Add(time.Hour), Reason: store.LockNode},
	}
	p := New(Config{Store: st, Issuers: issuers, Validity: time.Hour})
	next, err := p.Publish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := now.Add(30 * time.Minute); !next.Equal(want) {
		t.Errorf("next pass at %v, want half the validity: %v", next, want)
	}
	agent := parse(t, h, st, ca.RoleAgent)
	if got := serials(agent); len(got) != 2 || got["a1"] != reasonCertificateHold || got["a2"] != reasonCessationOfOperation {
		t.Errorf("agent list: %v", got)
	}
	if !agent.NextUpdate.Equal(now.Add(time.Hour)) || !agent.ThisUpdate.Equal(now.Add(-Backdate)) {
		t.Errorf("agent list valid %v to %v", agent.ThisUpdate, agent.NextUpdate)
	}
	if got := serials(parse(t, h, st, ca.RoleAdmin)); len(got) != 1 || got["b1"] == 0 {
		t.Errorf("admin list: %v", got)
	}
	if got := serials(parse(t, h, st, ca.RoleServer)); len(got) != 0 {
		t.Errorf("server list: %v", got)
	}
	deletedAt := agent.RevokedCertificateEntries[1].RevocationTime

	// Nothing changed, nothing signed: a second replica agrees.
	puts := st.puts
	if _, err := New(Config{Store: st, Issuers: issuers, Validity: time.Hour}).Publish(ctx); err != nil {
		t.Fatal(err)
	}
	if st.puts != puts {
		t.Errorf("an unchanged pass signed %d lists", st.puts-puts)
	}

	// An unlock: a1 leaves the next list, whose number follows; a2 keeps
	// the time of its deletion.
	st.revoked = st.revoked[2:]
	st.now = now.Add(time.Minute)
	if _, err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	agent = parse(t, h, st, ca.RoleAgent)
	if got := serials(agent); len(got) != 1 || got["a2"] == 0 || agent.Number.Int64() != st.now.Unix() {
		t.Errorf("after the unlock: %v, number %v", got, agent.Number)
	}
	if !agent.RevokedCertificateEntries[0].RevocationTime.Equal(deletedAt) {
		t.Errorf("a deletion's time moved from %v to %v", deletedAt, agent.RevokedCertificateEntries[0].RevocationTime)
	}
	if n := parse(t, h, st, ca.RoleAdmin).Number.Int64(); n != now.Unix() {
		t.Errorf("the unchanged admin list was signed again: number %d", n)
	}

	// Half the validity: signed again, unchanged.
	st.now = now.Add(31 * time.Minute)
	if _, err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	if n := parse(t, h, st, ca.RoleAdmin).Number.Int64(); n != st.now.Unix() {
		t.Errorf("admin list at half its validity: number %d, want %d", n, st.now.Unix())
	}
	st2 := p.Statuses()
	if len(st2) != 4 {
		t.Errorf("%d statuses, want 4", len(st2))
	}
}

// TestPublishRace: replicas publishing at once never reuse a number, and
// the list stored says what they all read.
func TestPublishRace(t *testing.T) {
	h, st, issuers := setup(t)
	st.revoked = []store.RevokedCertificate{{Serial: "a1", NotBefore: st.now, NotAfter: st.now.Add(time.Hour), Reason: store.LockNode, Since: st.now}}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := New(Config{Store: st, Issuers: issuers, Validity: time.Hour}).Publish(context.Background()); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if got := serials(parse(t, h, st, ca.RoleAgent)); got["a1"] == 0 {
		t.Errorf("agent list: %v", got)
	}
	if st.puts != 4 {
		t.Errorf("%d lists stored by 8 replicas for 4 issuers, want 4", st.puts)
	}
}

func TestNameFromPath(t *testing.T) {
	for path, want := range map[string]string{
		"/crl/agent-1f.crl": "agent-1f", "/crl/.crl": "", "/crl/a/b.crl": "", "/crl/agent-1f": "", "/x/agent.crl": "",
	} {
		got, ok := NameFromPath(path)
		if got != want || ok != (want != "") {
			t.Errorf("NameFromPath(%q) = %q, %v", path, got, ok)
		}
	}
	is := Issuer{Role: "agent", Cert: &x509.Certificate{SerialNumber: big.NewInt(0x1f)}}
	if got := DistributionPoint("http://h:1/", is); got != "http://h:1/crl/agent-1f.crl" {
		t.Errorf("DistributionPoint = %q", got)
	}
}

// racingStore lets another replica store a list of one issuer just before
// this replica's write of it.
type racingStore struct {
	*memStore
	issuer string
	other  store.CRL
	raced  bool
}

func (r *racingStore) PutCRL(ctx context.Context, c store.CRL, prev store.CRL) error {
	if c.Issuer == r.issuer && !r.raced {
		r.raced = true
		r.mu.Lock()
		r.crls[r.issuer] = r.other
		r.mu.Unlock()
	}
	return r.memStore.PutCRL(ctx, c, prev)
}

// TestPublishOlderReadKeepsNewerList: a replica whose read of the revoked
// set is older than the stored list's never signs over it; losing a write
// ends its pass and asks for another, which reads the revoked set again.
func TestPublishOlderReadKeepsNewerList(t *testing.T) {
	ctx := context.Background()
	h, st, issuers := setup(t)
	agent := Issuer{Role: string(ca.RoleAgent), Cert: h.Issuer(ca.RoleAgent).Cert}.Name()

	// Stored from a later read: kept as it is.
	later := store.CRL{Issuer: agent, Number: 7, ThisUpdate: st.now.Add(time.Second), NextUpdate: st.now.Add(time.Hour), Digest: []byte("later"), DER: []byte("later")}
	st.crls[agent] = later
	st.revoked = []store.RevokedCertificate{{Serial: "a1", NotBefore: st.now, NotAfter: st.now.Add(time.Hour), Reason: store.LockNode, Since: st.now}}
	if _, err := New(Config{Store: st, Issuers: issuers, Validity: time.Hour}).Publish(ctx); err != nil {
		t.Fatal(err)
	}
	if got := st.crls[agent]; got.Number != 7 || string(got.DER) != "later" {
		t.Fatalf("a pass reading at %v replaced the list signed at %v with number %d", st.now, later.ThisUpdate, got.Number)
	}

	// Another replica stores a later list just before this one's write.
	_, st2, _ := setup(t)
	st2.now, st2.revoked = st.now, st.revoked
	rs := &racingStore{memStore: st2, issuer: agent, other: store.CRL{Issuer: agent, Number: 1, ThisUpdate: st.now.Add(time.Second),
		NextUpdate: st.now.Add(time.Hour), Digest: []byte("other"), DER: []byte("other")}}
	p := New(Config{Store: rs, Issuers: issuers, Validity: time.Hour})
	if _, err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	if got := st2.crls[agent]; got.Number != 1 || string(got.DER) != "other" {
		t.Fatalf("after losing the write, the pass signed over the other replica's list: number %d", got.Number)
	}
	select {
	case <-p.poke:
	default:
		t.Fatal("a pass that lost a write asked for no other pass")
	}
}

// TestPublishLostKey: an issuer whose key is lost (nil Signer: a retiring
// intermediate whose token object is gone) fails no pass and makes none
// due sooner; its last list stays stored and served as it was, and the
// other issuers' lists are signed as before.
func TestPublishLostKey(t *testing.T) {
	ctx := context.Background()
	h, st, issuers := setup(t)
	if _, err := New(Config{Store: st, Issuers: issuers, Validity: time.Hour}).Publish(ctx); err != nil {
		t.Fatal(err)
	}
	lost := Issuer{Role: string(ca.RoleAgent), Cert: h.Issuer(ca.RoleAgent).Cert}
	before, err := st.GetCRL(ctx, lost.Name())
	if err != nil {
		t.Fatal(err)
	}
	withLost := func() []Issuer {
		out := issuers()
		for i := range out {
			if out[i].Role == lost.Role {
				out[i] = lost
			}
		}
		return out
	}
	// Past half the validity: every list with a key is due again.
	st.mu.Lock()
	st.now = st.now.Add(40 * time.Minute)
	now := st.now
	st.mu.Unlock()
	p := New(Config{Store: st, Issuers: withLost, Validity: time.Hour})
	next, err := p.Publish(ctx)
	if err != nil {
		t.Fatalf("a pass with a lost key: %v", err)
	}
	if want := now.Add(30 * time.Minute); !next.Equal(want) {
		t.Errorf("next pass at %v, want %v (the lost key's list is never due)", next, want)
	}
	after, err := p.Get(ctx, lost.Name())
	if err != nil {
		t.Fatalf("the lost key's list is no longer served: %v", err)
	}
	if after.Number != before.Number {
		t.Errorf("the lost key's list was re-signed: number %d, was %d", after.Number, before.Number)
	}
	if server, _ := st.GetCRL(ctx, Issuer{Role: string(ca.RoleServer), Cert: h.Issuer(ca.RoleServer).Cert}.Name()); server.Number != now.Unix() {
		t.Errorf("the server intermediate's list is number %d, want %d (signed again)", server.Number, now.Unix())
	}
}

// TestStatusNextUpdate: each list's status says when it expires (its
// nextUpdate), for the metric an alert watches, also for an issuer whose
// key is lost and whose list is never signed again: a replica that
// starts with it keyless reports its stored list's nextUpdate, which no
// pass moves, while the others' move ahead as they are signed anew. The
// keyless issuer was left out of the statuses, so nothing showed its list
// running out.
func TestStatusNextUpdate(t *testing.T) {
	_, st, issuers := setup(t)
	ctx := t.Context()
	validity := time.Hour
	p := New(Config{Store: st, Issuers: issuers, Validity: validity, MaxLeafTTL: time.Hour})
	if _, err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	first, firstNumber := st.now.Add(validity), st.now.Unix()
	byName := func(p *Publisher) map[string]Status {
		out := map[string]Status{}
		for _, s := range p.Statuses() {
			out[s.Issuer.Role] = s
		}
		return out
	}
	for role, s := range byName(p) {
		if !s.NextUpdate.Equal(first) {
			t.Errorf("%s: next update %s, want %s", role, s.NextUpdate, first)
		}
	}

	// Another replica, which holds the agent intermediate without its key.
	keyless := func() []Issuer {
		out := issuers()
		for i := range out {
			if out[i].Role == string(ca.RoleAgent) {
				out[i].Signer = nil
			}
		}
		return out
	}
	st.mu.Lock()
	st.now = st.now.Add(validity/2 + time.Minute)
	st.mu.Unlock()
	q := New(Config{Store: st, Issuers: keyless, Validity: validity, MaxLeafTTL: time.Hour})
	if _, err := q.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	got := byName(q)
	agent, ok := got[string(ca.RoleAgent)]
	if !ok {
		t.Fatalf("the keyless agent intermediate's list has no status: %v", got)
	}
	if !agent.NextUpdate.Equal(first) || agent.Number != firstNumber {
		t.Errorf("keyless agent list: number %d, next update %s; want the stored %d, %s", agent.Number, agent.NextUpdate, firstNumber, first)
	}
	if s := got[string(ca.RoleServer)]; !s.NextUpdate.Equal(st.now.Add(validity)) {
		t.Errorf("server list signed anew: next update %s, want %s", s.NextUpdate, st.now.Add(validity))
	}
}

// TestStatusesFollowTheServedIssuers: a list Get no longer serves (its
// intermediate retired or discarded) leaves the statuses, so the metric,
// at once, not at the next pass.
func TestStatusesFollowTheServedIssuers(t *testing.T) {
	_, st, issuers := setup(t)
	ctx := t.Context()
	var mu sync.Mutex
	dropAgent := false
	served := func() []Issuer {
		mu.Lock()
		defer mu.Unlock()
		var out []Issuer
		for _, is := range issuers() {
			if dropAgent && is.Role == string(ca.RoleAgent) {
				continue
			}
			out = append(out, is)
		}
		return out
	}
	p := New(Config{Store: st, Issuers: served, Validity: time.Hour, MaxLeafTTL: time.Hour})
	if _, err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	has := func() (string, bool) {
		for _, s := range p.Statuses() {
			if s.Issuer.Role == string(ca.RoleAgent) {
				return s.Issuer.Name(), true
			}
		}
		return "", false
	}
	name, ok := has()
	if !ok {
		t.Fatal("the agent intermediate's list has no status after a pass")
	}
	mu.Lock()
	dropAgent = true
	mu.Unlock()
	if _, err := p.Get(ctx, name); !errors.Is(err, ErrUnknownIssuer) {
		t.Fatalf("Get(%s) after the issuer left: %v, want ErrUnknownIssuer", name, err)
	}
	if _, ok := has(); ok {
		t.Errorf("the status of %s is still reported while its list is no longer served", name)
	}
	if got := len(p.Statuses()); got != 3 {
		t.Errorf("%d statuses, want the 3 issuers still served", got)
	}
}

// TestPublishAfterRestore: a store restored from a backup taken before
// some lists were published holds their issuer's older number; the next
// list numbers above every list published, restored or not, where the
// stored number plus one would repeat one relying parties hold already.
func TestPublishAfterRestore(t *testing.T) {
	ctx := context.Background()
	h, st, issuers := setup(t)
	p := New(Config{Store: st, Issuers: issuers, Validity: time.Hour})
	if _, err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	backup := maps.Clone(st.crls)
	published := parse(t, h, st, ca.RoleAgent).Number.Int64()
	for _, after := range []time.Duration{31 * time.Minute, 62 * time.Minute} {
		st.now = st.now.Add(after)
		if _, err := p.Publish(ctx); err != nil {
			t.Fatal(err)
		}
		published = max(published, parse(t, h, st, ca.RoleAgent).Number.Int64())
	}
	// The restore, a while later.
	st.crls = backup
	st.now = st.now.Add(31 * time.Minute)
	if _, err := New(Config{Store: st, Issuers: issuers, Validity: time.Hour}).Publish(ctx); err != nil {
		t.Fatal(err)
	}
	if n := parse(t, h, st, ca.RoleAgent).Number.Int64(); n <= published {
		t.Errorf("the list signed after the restore is number %d, not above %d already published", n, published)
	}
}

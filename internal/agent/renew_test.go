package agent

import (
	"context"
	"crypto/ed25519"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/errinfo"
	"github.com/muster-dev/muster/internal/identity"
)

// joined returns an agent that has joined f as node n1.
func joined(t *testing.T, f *fakeAuthority) (*Agent, Dir) {
	t.Helper()
	dir := Dir(t.TempDir())
	a := newTestAgent(t, dir)
	if _, err := a.Join(t.Context(), f.joinRequest("n1")); err != nil {
		t.Fatal(err)
	}
	return a, dir
}

func TestRenew(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, dir := joined(t, f)
	before, _ := dir.ReadState()
	pass, _ := os.ReadFile(dir.PKCS12PasswordFile())
	caBefore, _ := os.ReadFile(dir.CAFile())

	st, err := a.Renew(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Generation != 1 || st.LastRenewal == nil || st.Serial == before.Serial || st.InstanceID != before.InstanceID {
		t.Errorf("state after renewal %+v", st)
	}
	id, err := dir.LoadIdentity()
	if err != nil {
		t.Fatal(err)
	}
	if serialOf(id.Leaf()) != st.Serial || !identity.SamePublicKey(id.Key.Public(), f.keys()[0]) {
		t.Error("the certificate on disk is not the renewed one")
	}
	if _, err := os.Stat(dir.PendingKeyFile()); !os.IsNotExist(err) {
		t.Error("pending key left after a renewal")
	}
	// The keystore follows, with the same password; the roots stay.
	pass2, _ := os.ReadFile(dir.PKCS12PasswordFile())
	caAfter, _ := os.ReadFile(dir.CAFile())
	if string(pass) != string(pass2) || string(caBefore) != string(caAfter) || !dir.keystoreHolds(id.Leaf()) {
		t.Error("keystore password or roots changed, or the keystore is stale")
	}
	st, err = a.Renew(t.Context())
	if err != nil || st.Generation != 2 {
		t.Fatalf("second renewal: %v, %+v", err, st)
	}
	if got, _ := dir.ReadState(); got.Generation != 2 {
		t.Errorf("state.json generation %d", got.Generation)
	}
}

// TestRenewReusesPendingKey: a reply lost after the authority issued is
// retried with the same key, and answered with the same certificate.
func TestRenewReusesPendingKey(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, dir := joined(t, f)
	old := snapshot(t, dir)
	f.mu.Lock()
	f.loseRenewReply = true
	f.mu.Unlock()
	if _, err := a.Renew(t.Context()); codeOf(err) != codes.Unavailable || !Transient(err) {
		t.Fatalf("got %v, want a transient UNAVAILABLE", err)
	}
	pending, err := dir.pendingKey(false)
	if err != nil || pending == nil {
		t.Fatalf("no pending key after a lost reply: %v", err)
	}
	if snapshot(t, dir)[dir.CertFile()] != old[dir.CertFile()] {
		t.Fatal("the certificate changed though no reply came")
	}
	st, err := a.Renew(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	keys := f.keys()
	if len(keys) != 2 || !identity.SamePublicKey(keys[0], keys[1]) || !identity.SamePublicKey(keys[1], pending.Public()) {
		t.Fatal("the retry did not reuse the pending key")
	}
	if st.Generation != 1 {
		t.Errorf("generation %d", st.Generation)
	}
	if p, _ := dir.pendingKey(false); p != nil {
		t.Error("pending key left after the retry succeeded")
	}
}

func TestRenewRefusals(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, dir := joined(t, f)
	before := snapshot(t, dir)
	for _, reason := range []string{"locked", "deleted", "superseded", "copy_detected"} {
		f.mu.Lock()
		f.renewErrs = []error{status.Error(codes.PermissionDenied, reason)}
		f.mu.Unlock()
		_, err := a.Renew(t.Context())
		var op *OpError
		if !errors.As(err, &op) || op.Op != "renewal" || codeOf(err) != codes.PermissionDenied || Transient(err) || !strings.Contains(err.Error(), reason) {
			t.Errorf("%s: got %v", reason, err)
		}
	}
	// The identity is never removed for a refusal.
	after := snapshot(t, dir)
	for p, data := range before {
		if after[p] != data {
			t.Errorf("%s changed after a refused renewal", p)
		}
	}
}

// A renewal refused because the authority has no record of the
// certificate (a store restored from an older backup) stops the agent;
// the refusal it prints names the way out, a join over this identity,
// with this agent's data directory and node, keeping the code and the
// reason word. A refusal of the request itself gets no such hint.
func TestRenewUnknownCertificateNamesTheWayOut(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, dir := joined(t, f)
	const msg = "certificate unknown to this authority"
	f.mu.Lock()
	f.renewErrs = []error{errinfo.Error(codes.PermissionDenied, msg, "certificate_unknown"), errinfo.Error(codes.InvalidArgument, "bad CSR", "invalid_argument")}
	f.mu.Unlock()
	_, err := a.Renew(t.Context())
	want := "muster agent join --force --data " + string(dir) + " --node n1 with a joining URI from muster token create --node n1"
	if codeOf(err) != codes.PermissionDenied || Transient(err) || errinfo.Reason(err) != "certificate_unknown" ||
		!strings.Contains(err.Error(), msg+"; ") || !strings.Contains(err.Error(), want) {
		t.Errorf("certificate unknown: got %v", err)
	}
	if _, err := a.Renew(t.Context()); codeOf(err) != codes.InvalidArgument || strings.Contains(err.Error(), "join --force") {
		t.Errorf("invalid argument: got %v", err)
	}
}

// A refusal whose way out the authority names for any agent (--data
// ADIR: a certificate under a root it no longer trusts) reaches the
// operator with this agent's own directory in it, code and reason kept.
func TestRenewRefusalNamesThisAgentsDirectory(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, dir := joined(t, f)
	const msg = "client certificate not issued by this authority: it is under a root this authority no longer trusts; join again over this identity: muster agent join --force --data ADIR --node n1 with a joining URI from muster token create --node n1"
	f.mu.Lock()
	f.renewErrs = []error{errinfo.Error(codes.Unauthenticated, msg, "unauthenticated")}
	f.mu.Unlock()
	_, err := a.Renew(t.Context())
	want := "muster agent join --force --data " + string(dir) + " --node n1 with a joining URI"
	if codeOf(err) != codes.Unauthenticated || errinfo.Reason(err) != "unauthenticated" || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "ADIR") {
		t.Errorf("got %v, want %q", err, want)
	}
}

func TestRenewExpired(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	_, dir := joined(t, f)
	st, _ := dir.ReadState()
	later := New(Options{Dir: dir, Now: func() time.Time { return st.NotAfter.Add(time.Second) }})
	_, err := later.Renew(t.Context())
	var exp *ExpiredError
	// The refusal names the join that brings this machine back, with its
	// own directory and node, as the other refusals of its standing do.
	if want := "join again with a new token: muster agent join --force --data " + string(dir) + " --node " + st.NodeID + " with a joining URI from muster token create --node " + st.NodeID; !errors.As(err, &exp) || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want ExpiredError", err)
	}
	if _, _, n := f.calls(); n != 0 {
		t.Error("an expired certificate was sent to the authority")
	}
}

func TestStatus(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, dir := joined(t, f)
	s, err := a.Status()
	if err != nil {
		t.Fatal(err)
	}
	if s.NodeID != "n1" || s.SPIFFEID != "spiffe://"+f.aid+"/agent/n1" || s.AuthorityID != f.aid || s.Authority != f.addr ||
		s.Expired || s.RenewalPending || s.JoinMethod != "token" {
		t.Errorf("status %+v", s)
	}
	if _, err := New(Options{Dir: Dir(t.TempDir())}).Status(); !errors.Is(err, ErrNoIdentity) {
		t.Errorf("status of an empty directory: %v", err)
	}
	_ = dir
}

// A renewal of a directory that does not exist (a mistyped --data) fails
// without creating it.
func TestRenewMissingDirectoryCreatesNothing(t *testing.T) {
	dir := Dir(filepath.Join(t.TempDir(), "typo"))
	_, err := New(Options{Dir: dir}).Renew(context.Background())
	if !errors.Is(err, ErrNoIdentity) || !strings.Contains(err.Error(), string(dir)) {
		t.Fatalf("Renew = %v, want ErrNoIdentity naming %s", err, dir)
	}
	if _, err := os.Stat(string(dir)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Renew left %s behind: %v", dir, err)
	}
}

// OnIdentity hears of the join and of each renewal, after the files are
// written: the Workload API reloads them then.
func TestOnIdentityAfterJoinAndRenewal(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	dir := Dir(t.TempDir())
	var serials []string
	a := New(Options{Dir: dir, Timeout: 5 * time.Second, OnIdentity: func() {
		id, err := dir.LoadIdentity()
		if err != nil {
			t.Errorf("OnIdentity: %v", err)
			return
		}
		serials = append(serials, serialOf(id.Leaf()))
	}})
	st, err := a.Join(t.Context(), f.joinRequest("n1"))
	if err != nil {
		t.Fatal(err)
	}
	st2, err := a.Renew(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(serials) != 2 || serials[0] != st.Serial || serials[1] != st2.Serial {
		t.Fatalf("OnIdentity saw %v, want the join's %s then the renewal's %s", serials, st.Serial, st2.Serial)
	}
}

// TestRenewLocksOnlyAroundFiles: while a renewal waits for a slow
// authority the data directory's lock is free (before, the renewal held
// it across the request, and trust refresh, a task's record or another
// renewal waited for the authority too); a renewal that completes in
// between wins, and the slow one, answered later, does not write over it.
func TestRenewLocksOnlyAroundFiles(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, dir := joined(t, f)
	hold, held := make(chan struct{}), make(chan struct{}, 1)
	f.mu.Lock()
	f.renewHold, f.renewHeld = hold, held
	f.mu.Unlock()
	type result struct {
		st  *State
		err error
	}
	slow := make(chan result, 1)
	go func() {
		st, err := a.Renew(t.Context())
		slow <- result{st, err}
	}()
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the renewal did not reach the authority")
	}
	lctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	unlock, err := dir.lock(lctx)
	if err != nil {
		t.Fatalf("the data directory is locked while a renewal waits for the authority: %v", err)
	}
	unlock()

	// Two renewals complete while the slow one waits: the first with the
	// same pending key (the same certificate), the second with a new key.
	for i := range 2 {
		rctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		_, err := a.Renew(rctx)
		cancel()
		if err != nil {
			t.Fatalf("renewal %d while another waits: %v", i+1, err)
		}
	}
	newest, _ := dir.ReadState()
	close(hold)
	r := <-slow
	if r.err != nil {
		t.Fatalf("the slow renewal: %v", r.err)
	}
	got, _ := dir.ReadState()
	id, err := dir.LoadIdentity()
	if err != nil {
		t.Fatal(err)
	}
	if got.Serial != newest.Serial || got.Generation != newest.Generation || serialOf(id.Leaf()) != newest.Serial || r.st.Serial != newest.Serial {
		t.Fatalf("the slow renewal's older answer was written over the newer identity: on disk %s (generation %d), want %s (generation %d)",
			got.Serial, got.Generation, newest.Serial, newest.Generation)
	}
	if p, _ := dir.pendingKey(false); p != nil {
		t.Error("a pending key is left: the next renewal would send the discarded key again")
	}
}

// TestStatusBoundKeyProblem: a bound-keypair agent's status gives its
// key's fingerprint, nothing when keys/bound.key does not exist, and
// what is wrong, with the path, when it exists but gives no key (cannot
// be read, or holds no Ed25519 key).
func TestStatusBoundKeyProblem(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, dir := joined(t, f)
	st, err := dir.ReadState()
	if err != nil {
		t.Fatal(err)
	}
	st.JoinMethod, st.BoundKeypair = JoinMethodBoundKeypair, "br1"
	if err := dir.writeState(st); err != nil {
		t.Fatal(err)
	}
	path := dir.BoundKeyFile()
	statusNow := func() *Status {
		t.Helper()
		s, err := a.Status()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if s := statusNow(); s.BoundKeyFingerprint != "" || s.BoundKeyProblem != "" {
		t.Errorf("no key file: %q, %q", s.BoundKeyFingerprint, s.BoundKeyProblem)
	}
	if err := os.WriteFile(path, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s := statusNow(); s.BoundKeyFingerprint != "" || !strings.Contains(s.BoundKeyProblem, path+" is not a PEM private key") {
		t.Errorf("garbage in the key file: %q", s.BoundKeyProblem)
	}
	// Unreadable (a directory in its place reads as one for any user,
	// root included, as mode 000 would not).
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if s := statusNow(); s.BoundKeyFingerprint != "" || !strings.Contains(s.BoundKeyProblem, path) || !strings.Contains(s.BoundKeyProblem, "is a directory") {
		t.Errorf("unreadable key file: %q", s.BoundKeyProblem)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	pub, err := CreateBoundKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s := statusNow(); s.BoundKeyFingerprint != pub.Fingerprint() || s.BoundKeyProblem != "" {
		t.Errorf("a good key: %q, %q", s.BoundKeyFingerprint, s.BoundKeyProblem)
	}
}

// TestStatusPendingRotation: a bound-keypair agent's status says a
// rotation is pending while keys/bound.next.key exists, with that key's
// fingerprint (or why it gives none), and nothing once it is settled.
func TestStatusPendingRotation(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, _ := boundJoined(t, f)
	s, err := a.Status()
	if err != nil {
		t.Fatal(err)
	}
	if s.BoundKeyRotationPending || s.BoundKeyNextFingerprint != "" {
		t.Fatalf("no pending key, yet %+v", s)
	}
	next, err := a.newPendingBoundKey()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := boundkeypair.NewPublicKey(next.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	if s, err = a.Status(); err != nil {
		t.Fatal(err)
	}
	if !s.BoundKeyRotationPending || s.BoundKeyNextFingerprint != pub.Fingerprint() || s.BoundKeyNextProblem != "" {
		t.Errorf("pending key %s: %+v", pub.Fingerprint(), s)
	}
	if err := os.WriteFile(a.dir.NextBoundKeyFile(), []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err = a.Status(); err != nil {
		t.Fatal(err)
	}
	if !s.BoundKeyRotationPending || !strings.Contains(s.BoundKeyNextProblem, "bound.next.key is not a PEM private key") {
		t.Errorf("garbage pending key: %+v", s)
	}
}

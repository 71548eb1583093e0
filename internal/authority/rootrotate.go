package authority

import (
	"cmp"
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/enroll"
	"github.com/muster-dev/muster/internal/store"
)

// Root rotation (DESIGN.md "CA lifecycle", "Root rotation"), in phases
// like Teleport's CA rotation: rotate makes a new root and the two
// cross-certificates (init: both roots trusted, the old one signs), then
// update_agents (agents learn the new root), update_servers (the leader
// activates intermediates signed by the new root, so every new leaf chains
// to it), standby (the old root leaves the trusted set). Each phase rolls
// back to the one before; a rollback from init abandons the new root. The
// state is one store record; every change is one write conditional on the
// version read (store.CARootStore), so of replicas changing it at once one
// wins and the others answer that it changed.

// rootPhases is the order of the phases; rollback goes one back, and from
// init to none.
var rootPhases = []string{store.RootPhaseInit, store.RootPhaseUpdateAgents, store.RootPhaseUpdateServers, store.RootPhaseStandby}

// nextRootPhase returns the phase after p, or a refusal that says what to
// do instead.
func nextRootPhase(p string) (string, error) {
	for i, q := range rootPhases[:len(rootPhases)-1] {
		if q == p {
			return rootPhases[i+1], nil
		}
	}
	return "", rootRule("no root rotation in progress (phase " + p + "); start one with muster ca root rotate")
}

// rollbackRootPhase returns the phase before p (none from init).
func rollbackRootPhase(p string) (string, error) {
	if p == store.RootPhaseInit {
		return store.RootPhaseNone, nil
	}
	for i, q := range rootPhases[1:] {
		if q == p {
			return rootPhases[i], nil
		}
	}
	return "", rootRule("no root rotation to roll back (phase none); muster ca root status shows the roots")
}

// rootRule is a refusal of a root rotation step that the operator can act
// on: FAILED_PRECONDITION with its text.
type rootRule string

func (r rootRule) Error() string { return string(r) }

// errRootChanged answers a step that lost its conditional write: ABORTED,
// as a signer step or a PSK rotation that lost its write is, since the
// operator looks again before asking again.
var errRootChanged = rootAborted("the root rotation changed concurrently (another operator or replica took a step); run muster ca root status and try again")

// rootAborted is a refusal of a root rotation step that lost to another
// step: ABORTED with its text.
type rootAborted string

func (r rootAborted) Error() string { return string(r) }

// rootState is the store's rotation, parsed and with its keys opened.
type rootState struct {
	row store.RootRotation
	// old is the root being replaced: the data directory's while the
	// record holds none; oldKey is nil when the authority does not hold
	// it.
	old, new                     *x509.Certificate
	oldKey, newKey               crypto.Signer
	crossNewByOld, crossOldByNew *x509.Certificate
}

// rootKeyName is the custody name of a root's key.
func rootKeyName(c *x509.Certificate) string { return "root/" + c.SerialNumber.Text(16) }

// readRoots reads the rotation and opens the keys it holds: a root whose
// sealed key does not open to its certificate's key fails the read (a
// record not written by this authority).
func (in *intermediates) readRoots(ctx context.Context) (*rootState, error) {
	row, err := in.s.store.GetRootRotation(ctx)
	if err != nil {
		return nil, err
	}
	return in.openRoots(ctx, row)
}

// openRoots is readRoots for a rotation record already read. A root
// whose key the token no longer holds fails it (the authority does not
// start) with what is missing and the way out (rootKeyWayOut).
func (in *intermediates) openRoots(ctx context.Context, row store.RootRotation) (*rootState, error) {
	st, err := openRootState(ctx, in.custody, in.s.ca, row)
	if errors.Is(err, custody.ErrKeyMissing) {
		return nil, fmt.Errorf("%w; %s", err, rootKeyWayOut)
	}
	return st, err
}

// rootKeyWayOut is what the operator can do about a root key gone from the
// token (docs/hsm.md "A lost token"): bring the object back, or, since no
// other key can sign intermediates under that root (a root rotation needs
// it to certify its successor, and migrate-custody --rollback has no sealed
// copy of a key made in the token), start a new authority.
const rootKeyWayOut = "restore the token from its backup so that it holds that object again, then start the authority again; " +
	"without a backup the root's key is lost: neither a root rotation nor muster ca migrate-custody --rollback can replace it (both need the key), " +
	"and the way out is a new authority: muster init --data NEWDIR, then the agents join it again (docs/hsm.md \"A lost token\")"

// openRootState is openRoots with the data directory's hierarchy h and
// the custody c that holds the stored roots' keys; with c nil it opens
// none of them (only the data directory's root key is set).
func openRootState(ctx context.Context, c custody.Custody, h *ca.Hierarchy, row store.RootRotation) (*rootState, error) {
	var err error
	st := &rootState{row: row, old: h.Root}
	if h.RootKey != nil {
		st.oldKey = h.RootKey
	}
	open := func(der, ref []byte) (*x509.Certificate, crypto.Signer, error) {
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, nil, err
		}
		if !cert.IsCA || cert.CheckSignatureFrom(cert) != nil {
			return nil, nil, errors.New("not a self-signed root")
		}
		if ref == nil || c == nil {
			// Taken offline (muster ca root export-key): the authority
			// warns before each successor is due, as without
			// DIR/ca/root.key.
			return cert, nil, nil
		}
		k, err := c.Signer(ctx, rootKeyName(cert), custody.Key{Public: cert.PublicKey, Ref: ref})
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", ca.Fingerprint(cert), err)
		}
		return cert, k, nil
	}
	if row.OldCertDER != nil {
		if st.old, st.oldKey, err = open(row.OldCertDER, row.OldKeyRef); err != nil {
			return nil, fmt.Errorf("the stored current root: %w", err)
		}
	}
	if row.NewCertDER != nil {
		if st.new, st.newKey, err = open(row.NewCertDER, row.NewKeyRef); err != nil {
			return nil, fmt.Errorf("the stored new root: %w", err)
		}
		for _, x := range []struct {
			der      []byte
			into     **x509.Certificate
			subj, by *x509.Certificate
		}{{row.CrossNewByOld, &st.crossNewByOld, st.new, st.old}, {row.CrossOldByNew, &st.crossOldByNew, st.old, st.new}} {
			c, err := x509.ParseCertificate(x.der)
			if err != nil {
				return nil, fmt.Errorf("a stored cross-certificate: %w", err)
			}
			if string(c.RawSubjectPublicKeyInfo) != string(x.subj.RawSubjectPublicKeyInfo) || c.CheckSignatureFrom(x.by) != nil {
				return nil, errors.New("a stored cross-certificate does not certify its root's key under the other root")
			}
			*x.into = c
		}
	}
	if row.Phase != store.RootPhaseNone && st.new == nil {
		return nil, fmt.Errorf("root rotation in phase %s without a new root", row.Phase)
	}
	return st, nil
}

// set is the roots of the state's phase.
func (st *rootState) set() *ca.RootSet {
	switch st.row.Phase {
	case store.RootPhaseInit, store.RootPhaseUpdateAgents:
		return &ca.RootSet{Trusted: []*x509.Certificate{st.old, st.new}, Cross: []*x509.Certificate{st.crossNewByOld, st.crossOldByNew},
			Signing: st.old, SigningKey: st.oldKey}
	case store.RootPhaseUpdateServers:
		return &ca.RootSet{Trusted: []*x509.Certificate{st.new, st.old}, Cross: []*x509.Certificate{st.crossNewByOld, st.crossOldByNew},
			Signing: st.new, SigningKey: st.newKey}
	case store.RootPhaseStandby:
		// The old root is no longer trusted. The certificate of the new
		// root's key by the old one still lets a holder of the old root
		// alone (an agent offline through the whole rotation) learn the
		// new one, as it could have during the overlap.
		return &ca.RootSet{Trusted: []*x509.Certificate{st.new}, Cross: []*x509.Certificate{st.crossNewByOld},
			Signing: st.new, SigningKey: st.newKey}
	}
	return &ca.RootSet{Trusted: []*x509.Certificate{st.old}, Signing: st.old, SigningKey: st.oldKey}
}

// Roots returns the authority's roots now, as the trust bundle carries
// them: every trusted root (the one that signs the active intermediates
// first), the cross-certificates of a rotation in progress (each has one
// root's key issued by the other; an agent accepts a root it does not yet
// trust only through one that verifies under a root it does), and the
// signing root. Read from the store through the same path as the
// intermediates, so it changes on every replica within moments of a
// step.
func (s *Server) Roots() (trusted, cross []*x509.Certificate, signing *x509.Certificate) {
	r := s.ca.Roots()
	return r.Trusted, r.Cross, r.Signing
}

// RootStatus is what muster ca root status shows.
type RootStatus struct {
	Phase     string
	Version   int64
	Old, New  *x509.Certificate
	Signing   *x509.Certificate
	Trusted   []*x509.Certificate
	Cross     []*x509.Certificate
	StartedAt time.Time
	ChangedAt time.Time
	// HoldsOldKey tells whether the authority holds the old (current)
	// root's key: rotate and a rollback to update_agents need it.
	HoldsOldKey bool
}

// rootStatus reads the rotation's certificates without opening the keys
// the store holds for them: muster ca root status is what an operator
// asks while a token is away (or lacks a root's key), and it answered
// UNAVAILABLE then, though it signs nothing. A stored key counts as held
// by its reference; the step that needs it opens it and says what is
// wrong.
func (s *Server) rootStatus(ctx context.Context) (RootStatus, error) {
	row, err := s.store.GetRootRotation(ctx)
	if err != nil {
		return RootStatus{}, err
	}
	st, err := openRootState(ctx, nil, s.ca, row)
	if err != nil {
		return RootStatus{}, err
	}
	set := st.set()
	holdsOld := st.oldKey != nil || row.OldCertDER != nil && row.OldKeyRef != nil
	return RootStatus{Phase: st.row.Phase, Version: st.row.Version, Old: st.old, New: st.new, Signing: set.Signing,
		Trusted: set.Trusted, Cross: set.Cross, StartedAt: st.row.StartedAt, ChangedAt: st.row.ChangedAt, HoldsOldKey: holdsOld}, nil
}

// preparedRoot is a new root the authority made for a rotation whose
// current root key it does not hold (PrepareRoot), with the certificate of
// its key by the current root the operator signed offline.
type preparedRoot struct {
	cert, crossNewByOld []byte
	sealedKey           []byte
}

// currentRoot is the root a new rotation replaces, and its key if held.
func (st *rootState) currentRoot() (*x509.Certificate, crypto.Signer) {
	if st.row.Phase == store.RootPhaseStandby {
		return st.new, st.newKey // the root the last rotation made
	}
	return st.old, st.oldKey
}

// currentExported reports whether the current root is one a root
// rotation made whose key was taken out with muster ca root export-key:
// then its key is that command's file, not DIR/ca/root.key (the root
// muster init made).
func (st *rootState) currentExported() bool {
	if st.row.Phase == store.RootPhaseStandby {
		return st.row.NewCertDER != nil && st.row.NewKeyRef == nil
	}
	return st.row.OldCertDER != nil && st.row.OldKeyRef == nil
}

// rootKeyHint says where the key of the current root is, for a refusal
// that asks for it.
func (st *rootState) rootKeyHint() string {
	if st.currentExported() {
		return "the file muster ca root export-key wrote for this root (its --out); ca/root.key holds the key of the root muster init made, which is no longer current"
	}
	return "ca/root.key as muster init wrote it"
}

func (st *rootState) canStart() error {
	if p := st.row.Phase; p != store.RootPhaseNone && p != store.RootPhaseStandby {
		return rootRule("a root rotation is in progress (phase " + p + "); finish it with muster ca root next-phase or undo it with muster ca root rollback")
	}
	return nil
}

// newRoot makes a new root with its key in custody.
func (s *Server) newRoot(ctx context.Context) (*x509.Certificate, custody.Key, crypto.Signer, error) {
	now, err := s.store.Now(ctx)
	if err != nil {
		return nil, custody.Key{}, nil, err
	}
	serial, err := ca.NewSerial()
	if err != nil {
		return nil, custody.Key{}, nil, err
	}
	name := "root/" + serial.Text(16)
	k, err := s.inter.custody.Create(ctx, name, custody.ECDSAP256)
	if err != nil {
		return nil, custody.Key{}, nil, err
	}
	signer, err := s.inter.custody.Signer(ctx, name, k)
	if err != nil {
		_ = s.inter.custody.Destroy(ctx, name, k)
		return nil, custody.Key{}, nil, err
	}
	root, err := ca.NewRoot(s.info.Name, serial, signer, now)
	if err != nil {
		_ = s.inter.custody.Destroy(ctx, name, k)
	}
	return root, k, signer, err
}

// prepareRoot makes a new root for rotateRoot with a prepared root: the
// caller certifies its key with the current root's key, which the
// authority does not hold. Nothing is stored; the sealed key opens only
// under this authority's storage key.
func (s *Server) prepareRoot(ctx context.Context) (root, current *x509.Certificate, sealed []byte, exported bool, _ error) {
	st, err := s.inter.readRoots(ctx)
	if err != nil {
		return nil, nil, nil, false, err
	}
	if err := st.canStart(); err != nil {
		return nil, nil, nil, false, err
	}
	cur, _ := st.currentRoot()
	root, k, _, err := s.newRoot(ctx)
	if err != nil {
		return nil, nil, nil, false, err
	}
	return root, cur, k.Ref, st.currentExported(), nil
}

// rotateRoot starts a root rotation: a new root (key in custody), the
// certificate of its key by the current root and of the current root's
// key by it; phase init. Without prepared, the authority makes the new
// root and certifies it with the current root's key, which it must hold
// (the data directory's, or the root a finished rotation made); with it,
// the caller did that with the key offline.
func (s *Server) rotateRoot(ctx context.Context, actor string, prepared *preparedRoot) (RootStatus, error) {
	st, err := s.inter.readRoots(ctx)
	if err != nil {
		return RootStatus{}, err
	}
	if err := st.canStart(); err != nil {
		return RootStatus{}, err
	}
	cur, curKey := st.currentRoot()
	next := store.RootRotation{Phase: store.RootPhaseInit, OldCertDER: st.row.OldCertDER, OldKeyRef: st.row.OldKeyRef}
	if st.row.Phase == store.RootPhaseStandby {
		next.OldCertDER, next.OldKeyRef = st.row.NewCertDER, st.row.NewKeyRef
	}
	now, err := s.store.Now(ctx)
	if err != nil {
		return RootStatus{}, err
	}
	var (
		root     *x509.Certificate
		ref      []byte
		signer   crypto.Signer
		newByOld *x509.Certificate
	)
	if prepared == nil {
		if curKey == nil {
			return RootStatus{}, rootRule("rotating the root needs the current root's key (" + ca.Fingerprint(cur) + "), which this authority does not hold; give it with muster ca root rotate --root-key FILE, FILE being " + st.rootKeyHint())
		}
		var k custody.Key
		if root, k, signer, err = s.newRoot(ctx); err != nil {
			return RootStatus{}, err
		}
		ref = k.Ref
		if newByOld, err = ca.CrossSign(root, cur, curKey, now); err != nil {
			return RootStatus{}, err
		}
	} else {
		bad := func(what string) (RootStatus, error) {
			return RootStatus{}, invalidArgument{"the prepared root: " + what + "; run muster ca root rotate --root-key FILE again"}
		}
		if root, err = x509.ParseCertificate(prepared.cert); err != nil || !root.IsCA || root.CheckSignatureFrom(root) != nil {
			return bad("not a self-signed root")
		}
		if signer, err = s.inter.custody.Signer(ctx, rootKeyName(root), custody.Key{Public: root.PublicKey, Ref: prepared.sealedKey}); err != nil {
			return bad("its sealed key is not one this authority made for it")
		}
		ref = prepared.sealedKey
		if newByOld, err = x509.ParseCertificate(prepared.crossNewByOld); err != nil || !ca.CrossCertifies(newByOld, root, []*x509.Certificate{cur}, now) ||
			newByOld.CheckSignatureFrom(cur) != nil {
			return bad("the cross-certificate does not certify its key under the current root " + ca.Fingerprint(cur) + " (was --root-key that root's key?)")
		}
	}
	oldByNew, err := ca.CrossSign(cur, root, signer, now)
	if err != nil {
		return RootStatus{}, err
	}
	next.NewCertDER, next.NewKeyRef, next.CrossNewByOld, next.CrossOldByNew = root.Raw, ref, newByOld.Raw, oldByNew.Raw
	// Started with its record (the caller's ca.root_rotate), or not at all.
	link := s.callerLink(ctx, "ca.root_rotate", ca.Fingerprint(root), "")
	if err := s.store.PutRootRotation(ctx, st.row, next, true, link.Build); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return RootStatus{}, errRootChanged
		}
		return RootStatus{}, err
	}
	s.audit.Appended(link)
	s.log.Info("root rotation started", "phase", store.RootPhaseInit, "old_root", ca.Fingerprint(cur), "new_root", ca.Fingerprint(root), "actor", actor)
	s.loadNow(ctx)
	return s.rootStatus(ctx)
}

// rootStep is the way stepRoot moves the rotation.
type rootStep int

const (
	rootNext rootStep = iota
	// rootNextLeavingAway is rootNext that moves to standby without
	// waiting for agents away under the old root (muster ca root
	// next-phase --leave-away): each must then join again by hand.
	rootNextLeavingAway
	rootBack
	// rootBackNow is rootBack that abandons from init even while agent
	// certificates under the new root may be valid (muster ca root
	// rollback --abandon-now: the new root's key is compromised).
	rootBackNow
)

// stepRoot moves the rotation one phase on (next) or back.
// callerCert, if not nil, is the operator's certificate: standby is
// refused while it chains to the old root, which standby stops trusting
// (the operator would lock themself out, rollback included).
func (s *Server) stepRoot(ctx context.Context, actor string, step rootStep, callerCert ...*x509.Certificate) (from string, _ RootStatus, _ error) {
	return s.stepRootSeen(ctx, actor, step, "", callerCert...)
}

// errRootMovedOn answers a step asked from a phase the rotation has left:
// taken from where it is now, it would be another step than the one asked
// (two next-phase calls would advance two phases, two rollbacks from
// update_agents would abandon the new root). cmd is the step's command.
type errRootMovedOn struct{ seen, now, cmd string }

func (e errRootMovedOn) Error() string {
	return fmt.Sprintf("the root rotation is in phase %s, not %s as when this step was asked (another operator or replica moved it meanwhile), so nothing changed: run muster ca root status, then %s again if it is still wanted", e.now, e.seen, e.cmd)
}

// stepRootSeen is stepRoot taken only from phase seen (any when ""). The
// phase is checked on the row the write is conditional on (PutRootRotation
// writes only if the row has not changed), so it is one conditional write.
func (s *Server) stepRootSeen(ctx context.Context, actor string, step rootStep, seen string, callerCert ...*x509.Certificate) (from string, _ RootStatus, _ error) {
	rollback := step == rootBack || step == rootBackNow
	// The phase is read before the keys are opened, so a step refused
	// because a root's key cannot be opened (its token away) is audited
	// as from which phase it was asked.
	row, err := s.store.GetRootRotation(ctx)
	if err != nil {
		return "", RootStatus{}, err
	}
	from = row.Phase
	if seen != "" && seen != from {
		cmd := "muster ca root next-phase"
		if rollback {
			cmd = "muster ca root rollback"
		}
		return from, RootStatus{}, errRootMovedOn{seen: seen, now: from, cmd: cmd}
	}
	st, err := s.inter.openRoots(ctx, row)
	if err != nil {
		return from, RootStatus{}, err
	}
	if s.rootStepRead != nil {
		s.rootStepRead()
	}
	var to string
	if rollback {
		to, err = rollbackRootPhase(from)
	} else {
		to, err = nextRootPhase(from)
	}
	if err != nil {
		return from, RootStatus{}, err
	}
	if step == rootNextLeavingAway && to != store.RootPhaseStandby {
		// A script that keeps the flag on every call would otherwise skip
		// the wait at standby without anyone having decided to.
		return from, RootStatus{}, badRequest(fmt.Sprintf("--leave-away applies only to the step to standby, and this step goes from %s to %s; nothing changed: run it without the flag: muster ca root next-phase --from %s", from, to, from))
	}
	next := st.row
	reason := ""
	switch {
	case to == store.RootPhaseUpdateServers && !rollback && st.newKey == nil:
		return from, RootStatus{}, rootRule("the new root's key does not open; it cannot sign intermediates")
	case to == store.RootPhaseUpdateAgents && rollback && st.oldKey == nil && st.currentExported():
		// The old root is a rotation's whose key was exported: the
		// data directory's ca/root.key is another root's, and nothing
		// puts the exported key back.
		return from, RootStatus{}, rootRule("rolling back to update_agents signs intermediates with the old root again, whose key (" +
			ca.Fingerprint(st.old) + ") was taken out with muster ca root export-key and is no longer in this authority; ca/root.key is the key of another root (the one muster init made) and does not help; go on with muster ca root next-phase")
	case to == store.RootPhaseUpdateAgents && rollback && st.oldKey == nil:
		// The intermediates go back under the old root: the leader
		// signs fresh ones with its key.
		return from, RootStatus{}, rootRule("rolling back to update_agents signs intermediates with the old root again, and this authority does not hold its key (" +
			ca.Fingerprint(st.old) + "); put it back in the data directory (ca/root.key) and restart the leader, or go on with muster ca root next-phase")
	case to == store.RootPhaseStandby && !rollback:
		if err := s.readyToDrop(ctx, st.new, "standby stops trusting the old root", callerCert); err != nil {
			return from, RootStatus{}, err
		}
		left, err := s.connectedLeftBehind(ctx, st.new, step == rootNextLeavingAway)
		if err != nil {
			return from, RootStatus{}, err
		}
		if step == rootNextLeavingAway {
			reason = leftAwayReason(left)
		}
	case to == store.RootPhaseNone:
		if err := s.readyToDrop(ctx, st.old, "abandoning the rotation stops trusting the new root", callerCert); err != nil {
			return from, RootStatus{}, err
		}
		if step != rootBackNow {
			if err := s.newRootLeavesEnded(ctx, st.new); err != nil {
				return from, RootStatus{}, err
			}
		}
		// Abandoned: the new root and its cross-certificates are dropped.
		next.NewCertDER, next.NewKeyRef, next.CrossNewByOld, next.CrossOldByNew = nil, nil, nil, nil
	}
	next.Phase = to
	// Changed with its record (the caller's ca.root_phase), or not at all.
	link := s.callerLink(ctx, "ca.root_phase", from+"->"+to, reason)
	if err := s.store.PutRootRotation(ctx, st.row, next, false, link.Build); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return from, RootStatus{}, errRootChanged
		}
		return from, RootStatus{}, err
	}
	s.audit.Appended(link)
	if reason != "" {
		s.log.Warn("root rotation phase changed, agents away left behind", "from", from, "to", to, "actor", actor, "reason", reason)
	} else {
		s.log.Info("root rotation phase changed", "from", from, "to", to, "actor", actor)
	}
	s.loadNow(ctx)
	s.pokeCAClock()
	switch {
	case to == store.RootPhaseUpdateServers && !rollback:
		// The leader moves the intermediates within moments; answer once
		// it has, so that what the operator does next (muster admin
		// renew) is signed under the new root.
		s.awaitIntermediatesUnder(ctx, st.new, 30*time.Second)
	case to == store.RootPhaseUpdateAgents && rollback:
		s.awaitIntermediatesUnder(ctx, st.old, 30*time.Second)
	}
	res, err := s.rootStatus(ctx)
	return from, res, err
}

// rootSteps brings the active intermediates under the signing root (run by
// the leader's CA clock, each step one conditional write): a role whose
// active intermediate another root signed gets a successor signed by the
// signing root, prepared, then activated once it has been published for
// caPublishWindow (as every other activation: no replica signs with an
// intermediate the others do not yet accept); a prepared one signed by
// another root is discarded first. The one it replaces is retiring, and
// stays accepted while its root is trusted.
func (s *Server) rootSteps(ctx context.Context, rows []store.CACert, now time.Time) (changed bool) {
	rs := s.ca.Roots()
	for _, role := range caRoles {
		var active *x509.Certificate
		var prepared *store.CACert
		for i := range rows {
			r := &rows[i]
			if r.Role != string(role) {
				continue
			}
			switch r.State {
			case store.CAActive:
				active, _ = s.caCerts.parse(r.Serial, r.CertDER)
			case store.CAPrepared:
				prepared = r
			}
		}
		if active == nil {
			continue
		}
		if s.caCerts.signedBy(active, rs.Signing) {
			if prepared != nil {
				if p, err := s.caCerts.parse(prepared.Serial, prepared.CertDER); err != nil || !s.caCerts.signedBy(p, rs.Signing) {
					s.endIntermediate(ctx, "ca.discard", string(role), prepared.Serial, "root rotation: prepared under a root that no longer signs",
						s.store.DiscardCACert)
					changed = true
				}
			}
			continue
		}
		why := "root rotation: the active intermediate is not signed by the signing root " + ca.Fingerprint(rs.Signing)
		if prepared != nil {
			if p, err := s.caCerts.parse(prepared.Serial, prepared.CertDER); err == nil && s.caCerts.signedBy(p, rs.Signing) {
				if !now.Before(prepared.CreatedAt.Add(s.caPublishWindow())) && !s.discardKeyless(ctx, *prepared) {
					link := s.caStepLink("ca.activate", string(role), prepared.Serial, why)
					s.caChange(ctx, "ca.activate", string(role), prepared.Serial, why, link, s.store.ActivateCACert(ctx, string(role), prepared.Serial, link.Build))
				}
				changed = true
				continue
			}
			s.endIntermediate(ctx, "ca.discard", string(role), prepared.Serial, "root rotation: prepared under a root that no longer signs",
				s.store.DiscardCACert)
			changed = true
		}
		if rs.SigningKey == nil {
			s.warnNoRootKey(role, active, now)
			continue
		}
		var link *audit.Link
		row, err := s.inter.prepareUnder(ctx, role, rs.Signing, rs.SigningKey, s.caIntermediateTTL(), func(row store.CACert) *audit.Link {
			link = s.caStepLink("ca.prepare", string(role), row.Serial, why)
			return link
		})
		s.caChange(ctx, "ca.prepare", string(role), row.Serial, why, link, err)
		changed = true
	}
	return changed
}

// loadNow reads the roots and intermediates at once on this replica, so the
// step's answer and the CA clock see it; the others read it on the change
// notification.
func (s *Server) loadNow(ctx context.Context) {
	if err := s.inter.load(ctx); err != nil {
		s.log.Error("reading the CA intermediates from the store failed; signing with the ones read before", "err", err)
		s.inter.changed()
	}
}

// joinFingerprint is the fingerprint joining URIs carry: the signing
// root's, so from update_servers on new URIs pin the new root (a join
// pinned to the old one still works until standby).
func (s *Server) joinFingerprint() string { return ca.Fingerprint(s.ca.Roots().Signing) }

// trustedRootsPEM is every trusted root, the signing one first: an
// operator's ca.crt, so that an identity issued during a rotation keeps
// working after standby.
func trustedRootsPEM(h *ca.Hierarchy) []byte {
	var out []byte
	for _, r := range h.Roots().Trusted {
		out = append(out, ca.EncodeCertPEM(r)...)
	}
	return out
}

// intermediatesNotUnder counts the active intermediates root did not sign.
func (s *Server) intermediatesNotUnder(ctx context.Context, root *x509.Certificate) (int, error) {
	rows, err := s.store.ListCACerts(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range rows {
		if r.State != store.CAActive {
			continue
		}
		if c, err := x509.ParseCertificate(r.CertDER); err != nil || c.CheckSignatureFrom(root) != nil {
			n++
		}
	}
	return n, nil
}

// newRootLeavesEnded refuses to abandon a rotation while an agent
// certificate signed under its new root (from update_servers until the
// rollback to update_agents) may still be valid. Its agent could not
// renew once the new root is dropped, and no rollback would trust it
// again: it would have to join anew. A running agent renews under the old
// root within its certificate's lifetime, so waiting that long after the
// rollback leaves none behind, counted on the store's clock, which wrote
// RetiringAt. The lifetimes are this replica's settings
// (--agent-cert-ttl, --bound-keypair-cert-ttl), as every replica's should
// be.
func (s *Server) newRootLeavesEnded(ctx context.Context, newRoot *x509.Certificate) error {
	if newRoot == nil {
		return nil
	}
	rows, err := s.store.ListCACerts(ctx)
	if err != nil {
		return err
	}
	longest := max(cmp.Or(s.cfg.AgentCertTTL, enroll.DefaultAgentCertTTL), cmp.Or(s.cfg.BoundKeypairCertTTL, enroll.DefaultBoundKeypairCertTTL))
	// RetiringAt is the store's time: compared with this replica's clock,
	// a replica ahead of the store would abandon while certificates under
	// the new root may still be valid.
	now, err := s.store.Now(ctx)
	if err != nil {
		return err
	}
	var until time.Time
	for _, r := range rows {
		if r.Role != string(ca.RoleAgent) || r.State != store.CARetiring || r.RetiringAt.IsZero() {
			continue
		}
		c, err := s.caCerts.parse(r.Serial, r.CertDER)
		if err != nil || !s.caCerts.signedBy(c, newRoot) {
			continue
		}
		end := r.RetiringAt.Add(longest + retireMargin)
		if r.NotAfter.Before(end) {
			end = r.NotAfter
		}
		if end.After(now) && end.After(until) {
			until = end
		}
	}
	if until.IsZero() {
		return nil
	}
	return rootRule("abandoning the rotation stops trusting the new root, and agent certificates issued under it (in update_servers) stay valid until " +
		until.UTC().Format(time.RFC3339) + ": an agent still holding one then could not renew, and no rollback would bring it back (it would have to join again); " +
		"every running agent renews under the old root before then: run muster ca root rollback again after " + until.UTC().Format(time.RFC3339) +
		", or, if the new root's key is compromised, abandon now with muster ca root rollback --abandon-now")
}

// awaitIntermediatesUnder waits, at most d, until every active
// intermediate is signed by root, and reads them. It ends as the
// authority stops: this replica's leader has stepped down then, so the
// wait would only hold the graceful stop (and, its listeners closed,
// every agent's renewal) until the stop's grace cut it; the phase is
// written, and the next leader moves the intermediates.
func (s *Server) awaitIntermediatesUnder(ctx context.Context, root *x509.Certificate, d time.Duration) {
	deadline := time.Now().Add(d)
	var stopping <-chan struct{} // nil, never ready, in tests without New
	if s.stopping != nil {
		stopping = s.stopping.Done()
	}
	for {
		n, err := s.intermediatesNotUnder(ctx, root)
		if err != nil || n == 0 || time.Now().After(deadline) {
			s.loadNow(ctx)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-stopping:
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// readyToDrop refuses a step that leaves keep the only trusted root
// (why says which) while something still depends on the other: an active
// intermediate keep did not sign (the leader has not moved it yet), or
// the caller's operator certificate, which would be refused from then on,
// a rollback included.
func (s *Server) readyToDrop(ctx context.Context, keep *x509.Certificate, why string, callerCert []*x509.Certificate) error {
	n, err := s.intermediatesNotUnder(ctx, keep)
	if err != nil {
		return err
	}
	if n > 0 {
		return rootRule(fmt.Sprintf("%s, and %d active intermediates are not yet signed by the root that stays, %s (the leader moves them within seconds of a phase change; if it cannot, its log says why); run the command again shortly", why, n, ca.Fingerprint(keep)))
	}
	for _, leaf := range callerCert {
		if leaf == nil {
			continue
		}
		for _, inter := range s.ca.Accepted(ca.RoleAdmin) {
			if leaf.CheckSignatureFrom(inter) == nil && inter.CheckSignatureFrom(keep) != nil {
				return rootRule(why + ", and your operator identity chains to that root: it would be refused from then on, even to roll back; run muster admin renew, then this command again")
			}
		}
	}
	return nil
}

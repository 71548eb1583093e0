package authority

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/crl"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/store"
)

// caRoles are the intermediates kept in the store and rotated. The policy
// signing certificate is not: it stays in the data directory.
var caRoles = []ca.Role{ca.RoleBootstrap, ca.RoleServer, ca.RoleAgent, ca.RoleAdmin}

// intermediates keeps the hierarchy's intermediates in step with the
// store (DESIGN.md "CA lifecycle"): read at start, and again whenever a
// replica announces a CA step (store.ChangeCA), so every replica signs
// with the same active intermediate. Their keys are used through custody.
type intermediates struct {
	s       *Server
	custody custody.Custody
	wake    chan struct{}

	mu      sync.Mutex
	signers map[string]crypto.Signer // opened keys, by serial
	// failing is why the last read failed, nil once one succeeds: the
	// replica signs with intermediates the others may have moved on from,
	// so it reports not ready (readyErr) until a read succeeds. Not under
	// mu, which a read holds while it opens keys (a slow token), so that
	// /readyz never waits for one.
	failing atomic.Pointer[error]
	// loaded names the rows (serial and state) of the set in use, so a
	// periodic read that finds the same rows changes nothing.
	loaded string
	// active are the active intermediates' keys in a token, as the last
	// successful read found them: what probeKeys looks for.
	active atomic.Pointer[[]activeKey]
	// keysFailing is why an active intermediate's key cannot sign, as
	// the last probe found (nil: every one's object is in the token).
	keysFailing atomic.Pointer[error]
	// keyOK is, by role/serial, 1 while the last probe found the active
	// key's object, 0 when it did not: muster_ca_key_available.
	keyOK sync.Map
}

// activeKey is an active intermediate whose key is a token object.
type activeKey struct {
	role, serial string
	key          custody.Key
}

// keyProbe is how often each replica looks in the token for the active
// intermediates' key objects: a lookup (no signature) per key, so that
// /readyz stops saying ready soon after one disappears, without a round
// trip to the token per probe of /readyz.
const keyProbe = 10 * time.Second

// caRefresh is how often every replica reads the intermediates even
// without a change notification, so that one whose notifications stall
// silently still publishes a prepared intermediate well within
// caPublishWindow.
const caRefresh = 3 * time.Second

// caLoadTimeout bounds one read of the intermediates, keys opened
// included: a token that stops answering fails the read (and readiness)
// rather than holding the reader.
const caLoadTimeout = 30 * time.Second

func newIntermediates(s *Server) (*intermediates, error) {
	c, err := CACustody(s.cfg.StorageKey, s.cfg.Token)
	if err != nil {
		return nil, err
	}
	if s.cfg.WrapCACustody != nil {
		if c, err = s.cfg.WrapCACustody(c); err != nil {
			return nil, err
		}
	}
	return &intermediates{s: s, custody: c, wake: make(chan struct{}, 1), signers: map[string]crypto.Signer{}}, nil
}

// keyName is the custody name of an intermediate's key.
func keyName(role, serial string) string { return role + "/" + serial }

// start moves the data directory's intermediates into the store where the
// store has no active one of their role (an authority upgraded from a
// version that kept them in files only; replicas starting together import
// one between them), then reads the store's.
func (in *intermediates) start(ctx context.Context) error {
	if err := in.importFiles(ctx); err != nil {
		return err
	}
	if err := in.load(ctx); err != nil {
		return fmt.Errorf("authority: reading the CA intermediates from the store: %w", err)
	}
	return nil
}

func (in *intermediates) importFiles(ctx context.Context) error {
	rows, err := in.s.store.ListCACerts(ctx)
	if err != nil {
		return fmt.Errorf("authority: listing the CA intermediates: %w", err)
	}
	active := map[string]bool{}
	for _, r := range rows {
		if r.State == store.CAActive {
			active[r.Role] = true
		}
	}
	imp, ok := in.custody.(custody.Importer)
	for _, role := range caRoles {
		file := in.s.ca.Issuers[role]
		if active[string(role)] || file == nil {
			continue
		}
		if file.Key == nil {
			return fmt.Errorf("authority: the store has no active %s intermediate and the data directory has no key for it (an authority initialised with --custody keeps them in the store)", role)
		}
		if !ok {
			return fmt.Errorf("authority: the store has no active %s intermediate and the key custody cannot import the data directory's", role)
		}
		serial := file.Cert.SerialNumber.Text(16)
		k, err := imp.Import(ctx, keyName(string(role), serial), file.Key)
		if err != nil {
			return fmt.Errorf("authority: sealing the %s intermediate's key: %w", role, err)
		}
		// Stored with its record, or not at all.
		link := newLink(in.s.audit, audit.Event{Actor: "authority", Action: "ca.import", Target: string(role) + "/" + serial,
			Result: audit.ResultOK, Reason: "the data directory's intermediate, now shared by every replica through the store"})
		err = in.s.store.InsertCACert(ctx, store.CACert{Role: string(role), Serial: serial, CertDER: file.Cert.Raw,
			KeyRef: k.Ref, State: store.CAActive, NotAfter: file.Cert.NotAfter}, link.Build)
		switch {
		case errors.Is(err, store.ErrConflict):
			continue // another replica imported one first
		case err != nil:
			return fmt.Errorf("authority: storing the %s intermediate: %w", role, err)
		}
		in.s.audit.Appended(link)
		in.s.log.Info("moved a CA intermediate from the data directory into the store", "role", role, "serial", serial)
	}
	return nil
}

// load reads every CA certificate and sets the hierarchy's intermediates:
// the active one of each role with its key, and every one still in the
// bundle. A certificate that does not chain to the root, or a key that
// does not open, fails the whole read and the set in use stays; except a
// retiring intermediate's key gone from the token, which it no longer
// needs to sign leaves (it stays in the bundle, keyless, and its
// revocation list is no longer renewed).
func (in *intermediates) load(ctx context.Context) error {
	// Loads run at once (the watch's, an operator's step, a root
	// phase change), so each reads under the lock: a read that began
	// before another load's must not be installed after it, taking the
	// replica back to an intermediate already replaced (which the CA
	// clock may retire meanwhile: its leaves, signed after it stopped
	// being active, would be refused).
	in.mu.Lock()
	defer in.mu.Unlock()
	rot, err := in.s.store.GetRootRotation(ctx)
	if err != nil {
		return fmt.Errorf("reading the root rotation: %w", err)
	}
	rows, err := in.s.store.ListCACerts(ctx)
	if err != nil {
		return err
	}
	next := &ca.Intermediates{Active: map[ca.Role]*ca.Issuer{}, Bundle: map[ca.Role][]*x509.Certificate{},
		Retiring: map[ca.Role][]*ca.Issuer{}, Prepared: map[ca.Role][]*ca.Issuer{}, DistrustedRetiring: map[ca.Role][]*ca.Issuer{}}
	pending := map[ca.Role][]*x509.Certificate{}
	// The root rotation's version is part of what was loaded: a phase
	// change alters the trusted roots, the signing root and the bundle
	// with no intermediate changing.
	var names strings.Builder
	fmt.Fprintf(&names, "roots/%d/%s;", rot.Version, rot.Phase)
	for _, r := range rows {
		fmt.Fprintf(&names, "%s/%s/%s;", r.Role, r.Serial, r.State)
	}
	if names.String() == in.loaded && in.failing.Load() == nil {
		return nil // nothing changed since the last read
	}
	// The roots' keys are opened only when something changed: with
	// pkcs11 custody each open is a round trip to the token.
	roots, err := in.openRoots(ctx, rot)
	if err != nil {
		return fmt.Errorf("reading the root rotation: %w", err)
	}
	set := roots.set()
	keep := map[string]crypto.Signer{}
	var active []activeKey
	for _, r := range rows {
		if r.State == store.CARetired {
			continue
		}
		cert, err := x509.ParseCertificate(r.CertDER)
		if err != nil {
			return fmt.Errorf("%s intermediate %s: %w", r.Role, r.Serial, err)
		}
		if !signedByOneOf(cert, set.Trusted) {
			if r.State != store.CAActive {
				// Under a root no longer trusted (the old one, once a
				// root rotation is in standby): its leaves no longer
				// verify here, and it signs no leaf.
				next.Distrusted = append(next.Distrusted, cert)
				if roots.row.Phase == store.RootPhaseStandby && roots.old != nil && cert.CheckSignatureFrom(roots.old) == nil {
					next.Restorable = append(next.Restorable, cert)
				}
				if r.State == store.CARetiring {
					// A relying party that still trusts the old root
					// may hold one of its leaves until it expires: it
					// keeps its key and signs its revocation list until
					// the clock retires it, as ca status says (before,
					// its list was a 404 from standby on).
					key, err := in.openKey(ctx, r, cert)
					if err != nil {
						return err
					}
					if key != nil {
						keep[r.Serial] = key
					}
					role := ca.Role(r.Role)
					next.DistrustedRetiring[role] = append(next.DistrustedRetiring[role], &ca.Issuer{Cert: cert, Key: key})
				}
				continue
			}
			return fmt.Errorf("%s intermediate %s is not signed by a root this authority trusts", r.Role, r.Serial)
		}
		role := ca.Role(r.Role)
		if r.State != store.CAActive {
			pending[role] = append(pending[role], cert)
		}
		key, err := in.openKey(ctx, r, cert)
		if err != nil {
			return err
		}
		if key != nil {
			keep[r.Serial] = key
		}
		issuer := &ca.Issuer{Cert: cert, Key: key}
		if in.s.cfg.CRLURL != "" {
			// Every leaf names its issuer's list (DESIGN.md "Revocation
			// for relying parties"), whichever intermediate is active.
			issuer.CRLDistributionPoints = []string{crl.DistributionPoint(in.s.cfg.CRLURL, crl.Issuer{Role: r.Role, Cert: cert})}
		}
		switch r.State {
		case store.CARetiring:
			next.Retiring[role] = append(next.Retiring[role], issuer)
			continue
		case store.CAPrepared:
			// Its key is opened now, not at activation: it signs its
			// revocation list from the start, and a key that does not
			// open shows here (readiness), before it is due to sign.
			next.Prepared[role] = append(next.Prepared[role], issuer)
			continue
		}
		next.Active[role] = issuer
		next.Bundle[role] = append([]*x509.Certificate{cert}, next.Bundle[role]...)
		if custody.IsPKCS11Ref(r.KeyRef) {
			active = append(active, activeKey{role: r.Role, serial: r.Serial, key: custody.Key{Public: cert.PublicKey, Ref: r.KeyRef}})
		}
	}
	for role, certs := range pending {
		next.Bundle[role] = append(next.Bundle[role], certs...)
	}
	in.signers = keep
	in.loaded = names.String()
	in.active.Store(&active)
	in.s.ca.SetRoots(set)
	in.s.ca.SetIntermediates(next)
	in.s.setTrustBundle(in.s.buildTrustBundle(rows))
	if in.s.crl != nil {
		// A new prepared, active or retiring intermediate has no list
		// yet, and a retired one's is no longer signed.
		in.s.crl.Poke()
	}
	return nil
}

// openKey returns the key of intermediate r, the one already open if
// any. A retiring one's key missing from the token is nil, not an error.
func (in *intermediates) openKey(ctx context.Context, r store.CACert, cert *x509.Certificate) (crypto.Signer, error) {
	if key := in.signers[r.Serial]; key != nil {
		return key, nil
	}
	key, err := in.custody.Signer(ctx, keyName(r.Role, r.Serial), custody.Key{Public: cert.PublicKey, Ref: r.KeyRef})
	switch {
	case err != nil && r.State == store.CARetiring && errors.Is(err, custody.ErrKeyMissing):
		// A retiring intermediate signs no new leaf: it only
		// stays in the bundle until its last leaf expires, so a
		// lost key does not stop the replica. It can no longer
		// sign its revocation list: the last one signed is
		// served until its nextUpdate, and after that relying
		// parties that check lists refuse its leaves (fail
		// closed) rather than trust a list nobody can renew.
		in.s.log.Warn("a retiring CA intermediate's key is missing from the token: it stays in the trust bundle until it retires, signs nothing, and its revocation list is no longer renewed (docs/hsm.md \"A lost token\")",
			"role", r.Role, "serial", r.Serial, "key", custody.Where(r.KeyRef), "err", err)
		return nil, nil
	case err != nil && errors.Is(err, custody.ErrKeyMissing):
		return nil, fmt.Errorf("%s intermediate %s (%s): %w; %s", r.Role, r.Serial, r.State, err, in.lostKeyWayOut(r.Role, r.State))
	case err != nil && errors.Is(err, custody.ErrUnavailable):
		// Nothing is wrong with the key: the token is to be put back,
		// and the read is tried again on its own.
		return nil, fmt.Errorf("%s intermediate %s: %w; bring the token back (the HSM reconnected, its module's token directory restored): "+
			"the authority re-opens it by itself and reads the intermediates again, with no restart (docs/hsm.md \"Sessions, a lost token, /readyz\")", r.Role, r.Serial, err)
	case err != nil:
		return nil, fmt.Errorf("%s intermediate %s: %w", r.Role, r.Serial, err)
	}
	return key, nil
}

// lostKeyWayOut names what replaces an intermediate of role in state
// whose key is gone from the token: a new one made offline under the
// root (which needs the root key: docs/hsm.md "A lost token").
func (in *intermediates) lostKeyWayOut(role, state string) string {
	// A key in a token is replaced by the pkcs11 build: the static
	// muster, which the command would run pasted on a packaged install,
	// refuses to open the token.
	cmd := fmt.Sprintf("muster-pkcs11 ca rotate %s --offline --data %s%s", role, shellword.Quote(string(in.s.cfg.Dir)), in.s.cfg.Dir.ConfigArg(in.s.cfg.ConfigFile))
	if state == store.CAPrepared {
		return "it signs nothing yet: discard it and make a new one with " + cmd + " (docs/hsm.md \"A lost token\")"
	}
	return "replace it with a new intermediate under the root, run on the machine with the data directory, the authority stopped or running: " + cmd +
		" (with the root key offline add --root-key FILE; if the root key was in the lost token too, a new authority is needed: docs/hsm.md \"A lost token\")"
}

// changed asks run to read the intermediates again. It never blocks. A
// server built without one (a test's) has nothing to read.
func (in *intermediates) changed() {
	if in == nil {
		return
	}
	select {
	case in.wake <- struct{}{}:
	default: // a read is pending already
	}
}

// run reads the intermediates again on every announced CA step until ctx
// ends, and every caRefresh in case a notification was lost without the
// watch noticing (a read that finds the same rows changes nothing). The
// watch announces every kind of change once it (re)listens, so a step
// missed while it was not listening is read then. A read that
// fails is tried again every caRefresh; the failure is logged once, not
// per attempt, and the replica is not ready (readyErr) until a read
// succeeds.
func (in *intermediates) run(ctx context.Context) {
	refresh := time.NewTicker(caRefresh)
	defer refresh.Stop()
	probe := time.NewTicker(keyProbe)
	defer probe.Stop()
	in.probeKeys(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-probe.C:
			in.probeKeys(ctx)
			continue
		case <-in.wake:
		case <-refresh.C:
		}
		lctx, cancel := context.WithTimeout(ctx, caLoadTimeout)
		err := in.load(lctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		// A load that found nothing changed keeps the bundle it has: one
		// whose certificate has expired since is replaced now, and open
		// streams told, even if no answer asked for it.
		in.s.trustBundle()
		if in.s.outage.fail(err) {
			// The store is down: logged once for the whole outage, and
			// /readyz says so already; the set in use stays.
			continue
		}
		var was error
		if p := in.failing.Load(); p != nil {
			was = *p
		}
		if err != nil {
			in.failing.Store(&err)
		} else {
			in.failing.Store(nil)
			if in.keysFailing.Load() != nil {
				// A new active intermediate (muster ca rotate --offline)
				// makes the replica ready without waiting for the probe.
				in.probeKeys(ctx)
			}
		}
		switch {
		case err != nil && was == nil:
			in.s.log.Error("reading the CA intermediates from the store failed; signing with the ones read before and reporting not ready (/readyz) until a read succeeds; tried again every few seconds",
				"err", err, "retry", caRefresh)
		case err == nil && was != nil:
			in.s.log.Info("read the CA intermediates from the store again; ready")
		}
	}
}

// probeKeys looks in the token for each active intermediate's key object
// (custody's Signer: a lookup, no signature) and records what it found for
// readyErr, the log (once per change) and muster_ca_key_available. Only
// an answer about the key counts (custody.ErrKey: its object missing, or
// not the key the store names); a token that is down is the token's
// readiness to report (Token.Ready), and such a probe changes nothing.
func (in *intermediates) probeKeys(ctx context.Context) {
	keys := in.active.Load()
	if keys == nil {
		return
	}
	var failing []error
	for _, k := range *keys {
		pctx, cancel := context.WithTimeout(ctx, caLoadTimeout)
		_, err := in.custody.Signer(pctx, keyName(k.role, k.serial), k.key)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil && !errors.Is(err, custody.ErrKey) {
			// The token down (its own readiness says so), or too busy
			// to answer within the timeout: not a finding about the
			// key, so the last one stands.
			return
		}
		id := k.role + "/" + k.serial
		if err != nil {
			failing = append(failing, fmt.Errorf("the active %s intermediate %s's key (%s) cannot sign: %w; %s", k.role, k.serial, custody.Where(k.key.Ref), err, in.lostKeyWayOut(k.role, store.CAActive)))
			in.keyOK.Store(id, 0.0)
		} else {
			in.keyOK.Store(id, 1.0)
		}
	}
	in.keyOK.Range(func(id, _ any) bool {
		for _, k := range *keys {
			if id == k.role+"/"+k.serial {
				return true
			}
		}
		in.keyOK.Delete(id)
		return true
	})
	var was error
	if p := in.keysFailing.Load(); p != nil {
		was = *p
	}
	err := errors.Join(failing...)
	switch {
	case err != nil:
		in.keysFailing.Store(&err)
		if was == nil || was.Error() != err.Error() {
			in.s.log.Error("an active CA intermediate's key is not in the token: this replica cannot sign its certificates and reports not ready (/readyz)", "err", err)
		}
	case was != nil:
		in.keysFailing.Store(nil)
		in.s.log.Info("the active CA intermediates' keys are in the token again; ready")
	}
}

// readFailing reports whether the last read of the store's
// intermediates failed.
func (in *intermediates) readFailing() bool {
	return in != nil && in.failing.Load() != nil
}

// readyErr says why the replica should take no traffic as far as its
// intermediates go: nil while the last read of them succeeded and the
// last probe found every active key in the token.
func (in *intermediates) readyErr() error {
	if in == nil {
		return nil
	}
	if p := in.failing.Load(); p != nil {
		return fmt.Errorf("the CA intermediates in the store cannot be read, so this replica may sign with ones the others retired or lack ones they sign with: %w", *p)
	}
	if p := in.keysFailing.Load(); p != nil {
		return *p
	}
	return nil
}

// prepareUnder makes role's successor: a key in custody and a
// certificate signed by root (the signing root: the data directory's, or
// a root rotation's new one), whose key is rootKey, valid for ttl, stored
// prepared (one per role: of replicas preparing at once, one wins and the
// others get store.ErrConflict, and the loser's key is destroyed), with
// the record link makes for its serial (ca.prepare) in the same write.
func (in *intermediates) prepareUnder(ctx context.Context, role ca.Role, root *x509.Certificate, rootKey crypto.Signer, ttl time.Duration, link func(row store.CACert) *audit.Link) (store.CACert, error) {
	return prepareIntermediate(ctx, in.s.store, in.custody, in.s.ca, role, root, rootKey, ttl, link)
}

// prepareIntermediate is prepareUnder for any holder of the store and a
// custody: the authority's leader and operator, and muster ca
// migrate-custody, which prepares successors in a token offline.
// The caller notes link's record appended once it returns with no error.
func prepareIntermediate(ctx context.Context, st store.Store, c custody.Custody, h *ca.Hierarchy, role ca.Role, root *x509.Certificate, rootKey crypto.Signer, ttl time.Duration, link func(row store.CACert) *audit.Link) (store.CACert, error) {
	serial, err := ca.NewSerial()
	if err != nil {
		return store.CACert{}, err
	}
	hexSerial := serial.Text(16)
	k, err := c.Create(ctx, keyName(string(role), hexSerial), custody.ECDSAP256)
	if err != nil {
		return store.CACert{}, err
	}
	now, err := st.Now(ctx)
	if err == nil {
		var cert *x509.Certificate
		if cert, err = h.NewIntermediateUnder(role, serial, k.Public, root, rootKey, now, ttl); err == nil {
			row := store.CACert{Role: string(role), Serial: hexSerial, CertDER: cert.Raw, KeyRef: k.Ref, State: store.CAPrepared, NotAfter: cert.NotAfter}
			if err = st.InsertCACert(ctx, row, link(row).Build); err == nil {
				row.CreatedAt = now
				return row, nil
			}
			if !errors.Is(err, store.ErrConflict) {
				// Not a refusal: the commit may have landed (a connection
				// lost while PostgreSQL committed). The store says.
				stored, rerr := storedCACert(ctx, st, hexSerial)
				switch {
				case rerr != nil:
					// Unknown: the row may refer to the key, so it stays
					// (a sealed key is its reference and costs nothing).
					kept := fmt.Errorf("%w; the %s intermediate %s may be stored (reading it back failed: %v), so its key (%s) is kept: `muster ca status` shows whether it is",
						err, role, hexSerial, rerr, custody.Where(k.Ref))
					if custody.IsPKCS11Ref(k.Ref) {
						kept = fmt.Errorf("%w; if it does not list %s, nothing names the key: %s", kept, hexSerial, custody.DeleteByHand(custody.ModuleOf(c), k.Ref))
					}
					return store.CACert{}, kept
				case stored != nil:
					return *stored, nil
				}
			}
		}
	}
	// A key in a token would outlive the refusal, with no row to name it:
	// it is destroyed, or, when the token does not let it be, named with
	// the commands that delete it.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), caStepTimeout)
	defer cancel()
	if derr := c.Destroy(dctx, keyName(string(role), hexSerial), k); derr != nil && custody.IsPKCS11Ref(k.Ref) {
		return store.CACert{}, fmt.Errorf("%w; nothing names the %s intermediate %s's new key (%s), and destroying it failed (%v): %s",
			err, role, hexSerial, custody.Where(k.Ref), derr, custody.DeleteByHand(custody.ModuleOf(c), k.Ref))
	}
	return store.CACert{}, err
}

// storedCACert reads back the CA certificate serial after a write whose
// error does not say whether it committed; nil when it is not stored.
func storedCACert(ctx context.Context, st store.Store, serial string) (*store.CACert, error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), caStepTimeout)
	defer cancel()
	rows, err := st.ListCACerts(rctx)
	if err != nil {
		return nil, err
	}
	for i := range rows {
		if rows[i].Serial == serial {
			return &rows[i], nil
		}
	}
	return nil, nil
}

// signedByOneOf reports whether one of roots signed c.
func signedByOneOf(c *x509.Certificate, roots []*x509.Certificate) bool {
	for _, r := range roots {
		if c.CheckSignatureFrom(r) == nil {
			return true
		}
	}
	return false
}

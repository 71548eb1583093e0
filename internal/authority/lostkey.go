package authority

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/store"
)

// LostKeyRotation is what RotateLostIntermediate needs: what muster ca
// rotate ROLE --offline opens from the data directory.
type LostKeyRotation struct {
	Store      store.Store
	CA         *ca.Hierarchy // the data directory's root (and its key, if there)
	StorageKey seal.StorageKey
	// Token is the authority's PKCS#11 token, nil without one; the new
	// intermediate's key is made there when there is one.
	Token *custody.Token
	// RootKey is the root key from --root-key FILE (kept offline), nil
	// to use the data directory's or the root rotation's stored one.
	RootKey crypto.Signer
	Audit   CAAuditor
	Actor   string
	Role    ca.Role
	// IntermediateTTL is the new intermediate's lifetime
	// (ca.intermediate_ttl).
	IntermediateTTL time.Duration
	// Now is the clock an intermediate's expiry is read against (nil:
	// time.Now, as the authority's listener certificate is issued).
	Now func() time.Time
}

// LostKeyRotationResult is what RotateLostIntermediate did: the
// intermediate that signs from now on, and the one it replaced (retiring,
// keyless).
type LostKeyRotationResult struct {
	Active   store.CACert
	Previous store.CACert
	// Reused: a prepared successor whose key opens was activated rather
	// than a new one made.
	Reused bool
	// PreparedOnly: the active key opens and only the prepared
	// successor's was lost: Active is its replacement, prepared, and
	// Previous stays active.
	PreparedOnly bool
	// Expired: Previous was replaced because its certificate had
	// expired (its key opens), not because its key was lost.
	Expired bool
}

// RotateLostIntermediate replaces role's active intermediate whose key is
// gone from the token (docs/hsm.md "A lost token"), or whose certificate
// has expired (the authority was stopped, or its store restored from a
// backup, for longer than the intermediate had left: docs/ca-lifecycle.md
// "An expired intermediate"): either way it signs nothing, and a rotation
// through the running authority cannot help (a replica does not start
// without a server intermediate that signs, and the leader's clock, which
// would replace it, runs only in a started replica). The prepared successor is activated at
// once if its key opens; otherwise a new intermediate is made under the
// signing root (its key in the token, or sealed without one) and activated
// at once, so the authority signs again as soon as it starts or reads the
// store. Skipping the publish window costs nothing an agent needs: an
// agent takes any intermediate that chains to a root it trusts, with its
// next certificate. The old one becomes retiring, keyless, and stays in
// the bundle until its leaves expire. A prepared successor whose key is
// lost while the active one's opens is replaced by a new prepared one.
// Refused while every key opens and the active intermediate is unexpired
// (muster ca rotate ROLE does it online), and when the root key is not
// here. A prepared successor that has expired is discarded, not reused. Each write is the store's conditional write; each step audited.
func RotateLostIntermediate(ctx context.Context, m LostKeyRotation) (LostKeyRotationResult, error) {
	var res LostKeyRotationResult
	target := string(m.Role)
	refuse := func(err error) (LostKeyRotationResult, error) {
		_, _ = m.Audit.Record(context.WithoutCancel(ctx), audit.Event{Actor: m.Actor, Action: "ca.prepare", Target: target,
			Result: audit.ResultDenied, Reason: "offline rotation: " + err.Error()})
		return res, err
	}
	c, err := CACustody(m.StorageKey, m.Token)
	if err != nil {
		return res, err
	}
	rows, err := m.Store.ListCACerts(ctx)
	if err != nil {
		return res, err
	}
	var active, prepared *store.CACert
	for i, r := range rows {
		if r.Role != string(m.Role) {
			continue
		}
		switch r.State {
		case store.CAActive:
			active = &rows[i]
		case store.CAPrepared:
			prepared = &rows[i]
		}
	}
	if active == nil {
		return refuse(fmt.Errorf("the store has no active %s intermediate: start the authority once (it moves the data directory's into the store)", m.Role))
	}
	target += "/" + active.Serial
	open := func(r store.CACert) error {
		cert, err := x509.ParseCertificate(r.CertDER)
		if err != nil {
			return err
		}
		_, err = c.Signer(ctx, keyName(r.Role, r.Serial), custody.Key{Public: cert.PublicKey, Ref: r.KeyRef})
		return err
	}
	now := time.Now
	if m.Now != nil {
		now = m.Now
	}
	// An intermediate past its not-after issues nothing (ca.Issuer.Sign),
	// whatever its key: it is replaced as a lost key is.
	expired := func(r store.CACert) bool { return !r.NotAfter.After(now()) }
	activeErr := open(*active)
	if activeErr != nil && !errors.Is(activeErr, custody.ErrKeyMissing) && !expired(*active) {
		return refuse(fmt.Errorf("opening the active %s intermediate %s's key (%s): %w; only a key the token answers is missing is replaced here", m.Role, active.Serial, custody.Where(active.KeyRef), activeErr))
	}
	// gone says why the active intermediate is replaced, for the audit.
	gone := fmt.Sprintf("whose key (%s) is gone from the token", custody.Where(active.KeyRef))
	if expired(*active) {
		res.Expired = true
		gone = "which expired at " + active.NotAfter.UTC().Format(time.RFC3339)
	}
	var preparedErr error
	if prepared != nil {
		preparedErr = open(*prepared)
		if preparedErr == nil && expired(*prepared) {
			preparedErr = errPreparedExpired
		}
	}
	if activeErr == nil && !res.Expired && (prepared == nil || preparedErr == nil) {
		return refuse(fmt.Errorf("the active %s intermediate %s's key (%s) opens: it is not lost; rotate it with the authority running: muster ca rotate %s, then muster ca rotate %s --activate",
			m.Role, active.Serial, custody.Where(active.KeyRef), m.Role, m.Role))
	}
	// Only the prepared successor's key is lost: it is replaced by a
	// new prepared one, which the leader activates at its time.
	res.PreparedOnly = activeErr == nil && !res.Expired
	res.Previous = *active
	if prepared != nil {
		switch err := preparedErr; {
		case err == nil:
			res.Active, res.Reused = *prepared, true
		case errors.Is(err, custody.ErrKeyMissing), errors.Is(err, errPreparedExpired):
			why := "its key (" + custody.Where(prepared.KeyRef) + ") is gone from the token"
			if errors.Is(err, errPreparedExpired) {
				why = "it expired at " + prepared.NotAfter.UTC().Format(time.RFC3339)
			}
			link := newLink(m.Audit, audit.Event{Actor: m.Actor, Action: "ca.discard", Target: string(m.Role) + "/" + prepared.Serial,
				Result: audit.ResultOK, Reason: "offline rotation: " + why})
			if _, err := m.Store.DiscardCACert(ctx, prepared.Role, prepared.Serial, link.Build); err != nil {
				return res, fmt.Errorf("discarding the prepared %s intermediate %s, whose key is gone too: %w", m.Role, prepared.Serial, err)
			}
			m.Audit.Appended(link)
		default:
			return refuse(fmt.Errorf("opening the prepared %s intermediate %s's key (%s): %w", m.Role, prepared.Serial, custody.Where(prepared.KeyRef), err))
		}
	}
	if !res.Reused {
		root, rootKey, err := lostKeyRoot(ctx, m, c)
		if err != nil {
			return refuse(err)
		}
		var link *audit.Link
		row, err := prepareIntermediate(ctx, m.Store, c, m.CA, m.Role, root, rootKey, m.IntermediateTTL, func(row store.CACert) *audit.Link {
			link = newLink(m.Audit, audit.Event{Actor: m.Actor, Action: "ca.prepare", Target: string(m.Role) + "/" + row.Serial,
				Result: audit.ResultOK, Reason: fmt.Sprintf("offline rotation: replaces %s, %s; key %s",
					active.Serial, gone, custody.Where(row.KeyRef))})
			return link
		})
		if err != nil {
			return res, fmt.Errorf("making a new %s intermediate: %w", m.Role, err)
		}
		m.Audit.Appended(link)
		res.Active = row
	}
	if res.PreparedOnly {
		return res, nil
	}
	link := newLink(m.Audit, audit.Event{Actor: m.Actor, Action: "ca.activate", Target: string(m.Role) + "/" + res.Active.Serial,
		Result: audit.ResultOK, Reason: fmt.Sprintf("offline rotation: at once, as %s, %s, signs nothing; it is retiring", active.Serial, gone)})
	if err := m.Store.ActivateCACert(ctx, string(m.Role), res.Active.Serial, link.Build); err != nil {
		return res, fmt.Errorf("activating the %s intermediate %s (run this again: it finds what is done): %w", m.Role, res.Active.Serial, err)
	}
	m.Audit.Appended(link)
	res.Active.State = store.CAActive
	res.Previous.State = store.CARetiring
	return res, nil
}

// errPreparedExpired marks a prepared successor past its not-after: it
// can never sign, so it is discarded as one whose key is lost.
var errPreparedExpired = errors.New("the prepared intermediate has expired")

// lostKeyRoot is the root a replacement intermediate is signed under and
// its key: the signing root of the store's root rotation (the data
// directory's root before any), with its key from --root-key, the data
// directory or custody. A root key lost with the token leaves nothing to
// sign an intermediate the agents would trust.
func lostKeyRoot(ctx context.Context, m LostKeyRotation, c custody.Custody) (*x509.Certificate, crypto.Signer, error) {
	rot, err := m.Store.GetRootRotation(ctx)
	if err != nil {
		return nil, nil, err
	}
	roots, err := openRootState(ctx, c, m.CA, rot)
	if errors.Is(err, custody.ErrKeyMissing) {
		return nil, nil, fmt.Errorf("the root key is gone from the token too (%w): no intermediate the agents trust can be made; the way out is a new authority (muster init, agents joining it again): docs/hsm.md \"A lost token\"", err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading the root rotation: %w", err)
	}
	set := roots.set()
	key := set.SigningKey
	if m.RootKey != nil {
		type equaler interface{ Equal(crypto.PublicKey) bool }
		if e, ok := m.RootKey.Public().(equaler); !ok || !e.Equal(set.Signing.PublicKey) {
			return nil, nil, fmt.Errorf("--root-key is not the key of the signing root (%s)", ca.Fingerprint(set.Signing))
		}
		key = m.RootKey
	}
	if key == nil {
		return nil, nil, fmt.Errorf("the signing root's key (%s) is not in the data directory nor in custody: add --root-key FILE, the root key kept offline", ca.Fingerprint(set.Signing))
	}
	return set.Signing, key, nil
}

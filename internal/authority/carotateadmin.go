package authority

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/crl"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// The operator's side of the CA clock (muster ca rotate ROLE [--activate]
// [--root-key FILE], docs/ca-lifecycle.md).
//
// With the root key offline, preparing takes two calls: DraftCAIntermediate
// makes the successor's key in custody and says what its certificate
// holds; the CLI signs that with the root key from a file and sends the
// certificate back in PrepareCAIntermediate. The authority makes the key
// because it must end sealed under the storage key, which the machine
// holding the root key need not have, and so the private key never leaves
// the authority in clear; the root key never leaves the operator's
// machine. The draft's key reference travels to the CLI and back sealed
// under muster-ca-encryption and bound to ROLE/SERIAL, so it opens only on
// an authority of this storage key and only for that serial (either
// replica can take the second call). Every draft, whatever the custody, is
// also recorded (store.CADraft) until the second call claims it: a sealed
// key costs nothing left behind, but a token's key is an object that would
// outlive an abandoned draft, and one rule for both keeps the sweep simple.
// The leader destroys the key of a draft not claimed within ca.draft_ttl
// (caDraftTTL), and a certificate sent back after it is refused.

// caRole parses a rotated intermediate role.
func caRole(s string) (ca.Role, error) {
	if r := ca.Role(s); slices.Contains(caRoles, r) {
		return r, nil
	}
	return "", badRequest(fmt.Sprintf("no intermediate role %q: one of bootstrap, server, agent, admin", s))
}

// preparedOf returns role's prepared and active rows among rows.
func preparedOf(rows []store.CACert, role ca.Role) (prepared, active *store.CACert) {
	for i := range rows {
		if rows[i].Role != string(role) {
			continue
		}
		switch rows[i].State {
		case store.CAPrepared:
			prepared = &rows[i]
		case store.CAActive:
			active = &rows[i]
		}
	}
	return prepared, active
}

// noPreparedToActivate refuses an activation with nothing prepared. The
// second of two operators activating at once (or one just after the
// leader's clock) meets it: it says which intermediate is active, and
// since when, so that they do not prepare a second rotation believing
// the activation failed, as the bare "prepare one first" had them do.
func noPreparedToActivate(role ca.Role, asked string, active *store.CACert) error {
	if active != nil && asked != "" && asked == active.Serial {
		return status.Errorf(codes.FailedPrecondition, "the %s intermediate %s is already active, since %s (another operator or the leader's clock activated it): nothing to do; `muster ca status` shows it",
			role, active.Serial, active.ActivatedAt.UTC().Format(time.RFC3339))
	}
	var now string
	if active != nil {
		now = fmt.Sprintf(" (the active one is %s, since %s; `muster ca status` shows every CA certificate): if that is the one you meant to activate, it is done; to rotate again,",
			active.Serial, active.ActivatedAt.UTC().Format(time.RFC3339))
	} else {
		now = ":"
	}
	return status.Errorf(codes.FailedPrecondition, "the %s intermediate has no prepared successor to activate%s prepare one first with `muster ca rotate %s` (or `muster ca rotate %s --root-key FILE` with the root key offline)",
		role, now, role, role)
}

// serialText spells a serial as the store keeps it (big.Int.Text(16):
// lower case, no leading zeros), from any spelling an operator may paste:
// upper case, colon-separated bytes (openssl x509 -serial, ca status), a
// leading 0x. "" stays "" (no serial named).
func serialText(s string) (string, error) {
	if s == "" {
		return "", nil
	}
	h := strings.TrimPrefix(strings.TrimPrefix(strings.ReplaceAll(strings.TrimSpace(s), ":", ""), "0x"), "0X")
	n, ok := new(big.Int).SetString(h, 16)
	if !ok || h == "" || n.Sign() < 0 || strings.ContainsAny(h, "+-_") {
		return "", badRequest(fmt.Sprintf("--serial %q is not a hexadecimal serial (such as 4f1c2a9e or 4F:1C:2A:9E); muster ca status shows the prepared one", s))
	}
	return n.Text(16), nil
}

func alreadyPrepared(role ca.Role, p *store.CACert) error {
	return status.Errorf(codes.FailedPrecondition, "the %s intermediate already has a prepared successor (serial %s, prepared %s): activate it with `muster ca rotate %s --activate`, or let the leader activate it at two thirds of the active one's life",
		role, p.Serial, p.CreatedAt.UTC().Format(time.RFC3339), role)
}

func (a *adminService) DraftCAIntermediate(ctx context.Context, req *musterv1.DraftCAIntermediateRequest) (*musterv1.DraftCAIntermediateResponse, error) {
	resp, err := a.draftCAIntermediate(ctx, req)
	err = toStatus(ctx, a.s.log, err)
	if err != nil {
		// A draft changes nothing; only its refusal is recorded.
		a.record(ctx, "ca.prepare", req.GetRole(), err)
	}
	return resp, err
}

func (a *adminService) draftCAIntermediate(ctx context.Context, req *musterv1.DraftCAIntermediateRequest) (*musterv1.DraftCAIntermediateResponse, error) {
	role, err := caRole(req.GetRole())
	if err != nil {
		return nil, err
	}
	rows, err := a.s.store.ListCACerts(ctx)
	if err != nil {
		return nil, err
	}
	if p, _ := preparedOf(rows, role); p != nil {
		return nil, alreadyPrepared(role, p)
	}
	serial, err := ca.NewSerial()
	if err != nil {
		return nil, err
	}
	name := keyName(string(role), serial.Text(16))
	k, err := a.s.inter.custody.Create(ctx, name, custody.ECDSAP256)
	if err != nil {
		return nil, err
	}
	d, pub, err := func() (ca.Draft, []byte, error) {
		now, err := a.s.store.Now(ctx)
		if err != nil {
			return ca.Draft{}, nil, err
		}
		d, err := a.s.ca.Draft(role, serial, k.Public, a.s.ca.Roots().Signing, now, a.s.caIntermediateTTL())
		if err != nil {
			return ca.Draft{}, nil, err
		}
		pub, err := x509.MarshalPKIXPublicKey(k.Public)
		return d, pub, err
	}()
	if err == nil {
		// Recorded until the signed certificate comes back, so the
		// leader destroys the key of a draft never sent back.
		err = recordDraft(ctx, a.s.store, store.CADraft{Serial: serial.Text(16), Role: string(role), KeyRef: k.Ref})
	}
	if err != nil {
		_ = a.s.inter.custody.Destroy(ctx, name, k) // a token's key would outlive the refusal
		return nil, err
	}
	return &musterv1.DraftCAIntermediateResponse{Role: string(role), Serial: serial.Text(16), PublicKeyDer: pub, KeyRef: k.Ref,
		RawSubject: d.RawSubject, NotBefore: timestamppb.New(d.NotBefore), NotAfter: timestamppb.New(d.NotAfter), RootDer: a.s.ca.Roots().Signing.Raw}, nil
}

// recordDraft records d (InsertCADraft). A write whose answer was lost
// (the connection went as the database committed) may have landed: the
// drafts are read back, and a draft the store holds under d's serial with
// d's key is the write done, so its key is kept and the draft answered,
// not destroyed under a recorded draft (whose prepare would then fail)
// and reported as failed. Only a draft the store does not hold is the
// write's failure.
func recordDraft(ctx context.Context, st store.Store, d store.CADraft) error {
	err := st.InsertCADraft(ctx, d)
	if err == nil || errors.Is(err, store.ErrConflict) {
		return err
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), caStepTimeout)
	defer cancel()
	drafts, rerr := st.ListCADrafts(rctx)
	if rerr != nil {
		return err
	}
	for _, got := range drafts {
		if got.Serial == d.Serial && got.Role == d.Role && bytes.Equal(got.KeyRef, d.KeyRef) {
			return nil
		}
	}
	return err
}

func (a *adminService) PrepareCAIntermediate(ctx context.Context, req *musterv1.PrepareCAIntermediateRequest) (*musterv1.CAIntermediateResponse, error) {
	resp, err := a.prepareCAIntermediate(ctx, req)
	err = toStatus(ctx, a.s.log, err)
	target := req.GetRole()
	if resp != nil {
		target += "/" + resp.GetIntermediate().GetSerial()
	} else if req.GetSerial() != "" {
		target += "/" + req.GetSerial()
	}
	if err != nil {
		// A success is recorded with the intermediate's write.
		a.record(ctx, "ca.prepare", target, err)
	} else {
		a.s.log.Info("CA intermediate prepared by an operator", "role", req.GetRole(), "serial", resp.GetIntermediate().GetSerial(),
			"offline_root", len(req.GetCertificateDer()) > 0, "operator", callerFrom(ctx).Actor())
	}
	return resp, err
}

// prepareWhy is the reason a ca.prepare record of an operator's gives.
func prepareWhy(offline bool) string {
	if offline {
		return "prepared by an operator ahead of the leader's clock, signed offline with the root key (muster ca rotate ROLE --root-key FILE)"
	}
	return "prepared by an operator ahead of the leader's clock, signed with the authority's root key"
}

func (a *adminService) prepareCAIntermediate(ctx context.Context, req *musterv1.PrepareCAIntermediateRequest) (*musterv1.CAIntermediateResponse, error) {
	role, err := caRole(req.GetRole())
	if err != nil {
		return nil, err
	}
	rows, err := a.s.store.ListCACerts(ctx)
	if err != nil {
		return nil, err
	}
	if p, _ := preparedOf(rows, role); p != nil {
		return nil, alreadyPrepared(role, p)
	}
	var (
		row  store.CACert
		link *audit.Link
	)
	if len(req.GetCertificateDer()) == 0 {
		rs := a.s.ca.Roots()
		if rs.SigningKey == nil {
			return nil, status.Errorf(codes.FailedPrecondition, "the root key is not in this authority's data directory: prepare the successor with `muster ca rotate %s --root-key FILE` on a machine that holds the root key", role)
		}
		row, err = a.s.inter.prepareUnder(ctx, role, rs.Signing, rs.SigningKey, a.s.caIntermediateTTL(), func(row store.CACert) *audit.Link {
			link = a.s.callerLink(ctx, "ca.prepare", string(role)+"/"+row.Serial, prepareWhy(false))
			return link
		})
	} else {
		link = a.s.callerLink(ctx, "ca.prepare", string(role)+"/"+req.GetSerial(), prepareWhy(true))
		row, err = a.prepareSigned(ctx, role, req, link)
	}
	if errors.Is(err, store.ErrConflict) {
		if rows, lerr := a.s.store.ListCACerts(ctx); lerr == nil {
			if p, _ := preparedOf(rows, role); p != nil {
				return nil, alreadyPrepared(role, p)
			}
		}
		return nil, status.Errorf(codes.Aborted, "another %s intermediate was prepared or activated meanwhile; run `muster ca rotate %s` again if one is still needed", role, role)
	}
	if err != nil {
		return nil, err
	}
	a.s.audit.Appended(link)
	a.s.inter.changed()
	return &musterv1.CAIntermediateResponse{Intermediate: caIntermediateToProto(row)}, nil
}

// prepareSigned stores a successor signed offline from a draft: the key
// reference must open (under this role and serial) to the certificate's
// key, and the certificate must be a successor of the role
// (ca.CheckSuccessor). The row is stored with link's record.
func (a *adminService) prepareSigned(ctx context.Context, role ca.Role, req *musterv1.PrepareCAIntermediateRequest, link *audit.Link) (store.CACert, error) {
	cert, err := x509.ParseCertificate(req.GetCertificateDer())
	if err != nil {
		return store.CACert{}, badRequest("the signed intermediate is not a DER certificate: " + err.Error())
	}
	serial, ok := new(big.Int).SetString(req.GetSerial(), 16)
	if !ok || serial.Sign() <= 0 || serial.Text(16) != req.GetSerial() {
		return store.CACert{}, badRequest("the draft's serial must be lower-case hex, as DraftCAIntermediate returned it")
	}
	name := keyName(string(role), req.GetSerial())
	k := custody.Key{Public: cert.PublicKey, Ref: req.GetKeyRef()}
	if _, err := a.s.inter.custody.Signer(ctx, name, k); err != nil {
		if errors.Is(err, custody.ErrKey) {
			return store.CACert{}, status.Errorf(codes.FailedPrecondition, "the certificate's key is not the one this authority drafted for the %s intermediate %s: sign the draft unchanged (run `muster ca rotate %s --root-key FILE` again)", role, req.GetSerial(), role)
		}
		return store.CACert{}, err
	}
	now, err := a.s.store.Now(ctx)
	if err != nil {
		return store.CACert{}, err
	}
	if err := a.s.ca.CheckSuccessor(role, serial, cert.PublicKey, cert, a.s.ca.Roots().Signing, now); err != nil {
		return store.CACert{}, status.Errorf(codes.FailedPrecondition, "%v; sign the draft unchanged with this authority's root key (`muster ca rotate %s --root-key FILE`)", err, role)
	}
	notDrafted := status.Errorf(codes.FailedPrecondition, "the %s intermediate %s was not drafted, or its draft was used or expired (a draft's key is destroyed ca.draft_ttl, %s, after it was made): run `muster ca rotate %s --root-key FILE` again", role, req.GetSerial(), a.s.caDraftTTL(), role)
	drafts, err := a.s.store.ListCADrafts(ctx)
	if err != nil {
		return store.CACert{}, err
	}
	var d *store.CADraft
	for i := range drafts {
		if drafts[i].Serial == req.GetSerial() && drafts[i].Role == string(role) && bytes.Equal(drafts[i].KeyRef, req.GetKeyRef()) {
			d = &drafts[i]
		}
	}
	if d == nil {
		return store.CACert{}, notDrafted
	}
	if ttl := a.s.caDraftTTL(); now.Sub(d.CreatedAt) >= ttl {
		// Expired, not yet swept: discarded here as the leader's sweep
		// would (one of them claims it).
		a.s.endDraft(ctx, string(role), req.GetSerial(), custody.Where(d.KeyRef))
		return store.CACert{}, status.Errorf(codes.FailedPrecondition, "the %s intermediate %s was drafted %s ago, past ca.draft_ttl (%s): its key is destroyed; run `muster ca rotate %s --root-key FILE` again", role, req.GetSerial(), now.Sub(d.CreatedAt).Round(time.Second), ttl, role)
	}
	// The key goes from the draft to the intermediate in one write with
	// its record: refused, the draft keeps it (the leader's sweep
	// destroys it after ca.draft_ttl); claimed first by the sweep, it is
	// not stored.
	row := store.CACert{Role: string(role), Serial: req.GetSerial(), CertDER: cert.Raw, KeyRef: d.KeyRef, State: store.CAPrepared, NotAfter: cert.NotAfter}
	err = a.s.store.PrepareFromCADraft(ctx, row, link.Build)
	if errors.Is(err, store.ErrNotFound) {
		return store.CACert{}, notDrafted
	}
	if err != nil && !errors.Is(err, store.ErrConflict) {
		// The commit may have landed (prepareIntermediate).
		if stored, rerr := storedCACert(ctx, a.s.store, row.Serial); rerr == nil && stored != nil {
			return *stored, nil
		}
	}
	if err != nil {
		return store.CACert{}, err
	}
	row.CreatedAt = now
	return row, nil
}

func (a *adminService) ActivateCAIntermediate(ctx context.Context, req *musterv1.ActivateCAIntermediateRequest) (*musterv1.CAIntermediateResponse, error) {
	resp, err := a.activateCAIntermediate(ctx, req)
	err = toStatus(ctx, a.s.log, err)
	target := req.GetRole()
	if resp != nil {
		target += "/" + resp.GetIntermediate().GetSerial()
	} else if req.GetSerial() != "" {
		target += "/" + req.GetSerial()
	}
	if err != nil {
		// A success is recorded with the activation's write.
		a.record(ctx, "ca.activate", target, err)
	} else {
		a.s.log.Info("CA intermediate activated by an operator", "role", req.GetRole(), "serial", resp.GetIntermediate().GetSerial(),
			"operator", callerFrom(ctx).Actor())
	}
	return resp, err
}

// retryAfter is deadline as a refusal names it to say when to run the
// command again: RFC 3339 in whole seconds, rounded up, so that acting at
// the named time is never refused again for the fraction cut off.
func retryAfter(deadline time.Time) string {
	return deadline.Add(time.Second - time.Nanosecond).Truncate(time.Second).UTC().Format(time.RFC3339)
}

// activateCAIntermediate makes role's prepared intermediate active, once
// it is published: it has been in the store for caPublishWindow (every
// ready replica has read it), this replica holds it, and its revocation
// list is stored (with --crl-url, its first leaf names a list that is
// served). The activation itself is one conditional write on the
// prepared serial, so of operators and the leader's clock activating at
// once exactly one succeeds.
func (a *adminService) activateCAIntermediate(ctx context.Context, req *musterv1.ActivateCAIntermediateRequest) (*musterv1.CAIntermediateResponse, error) {
	role, err := caRole(req.GetRole())
	if err != nil {
		return nil, err
	}
	rows, err := a.s.store.ListCACerts(ctx)
	if err != nil {
		return nil, err
	}
	asked, err := serialText(req.GetSerial())
	if err != nil {
		return nil, err
	}
	p, active := preparedOf(rows, role)
	switch {
	case p == nil:
		return nil, noPreparedToActivate(role, asked, active)
	case asked != "" && asked != p.Serial && !slices.ContainsFunc(rows, func(r store.CACert) bool { return r.Role == string(role) && r.Serial == asked }):
		return nil, status.Errorf(codes.FailedPrecondition, "--serial %s names no %s intermediate this authority has prepared (the prepared one is %s), so nothing was activated: run `muster ca status`, then `muster ca rotate %s --activate --serial %s` if that is the one meant",
			req.GetSerial(), role, p.Serial, role, p.Serial)
	case asked != "" && asked != p.Serial:
		// The one the operator saw was activated (or replaced) meanwhile:
		// activating this one would put into service a successor they have
		// not seen, perhaps before its agents hold it.
		return nil, status.Errorf(codes.Aborted, "the prepared %s intermediate is %s now, not %s (the leader's clock or another operator activated or replaced it meanwhile), so nothing was activated: run `muster ca status`, then `muster ca rotate %s --activate` again if it is still wanted",
			role, p.Serial, asked, role)
	}
	now, err := a.s.store.Now(ctx)
	if err != nil {
		return nil, err
	}
	if ready := p.CreatedAt.Add(a.s.caPublishWindow()); now.Before(ready) {
		return nil, status.Errorf(codes.FailedPrecondition, "the prepared %s intermediate %s is not published by every replica yet (prepared %s ago; each publishes it in its trust bundle and revocation list within %s): run `muster ca rotate %s --activate` again after %s",
			role, p.Serial, now.Sub(p.CreatedAt).Round(time.Second), a.s.caPublishWindow(), role, retryAfter(ready))
	}
	if !a.s.holdsPrepared(role, p.Serial) {
		return nil, status.Errorf(codes.FailedPrecondition, "this replica has not read the prepared %s intermediate %s from the store yet (see its /readyz and log): try again in a few seconds", role, p.Serial)
	}
	if err := a.s.preparedKeyGone(ctx, *p); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "the prepared %s intermediate %s cannot be activated: its key (%s) cannot sign: %v; activated, it would leave the %s role with no key that signs; %s",
			role, p.Serial, custody.Where(p.KeyRef), err, role, a.s.inter.lostKeyWayOut(string(role), store.CAPrepared))
	}
	if a.s.crl != nil {
		cert, err := x509.ParseCertificate(p.CertDER)
		if err != nil {
			return nil, err
		}
		name := crl.Issuer{Role: p.Role, Cert: cert}.Name()
		if _, err := a.s.store.GetCRL(ctx, name); errors.Is(err, store.ErrNotFound) {
			return nil, status.Errorf(codes.FailedPrecondition, "the revocation list of the prepared %s intermediate %s is not signed yet, so its leaves would name a list that is not served: try again in a few seconds", role, p.Serial)
		} else if err != nil {
			return nil, err
		}
	}
	link := a.s.callerLink(ctx, "ca.activate", string(role)+"/"+p.Serial, "activated by an operator ahead of the leader's clock")
	if err := a.s.store.ActivateCACert(ctx, string(role), p.Serial, link.Build); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, status.Errorf(codes.Aborted, "the prepared %s intermediate %s was activated or replaced meanwhile (the leader's clock or another operator; `muster audit list --action 'ca.*'`)", role, p.Serial)
		}
		return nil, err
	}
	a.s.audit.Appended(link)
	a.s.inter.changed()
	out := *p
	out.State, out.ActivatedAt = store.CAActive, now
	resp := &musterv1.CAIntermediateResponse{Intermediate: caIntermediateToProto(out)}
	if active != nil {
		prev := *active
		prev.State, prev.RetiringAt = store.CARetiring, now
		resp.Previous = caIntermediateToProto(prev)
	}
	return resp, nil
}

// holdsPrepared reports whether this replica has read serial as role's
// prepared intermediate.
func (s *Server) holdsPrepared(role ca.Role, serial string) bool {
	live := s.ca.CurrentIntermediates()
	if live == nil {
		return false
	}
	for _, i := range live.Prepared[role] {
		if i.Cert.SerialNumber.Text(16) == serial {
			return true
		}
	}
	return false
}

func caIntermediateToProto(r store.CACert) *musterv1.CAIntermediate {
	out := &musterv1.CAIntermediate{Role: r.Role, Serial: r.Serial, State: r.State, NotAfter: timestamppb.New(r.NotAfter)}
	if c, err := x509.ParseCertificate(r.CertDER); err == nil {
		out.NotBefore = timestamppb.New(c.NotBefore)
	}
	if !r.CreatedAt.IsZero() {
		out.CreatedAt = timestamppb.New(r.CreatedAt)
	}
	if !r.ActivatedAt.IsZero() {
		out.ActivatedAt = timestamppb.New(r.ActivatedAt)
	}
	if r.State == store.CARetiring && !r.RetiringAt.IsZero() {
		out.RetiresAt = timestamppb.New(lastLeafExpiry(r))
	}
	return out
}

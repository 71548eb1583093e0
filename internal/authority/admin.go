package authority

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// Operator identities are short-lived by default and capped, so a leaked
// one dies on its own.
const (
	defaultOperatorTTL = 30 * 24 * time.Hour
	maxOperatorTTL     = 366 * 24 * time.Hour
	maxLockReason      = 512
)

type adminService struct {
	musterv1.UnimplementedAdminServiceServer
	s *Server
}

// refused audits a refused read (reads that succeed are not audited)
// through Refusals, aggregated under a flood like every refusal.
func (a *adminService) refused(ctx context.Context, action, target string, err error) {
	c := callerFrom(ctx)
	a.s.refusals.Record(ctx, audit.Event{Actor: c.Actor(), Action: action, Target: target, Result: audit.ResultDenied,
		Reason: status.Convert(err).Message(), Source: c.Source, CorrelationID: c.CorrelationID})
}

// record writes an audit record for a handler's outcome; err nil is
// success. The record is written even when the caller went away.
//
// A change that must be audited carries its record into its own store
// write (a.link) and never comes here on success; a refusal, which
// changed nothing, is recorded here on its own. A refusal whose record
// cannot be written keeps its answer: the caller acts on the refusal
// (its reason names the way out), and there is no change to undo, so
// answering the audit failure instead would only hide why the call was
// refused. It is not dropped either: recordAudit logs it as an error with
// the refusal's result and reason, the record the chain could not take.
func (a *adminService) record(ctx context.Context, action, target string, err error) {
	c := callerFrom(ctx)
	e := audit.Event{Actor: c.Actor(), Action: action, Target: target, Result: audit.ResultOK,
		Source: c.Source, CorrelationID: c.CorrelationID}
	if err != nil {
		e.Result = audit.ResultDenied
		switch status.Code(err) {
		case codes.Internal, codes.Unavailable, codes.Unknown, codes.DataLoss, codes.Canceled, codes.DeadlineExceeded:
			e.Result = audit.ResultError
		}
		e.Reason = status.Convert(err).Message()
	}
	// A change not yet written with its record (the handlers that still
	// record after their write) has committed by now: the line
	// recordAudit logs, result=ok, is the operator's sign of the gap.
	_ = a.s.recordAudit(ctx, e)
}

func (a *adminService) GetStatus(ctx context.Context, _ *musterv1.GetStatusRequest) (*musterv1.GetStatusResponse, error) {
	v, err := a.s.store.SchemaVersion(ctx)
	if err != nil {
		return nil, toStatus(ctx, a.s.log, err)
	}
	return &musterv1.GetStatusResponse{
		AuthorityId: a.s.info.AuthorityID,
		TrustDomain: a.s.info.TrustDomain,
		// The root that signs the intermediates now: during a root
		// rotation the new one from update_servers on, as joining
		// URIs pin (the data directory's root is the one init made).
		CaFingerprint: ca.Fingerprint(a.s.ca.Roots().Signing),
		Version:       a.s.cfg.Version,
		Caller:        callerFrom(ctx).Actor(),
		SchemaVersion: int32(v),
		StartedAt:     timestamppb.New(a.s.started),
		CaWarnings:    caWarningList(a.s.caWarnings(time.Now())),
	}, nil
}

func (a *adminService) AddOperator(ctx context.Context, req *musterv1.AddOperatorRequest) (*musterv1.AddOperatorResponse, error) {
	resp, err := a.issueOperator(ctx, "operator.add", req.GetName(), req.GetCsr(), req.GetTtl(), req.GetReissue())
	if err != nil {
		err = toStatus(ctx, a.s.log, err)
		a.record(ctx, "operator.add", req.GetName(), err)
		return nil, err
	}
	return resp, nil
}

// RenewOperator certifies a new key for the caller's own name: an operator
// keeps its identity going without anyone else, and cannot point a renewal
// at another name.
func (a *adminService) RenewOperator(ctx context.Context, req *musterv1.RenewOperatorRequest) (*musterv1.AddOperatorResponse, error) {
	name := callerFrom(ctx).ID.Name
	resp, err := a.issueOperator(ctx, "operator.renew", name, req.GetCsr(), req.GetTtl(), true)
	if err != nil {
		err = toStatus(ctx, a.s.log, err)
		a.record(ctx, "operator.renew", name, err)
		return nil, err
	}
	return resp, nil
}

// issueOperator certifies csr's key as the operator identity name; reissue
// allows it beside a valid certificate of the same name. The certificate
// is recorded with its audit record (action) in one transaction: one
// that cannot be audited is not recorded, and not handed out.
func (a *adminService) issueOperator(ctx context.Context, action, name string, csrDER []byte, ttlReq *durationpb.Duration, reissue bool) (*musterv1.AddOperatorResponse, error) {
	id, err := spiffeid.New(a.s.info.TrustDomain, spiffeid.RoleAdmin, name)
	if err != nil {
		return nil, badRequest("operator name: " + err.Error())
	}
	ttl := defaultOperatorTTL
	if ttlReq != nil {
		ttl = ttlReq.AsDuration()
	}
	if ttl <= 0 || ttl > maxOperatorTTL {
		return nil, badRequest(fmt.Sprintf("ttl must be between 1s and %s", maxOperatorTTL))
	}
	csr, err := ca.ParseCSR(csrDER)
	if err != nil {
		return nil, err
	}
	issuer := a.s.ca.Issuer(ca.RoleAdmin)
	now := time.Now()
	leaf, err := issuer.Issue(ca.LeafRequest{
		PublicKey:  csr.PublicKey,
		SPIFFEID:   id.URL(),
		CommonName: id.Name,
		ClientAuth: true,
		NotBefore:  now,
		TTL:        ttl,
	})
	if err != nil {
		return nil, err
	}
	serial := leaf.SerialNumber.Text(16)
	link, err := a.link(ctx, action, name, "")
	if err != nil {
		return nil, err
	}
	if err := a.s.store.InsertOperator(ctx, store.Operator{
		Serial: serial, Name: id.Name, SPIFFEID: id.String(),
		NotBefore: leaf.NotBefore, NotAfter: leaf.NotAfter,
		CreatedBy: callerFrom(ctx).Actor(), CreatedAt: now, Reissue: reissue,
	}, link.Build); errors.Is(err, store.ErrConflict) {
		// Two valid certificates with one SAN could not be told apart in
		// the audit log, and locking one would lock both.
		return nil, status.Errorf(codes.AlreadyExists, "operator %s already holds a valid certificate; renew it with --reissue, or choose another name", id.Name)
	} else if err != nil {
		return nil, fmt.Errorf("operator %s not certified: its certificate is recorded with its audit record or not at all, and the write failed: %w", id.Name, err)
	}
	a.s.audit.Appended(link)
	return &musterv1.AddOperatorResponse{
		CertificateChainPem: string(issuer.ChainPEM(leaf)),
		CaCertificatePem:    string(trustedRootsPEM(a.s.ca)),
		SpiffeId:            id.String(),
		NotAfter:            timestamppb.New(leaf.NotAfter),
		Serial:              serial,
	}, nil
}

func (a *adminService) ListOperators(ctx context.Context, _ *musterv1.ListOperatorsRequest) (*musterv1.ListOperatorsResponse, error) {
	ops, err := a.s.store.ListOperators(ctx)
	if err != nil {
		return nil, toStatus(ctx, a.s.log, err)
	}
	locks, err := a.s.store.ListLocks(ctx)
	if err != nil {
		return nil, toStatus(ctx, a.s.log, err)
	}
	locked := map[string]bool{}
	for _, l := range locks {
		if l.Kind == store.LockAdmin {
			locked[l.Target] = true
		}
	}
	resp := &musterv1.ListOperatorsResponse{}
	for _, o := range ops {
		resp.Operators = append(resp.Operators, &musterv1.Operator{
			Name: o.Name, SpiffeId: o.SPIFFEID, Serial: o.Serial,
			NotBefore: timestamppb.New(o.NotBefore), NotAfter: timestamppb.New(o.NotAfter),
			CreatedBy: o.CreatedBy, Locked: locked[o.Name],
		})
	}
	return resp, nil
}

var lockKinds = map[string]bool{
	store.LockNode: true, store.LockInstance: true, store.LockToken: true,
	store.LockPublicKey: true, store.LockAdmin: true,
}

// minLockTTL is the shortest lifetime a lock may be given, the one of the
// other lifetimes the operator sets.
const minLockTTL = jointoken.MinTTL

// CreateLock locks a target. The lock goes in with its lock.create
// record, in the store's one transaction, so a lock that cannot be
// audited is not made; a refusal is audited on its own.
func (a *adminService) CreateLock(ctx context.Context, req *musterv1.CreateLockRequest) (*musterv1.CreateLockResponse, error) {
	resp, err := a.createLock(ctx, req)
	if err != nil {
		err = toStatus(ctx, a.s.log, err)
		a.record(ctx, "lock.create", lockAuditTarget(req), err)
		return nil, err
	}
	return resp, nil
}

// lockAuditTarget is what lock.create's record names: a token lock's
// target cut to its ID, should a whole token have been pasted.
func lockAuditTarget(req *musterv1.CreateLockRequest) string {
	target := req.GetTarget()
	if req.GetKind() == store.LockToken {
		target = secretFree(target)
	}
	return req.GetKind() + ":" + target
}

// link builds the record of the caller's successful action, for a store
// write that appends it in its own transaction (Logger.Builder): pass
// its Build to the write, and call a.s.audit.Appended once it committed.
// callerLink is link for a write made deeper than the handler (a root
// rotation step): an event the log refuses fails that write.
func (s *Server) callerLink(ctx context.Context, action, target, why string) *audit.Link {
	c := callerFrom(ctx)
	return newLink(s.audit, audit.Event{Actor: c.Actor(), Action: action, Target: target, Result: audit.ResultOK,
		Reason: why, Source: c.Source, CorrelationID: c.CorrelationID})
}

func (a *adminService) link(ctx context.Context, action, target, why string) (*audit.Link, error) {
	c := callerFrom(ctx)
	return a.s.audit.Builder(audit.Event{Actor: c.Actor(), Action: action, Target: target, Result: audit.ResultOK,
		Reason: why, Source: c.Source, CorrelationID: c.CorrelationID})
}

func (a *adminService) createLock(ctx context.Context, req *musterv1.CreateLockRequest) (*musterv1.CreateLockResponse, error) {
	if !lockKinds[req.GetKind()] {
		return nil, badRequest("lock kind must be one of node, instance, token, public_key, admin")
	}
	if req.GetTarget() == "" || len(req.GetTarget()) > 512 {
		return nil, badRequest("lock target must be 1 to 512 characters")
	}
	if len(req.GetReason()) > maxLockReason {
		return nil, badRequest(fmt.Sprintf("lock reason must be at most %d characters", maxLockReason))
	}
	// Each target has the form of what it names, so a lock never holds
	// something no join or renewal can match (a path, another case, a
	// typo that locks nothing).
	switch req.GetKind() {
	case store.LockToken:
		// A whole ID.SECRET pasted here would keep the secret in the lock
		// list; the ID alone names the token.
		if strings.Contains(req.GetTarget(), ".") {
			return nil, badRequest("lock a token by its ID, the part before the dot")
		}
		if !jointoken.ValidID(req.GetTarget()) {
			return nil, badRequest("lock a token by its ID: 6 of a-z 0-9, as tokens list prints it")
		}
	case store.LockNode:
		if err := badName("lock node target", "node", req.GetTarget(), nodesListed); err != nil {
			return nil, err
		}
	case store.LockAdmin:
		if err := badName("lock admin target", "operator", req.GetTarget(), operatorsListed); err != nil {
			return nil, err
		}
	case store.LockInstance:
		if u, err := uuid.Parse(req.GetTarget()); err != nil || u.String() != req.GetTarget() {
			return nil, badRequest("lock an instance by its ID, a lower-case UUID as nodes show prints it")
		}
	case store.LockPublicKey:
		if b, err := hex.DecodeString(req.GetTarget()); err != nil || len(b) != 32 || strings.ToLower(req.GetTarget()) != req.GetTarget() {
			return nil, badRequest("lock a public key by the lower-case hex SHA-256 of its SubjectPublicKeyInfo, as agents show prints it")
		}
	}
	c := callerFrom(ctx)
	if req.GetKind() == store.LockAdmin && req.GetTarget() == c.ID.Name {
		return nil, status.Error(codes.FailedPrecondition, "refusing to lock the identity making the request: it would lock you out; use another operator")
	}
	now, err := a.s.store.Now(ctx)
	if err != nil {
		return nil, err
	}
	l := store.Lock{
		ID: "lock-" + uuid.NewString()[:8], Kind: req.GetKind(), Target: req.GetTarget(),
		Reason: req.GetReason(), CreatedBy: c.Actor(), CreatedAt: now,
	}
	if ttl := req.GetTtl(); ttl != nil && ttl.AsDuration() != 0 {
		// As a token's (jointoken.MinTTL): a lock shorter than that
		// lapses before it could refuse anything, and could only mislead
		// (a typo, 10ns for 10m).
		if d := ttl.AsDuration(); d < minLockTTL || !ttl.IsValid() {
			return nil, badRequest(fmt.Sprintf("lock ttl must be at least %s (omit --ttl for a lock that lasts until it is deleted: muster lock delete LOCK-ID), got %s", minLockTTL, d))
		}
		l.ExpiresAt = now.Add(ttl.AsDuration())
	}
	link, err := a.link(ctx, "lock.create", lockAuditTarget(req), "")
	if err != nil {
		return nil, err
	}
	if err := a.s.store.InsertLock(ctx, l, link.Build); err != nil {
		return nil, fmt.Errorf("lock not created: it is written with its audit record or not at all, and the write failed: %w", err)
	}
	a.s.audit.Appended(link)
	return &musterv1.CreateLockResponse{Lock: lockToProto(l)}, nil
}

// secretFree is what an audit record may say of an operator-given token
// ID: a pasted join token (ID.SECRET) is cut to its ID, so a slip never
// writes a secret into the append-only chain.
func secretFree(s string) string {
	id, _, cut := strings.Cut(s, ".")
	if cut {
		return id + ".REDACTED"
	}
	return s
}

func lockToProto(l store.Lock) *musterv1.Lock {
	p := &musterv1.Lock{Id: l.ID, Kind: l.Kind, Target: l.Target, Reason: l.Reason,
		CreatedBy: l.CreatedBy, CreatedAt: timestamppb.New(l.CreatedAt)}
	if !l.ExpiresAt.IsZero() {
		p.ExpiresAt = timestamppb.New(l.ExpiresAt)
	}
	return p
}

func (a *adminService) ListLocks(ctx context.Context, _ *musterv1.ListLocksRequest) (*musterv1.ListLocksResponse, error) {
	locks, err := a.s.store.ListLocks(ctx)
	if err != nil {
		return nil, toStatus(ctx, a.s.log, err)
	}
	resp := &musterv1.ListLocksResponse{}
	for _, l := range locks {
		resp.Locks = append(resp.Locks, lockToProto(l))
	}
	return resp, nil
}

// DeleteLock lifts a lock, with its lock.delete record in the same
// transaction: a lock whose deletion cannot be audited stays in force.
func (a *adminService) DeleteLock(ctx context.Context, req *musterv1.DeleteLockRequest) (*musterv1.DeleteLockResponse, error) {
	link, err := a.link(ctx, "lock.delete", req.GetId(), "")
	if err == nil {
		err = a.s.store.DeleteLock(ctx, req.GetId(), link.Build)
		switch {
		case errors.Is(err, store.ErrNotFound):
			err = status.Errorf(codes.NotFound, "no lock %q", req.GetId())
		case err != nil:
			err = fmt.Errorf("lock %s not deleted: it is deleted with its audit record or not at all, and the write failed: %w", req.GetId(), err)
		}
	}
	if err != nil {
		err = toStatus(ctx, a.s.log, err)
		a.record(ctx, "lock.delete", req.GetId(), err)
		return nil, err
	}
	a.s.audit.Appended(link)
	// An unlock announces nothing to streams; the lists learn of it
	// here, at once (and any replica's at its next pass).
	a.s.pokeCRL(store.Change{Kind: store.ChangeStanding})
	return &musterv1.DeleteLockResponse{}, nil
}

const maxAuditPage = 1000

func (a *adminService) ListAudit(ctx context.Context, req *musterv1.ListAuditRequest) (*musterv1.ListAuditResponse, error) {
	if req.GetLimit() < 0 || req.GetLimit() > maxAuditPage {
		err := toStatus(ctx, a.s.log, badRequest(fmt.Sprintf("limit must be 0 (a full page) to %d; page on with after_seq", maxAuditPage)))
		a.record(ctx, "audit.list", "", err)
		return nil, err
	}
	limit := int(req.GetLimit())
	if limit == 0 {
		limit = maxAuditPage
	}
	f := store.AuditFilter{Action: req.GetAction(), AfterSeq: req.GetAfterSeq(), Limit: limit + 1}
	if req.GetSince() != nil {
		f.Since = req.GetSince().AsTime()
	}
	recs, err := a.s.store.ListAudit(ctx, f)
	if err != nil {
		return nil, toStatus(ctx, a.s.log, err)
	}
	resp := &musterv1.ListAuditResponse{}
	if len(recs) > limit {
		recs = recs[:limit]
		resp.NextAfterSeq = recs[limit-1].Seq
	}
	for _, r := range recs {
		resp.Records = append(resp.Records, &musterv1.AuditRecord{
			Seq: r.Seq, Time: timestamppb.New(r.Time), Actor: r.Actor, Action: r.Action,
			Target: r.Target, Result: r.Result, Reason: r.Reason, Source: r.Source,
			CorrelationId: r.CorrelationID, Hash: hex.EncodeToString(r.Hash),
		})
	}
	return resp, nil
}

func (a *adminService) VerifyAudit(ctx context.Context, _ *musterv1.VerifyAuditRequest) (*musterv1.VerifyAuditResponse, error) {
	rep, err := a.s.audit.Verify(ctx)
	if err != nil {
		return nil, toStatus(ctx, a.s.log, err)
	}
	result := error(nil)
	if !rep.OK {
		result = status.Error(codes.DataLoss, rep.Problem)
	}
	a.record(ctx, "audit.verify", fmt.Sprintf("records 1..%d", rep.Head.Seq), result)
	return &musterv1.VerifyAuditResponse{
		Ok: rep.OK, RecordsChecked: rep.RecordsChecked, CheckpointsChecked: rep.CheckpointsChecked,
		FirstBadSeq: rep.FirstBadSeq, Problem: rep.Problem,
		HeadSeq: rep.Head.Seq, HeadHash: hex.EncodeToString(rep.Head.Hash),
	}, nil
}

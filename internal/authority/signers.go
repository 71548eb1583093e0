package authority

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/enroll"
	"github.com/muster-dev/muster/internal/retrywait"
	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// signerTick is how often the leader looks for a signer activation or
// retirement that has come due: a staged signer starts signing at most
// this late after its effective time.
const signerTick = 5 * time.Second

// ensureSigner creates the first task signer when the store has none: an
// authority upgraded from a version without signers gets one at start.
// Replicas starting together create one between them.
func (s *Server) ensureSigner(ctx context.Context) error {
	created, err := s.signers.EnsureFirst(ctx, signer.Actor{Name: "authority"})
	if err != nil {
		return fmt.Errorf("authority: creating the first task signer: %w", err)
	}
	if created {
		s.log.Info("created the first task signer")
	}
	// Agents apply the lead time of the set they hold, which carries the
	// lead time in force when it was signed. signer.min_lead_time is a
	// shared setting, the same on every replica; a set signed before it
	// was changed carries the old one until the next signer step
	// publishes a set with the new one.
	if lead, v, err := s.signers.SetMinLeadTime(ctx); err == nil && lead != s.signers.MinLeadTime() {
		s.log.Warn("signer.min_lead_time differs from the one the current verifier set carries: agents apply the set's to the next rotate task until the next signer step publishes a set with this one (docs/high-availability.md, \"Settings kept in the store\")",
			"signer_min_lead_time", s.signers.MinLeadTime().String(), "verifier_set_min_lead_time", lead.String(), "verifier_set_version", v)
	}
	return nil
}

// signerKeyErrorEvery bounds how often the signer clock logs that an
// ended signer's key could not be destroyed (a token that does not answer
// fails every pass).
const signerKeyErrorEvery = time.Minute

// signerClock is the leader's job that activates a staged signer at its
// effective time, retires a signer in grace when its grace ends, and
// destroys the keys of ended signers that still have one.
func (s *Server) signerClock(ctx context.Context) error {
	t := time.NewTicker(signerTick)
	defer t.Stop()
	var keyErrLogged time.Time
	// A failed destruction of an ended signer's key (the token away) is
	// tried again less and less often, as the CA's retired keys are.
	destroyWaits := &retrywait.Waits{First: caDestroyFirstWait, Max: caDestroyMaxWait}
	for {
		res, err := s.signers.Tick(ctx, signer.Actor{Name: "authority"})
		switch {
		case err != nil && ctx.Err() == nil:
			if !s.outage.fail(err) {
				s.log.Error("signer lifecycle step failed", "err", err)
			}
		case len(res.Changes) > 0:
			s.log.Info("signer lifecycle step taken by the clock", "action", res.Changes[len(res.Changes)-1].Action,
				"signer_version_id", res.Changes[len(res.Changes)-1].To.VersionID, "verifier_set_version", res.Version)
		}
		if err == nil {
			done, err := s.signers.DestroyEndedSpaced(ctx, signer.Actor{Name: "authority"}, destroyWaits)
			for _, f := range done {
				s.log.Info("ended signer's key destroyed", "signer_version_id", f.VersionID, "key", f.Where)
			}
			if err != nil && ctx.Err() == nil && !s.outage.fail(err) && time.Since(keyErrLogged) >= signerKeyErrorEvery {
				keyErrLogged = time.Now()
				s.log.Error("destroying an ended signer's key failed; retried after "+caDestroyFirstWait.String()+", then less often, at least every "+caDestroyMaxWait.String()+" (docs/hsm.md)", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Defaults of muster signer stage.
const (
	defaultSignerEffectiveIn = time.Hour
	defaultSignerGrace       = 24 * time.Hour
	maxSignerWindow          = 366 * 24 * time.Hour
)

func signerToProto(s signer.Signer) *musterv1.Signer {
	return &musterv1.Signer{
		VersionId: s.VersionID, PublicKey: signer.EncodePublicKey(s.PublicKey), State: string(s.State),
		PublishedAt: timestampOrNil(s.PublishedAt), EffectiveAt: timestampOrNil(s.EffectiveAt),
		GraceUntil: timestampOrNil(s.GraceUntil), RetiresAt: timestampOrNil(s.RetiresAt),
		EndedAt: timestampOrNil(s.EndedAt), Previous: s.Previous,
	}
}

func timestampOrNil(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func (a *adminService) ListSigners(ctx context.Context, _ *musterv1.ListSignersRequest) (*musterv1.ListSignersResponse, error) {
	snap, err := a.s.signers.Load(ctx)
	if err != nil {
		return nil, toStatus(ctx, a.s.log, err)
	}
	resp := &musterv1.ListSignersResponse{VerifierSetVersion: snap.Version(), MinLeadTime: durationpb.New(a.s.signers.MinLeadTime())}
	for _, s := range snap.Signers {
		p := signerToProto(s)
		p.KeyCustody = snap.KeyCustody(s.VersionID)
		resp.Signers = append(resp.Signers, p)
	}
	return resp, nil
}

// actor is the caller as the signer keeper audits it.
func actor(ctx context.Context) signer.Actor {
	c := callerFrom(ctx)
	return signer.Actor{Name: c.Actor(), Source: c.Source, CorrelationID: c.CorrelationID}
}

// signerStep answers a lifecycle step. The keeper has audited it; a
// conflict means another replica or operator changed the signers between
// this step's read and its write.
func (a *adminService) signerStep(ctx context.Context, res signer.Result, err error) (*musterv1.SignerChangeResponse, error) {
	if errors.Is(err, store.ErrConflict) {
		return nil, status.Error(codes.Aborted, signer.ChangedConcurrently)
	}
	if errors.Is(err, signer.ErrChanged) {
		// Taken on what the operator saw, the step would no longer mean
		// what they asked: they look again, as after a lost write.
		return nil, status.Error(codes.Aborted, err.Error())
	}
	if err != nil {
		return nil, toStatus(ctx, a.s.log, err)
	}
	resp := &musterv1.SignerChangeResponse{VerifierSetVersion: res.Version}
	for _, c := range res.Changes {
		p := signerToProto(c.To)
		p.KeyCustody = res.KeyCustody(c.To.VersionID)
		resp.Changed = append(resp.Changed, p)
	}
	return resp, nil
}

// malformedStep refuses and audits a request the keeper never saw.
func (a *adminService) malformedStep(ctx context.Context, act signer.Action, target string, err error) (*musterv1.SignerChangeResponse, error) {
	err = toStatus(ctx, a.s.log, err)
	a.record(ctx, "node_task_signer."+string(act), target, err)
	return nil, err
}

// optionalDuration reads an optional, positive, bounded duration.
func optionalDuration(name string, d *durationpb.Duration, def time.Duration) (time.Duration, error) {
	if d == nil {
		return def, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, badRequest(name + ": " + err.Error())
	}
	v := d.AsDuration()
	if v <= 0 || v > maxSignerWindow {
		return 0, badRequest(fmt.Sprintf("%s must be positive and at most %s: give `muster signer stage` a --%s within that",
			name, maxSignerWindow, strings.ReplaceAll(name, "_", "-")))
	}
	return v, nil
}

func (a *adminService) StageSigner(ctx context.Context, req *musterv1.StageSignerRequest) (*musterv1.SignerChangeResponse, error) {
	eff, err := optionalDuration("effective_in", req.EffectiveIn, defaultSignerEffectiveIn)
	if err != nil {
		return a.malformedStep(ctx, signer.ActStage, "", err)
	}
	grace, err := optionalDuration("grace", req.Grace, defaultSignerGrace)
	if err != nil {
		return a.malformedStep(ctx, signer.ActStage, "", err)
	}
	res, err := a.s.signers.Stage(ctx, actor(ctx), eff, grace)
	if staged, ok := rotationOf(res); ok && err == nil {
		a.s.queueRotation(ctx, staged, res.At, callerFrom(ctx).Actor())
	}
	return a.signerStep(ctx, res, err)
}

func (a *adminService) ActivateSigner(ctx context.Context, req *musterv1.ActivateSignerRequest) (*musterv1.SignerChangeResponse, error) {
	seen, err := seenOf(req.GetVersionId(), req.GetVerifierSetVersion())
	if err != nil {
		return a.malformedStep(ctx, signer.ActActivate, "", err)
	}
	res, err := a.s.signers.ActivateSeen(ctx, actor(ctx), seen)
	return a.signerStep(ctx, res, err)
}

func (a *adminService) RetireSigner(ctx context.Context, req *musterv1.RetireSignerRequest) (*musterv1.SignerChangeResponse, error) {
	seen, err := seenOf(req.GetVersionId(), req.GetVerifierSetVersion())
	if err != nil {
		return a.malformedStep(ctx, signer.ActRetire, "", err)
	}
	res, err := a.s.signers.RetireSeen(ctx, actor(ctx), seen)
	return a.signerStep(ctx, res, err)
}

// seenOf reads what an operator's step says they saw (both optional).
func seenOf(versionID string, setVersion int64) (signer.Seen, error) {
	if versionID != "" {
		if err := signer.ValidVersionID(versionID); err != nil {
			return signer.Seen{}, badRequest(err.Error())
		}
	}
	if setVersion < 0 {
		return signer.Seen{}, badRequest("verifier_set_version must not be negative: give the version `muster signer list` shows")
	}
	return signer.Seen{VersionID: versionID, SetVersion: setVersion}, nil
}

func (a *adminService) RevokeSigner(ctx context.Context, req *musterv1.RevokeSignerRequest) (*musterv1.SignerChangeResponse, error) {
	if err := signer.ValidVersionID(req.GetVersionId()); err != nil {
		return a.malformedStep(ctx, signer.ActRevoke, "", badRequest(err.Error()))
	}
	seen, err := seenOf(req.GetVersionId(), req.GetVerifierSetVersion())
	if err != nil {
		return a.malformedStep(ctx, signer.ActRevoke, "", err)
	}
	res, err := a.s.signers.RevokeSeen(ctx, actor(ctx), seen)
	return a.signerStep(ctx, res, err)
}

func (a *adminService) RollbackSigner(ctx context.Context, req *musterv1.RollbackSignerRequest) (*musterv1.SignerChangeResponse, error) {
	seen, err := seenOf(req.GetVersionId(), req.GetVerifierSetVersion())
	if err != nil {
		return a.malformedStep(ctx, signer.ActRollback, "", err)
	}
	res, err := a.s.signers.RollbackSeen(ctx, actor(ctx), seen)
	if staged, ok := rotationOf(res); ok && err == nil {
		// Rolled back inside grace: the rollout is re-issued.
		a.s.queueRotation(ctx, staged, res.At, callerFrom(ctx).Actor())
	}
	return a.signerStep(ctx, res, err)
}

// verifierSet is the signed verifier set for a join or renewal answer. A
// failure to build it is logged and the answer goes without it: the agent
// keeps the set it has and catches up at its next renewal, which is better
// than refusing it an identity.
func (s *Server) verifierSet(ctx context.Context) []byte {
	raw, err := s.signers.VerifierSet(ctx)
	if err != nil {
		s.log.Error("cannot build the verifier set", "err", err, "correlation_id", callerFrom(ctx).CorrelationID)
		return nil
	}
	return raw
}

// verifierSetOf is verifierSet for an answer whose request read the set's
// ID with its record (a renewal, a bound-keypair refresh): served from
// that ID, without reading it again.
func (s *Server) verifierSetOf(ctx context.Context, iss *enroll.Issued) []byte {
	if iss == nil || !iss.SignerSetRead {
		return s.verifierSet(ctx)
	}
	raw, err := s.signers.VerifierSetAt(ctx, iss.SignerSet)
	if err != nil {
		s.log.Error("cannot build the verifier set", "err", err, "correlation_id", callerFrom(ctx).CorrelationID)
		return nil
	}
	return raw
}

// setAhead watches heartbeats for a verifier set above the store's
// version: the store was restored from a backup and its version went
// back. Agents refuse sets not newer than theirs, so the authority moves
// the version past the set an agent holds, if that set verifies with a
// key the store holds (signer.Keeper.Advance), and publishes there.
type setAhead struct {
	// logged is the highest reported version logged so far: each is
	// logged once, not with every heartbeat.
	logged atomic.Int64
	// advance is this replica's slot for an advance of a set that
	// verified (VerifyAhead), refused for the audit of one that did not:
	// each taken at most once per advanceEvery, so no agent can make the
	// authority write, sign, audit and fan out a set, nor audit a refusal,
	// with every heartbeat, and a made-up set does not take the slot of a
	// genuine one.
	advance, refused slot
	// version caches the store's set version for the heartbeats' first
	// comparison; a signer change notification invalidates it (onChange).
	version  versionCache
	detected prometheus.Counter
	limited  prometheus.Counter
	highest  prometheus.Gauge
}

// advanceEvery is how often one replica tries to advance the verifier set
// version for heartbeats ahead of the store.
const advanceEvery = time.Minute

func newSetAhead(reg prometheus.Registerer) (*setAhead, error) {
	a := &setAhead{
		detected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_verifier_set_agent_ahead_total",
			Help: "Heartbeats carrying a verifier set above the store's version (a restored store).",
		}),
		limited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "muster_verifier_set_advance_limited_total",
			Help: "Heartbeats ahead of the store not followed because this replica tried an advance less than a minute before.",
		}),
		highest: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "muster_verifier_set_agent_ahead_version",
			Help: "The highest verifier set version an agent reported above the store's; 0 if none.",
		}),
	}
	for _, c := range []prometheus.Collector{a.detected, a.limited, a.highest} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// versionCache holds the store's verifier set version between signer
// changes, so a heartbeat costs no store read. Safe for concurrent use.
type versionCache struct {
	mu      sync.Mutex
	gen     uint64 // bumped by each invalidation
	have    bool
	version int64
}

// get returns the cached version, or loads it. A version loaded while an
// invalidation came is returned but not kept: it may predate the change.
func (c *versionCache) get(ctx context.Context, load func(context.Context) (int64, error)) (int64, error) {
	c.mu.Lock()
	if c.have {
		defer c.mu.Unlock()
		return c.version, nil
	}
	gen := c.gen
	c.mu.Unlock()
	v, err := load(ctx)
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen == gen {
		c.have, c.version = true, v
	}
	return v, nil
}

// invalidate drops the cached version: the signers changed.
func (c *versionCache) invalidate() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.have = false
}

// slot is taken at most once per advanceEvery.
type slot struct {
	last atomic.Int64 // when it was last taken, unix nanoseconds; 0: never
}

// claim takes the slot if advanceEvery has passed since it was last taken.
func (l *slot) claim(now time.Time) bool {
	last := l.last.Load()
	return (last == 0 || now.Sub(time.Unix(0, last)) >= advanceEvery) && l.last.CompareAndSwap(last, now.UnixNano())
}

// checkSetVersion compares the verifier set a heartbeat carries (raw,
// the signed set the agent holds) with the store's version, and when the
// agent is ahead, logs it (once per version), counts it and, at most
// once a minute on this replica, asks the keeper to advance past it.
// An agent of a release that sends no set is not followed.
//
// The heartbeat's own figure (claimed) is compared first, with the store's
// version as this replica last read it (versionCache, kept until a signer
// change is announced): a heartbeat at or below it costs neither a parse
// nor a store read. One above it is checked against the store's version
// read again, before it is logged or counted as ahead.
func (s *Server) checkSetVersion(ctx context.Context, node string, claimed int64, raw []byte) {
	if len(raw) == 0 || s.setAhead == nil {
		return
	}
	have, err := s.setAhead.version.get(ctx, s.signers.SetVersion)
	if err != nil || claimed <= have {
		return
	}
	set, err := signer.ParseVerifierSet(raw)
	if err != nil || set.Version <= have {
		return
	}
	// The cached version may be stale: a change made with no replica to
	// announce it (muster ca migrate-custody, a signer step run offline
	// against the store) gave the agent a set this replica has not read.
	// Read the store's before calling the agent's ahead of it; a newer
	// one replaces the cached one.
	if fresh, err := s.signers.SetVersion(ctx); err != nil {
		return
	} else if fresh != have {
		s.setAhead.version.invalidate()
		if have = fresh; set.Version <= have {
			return
		}
	}
	reported := set.Version
	s.setAhead.detected.Inc()
	if prev := s.setAhead.logged.Load(); reported > prev && s.setAhead.logged.CompareAndSwap(prev, reported) {
		s.setAhead.highest.Set(float64(reported))
		s.log.Warn("an agent holds a verifier set newer than the store's: the store was restored from a backup? moving the version past it",
			"node", node, "agent_version", reported, "store_version", have)
	}
	// The slot of an advance is claimed only once the set verified: a
	// made-up set is refused (audited through a slot of its own) and
	// leaves the advance to the next genuine one.
	behind, refused, err := s.signers.VerifyAhead(ctx, raw)
	switch {
	case err != nil:
		if ctx.Err() == nil && !s.outage.fail(err) {
			s.log.Error("cannot check an agent's verifier set against the store's", "err", err, "node", node)
		}
		return
	case refused != nil:
		if !s.setAhead.refused.claim(time.Now()) {
			s.setAhead.limited.Inc()
			s.log.Debug("verifier set not followed, not audited: a refusal was audited less than a minute ago", "node", node, "agent_version", reported, "reason", refused)
			return
		}
	case !behind:
		return // another replica moved the version past it meanwhile
	case !s.setAhead.advance.claim(time.Now()):
		s.setAhead.limited.Inc()
		s.log.Debug("verifier set advance not tried: one was tried less than a minute ago", "node", node, "agent_version", reported)
		return
	}
	// Advance checks the set again, and audits the advance or the refusal.
	res, err := s.signers.Advance(ctx, signer.Actor{Name: "authority", Source: node}, raw)
	switch {
	case err != nil && ctx.Err() == nil:
		s.log.Error("cannot move the verifier set version past an agent's", "err", err, "node", node, "agent_version", reported)
	case res.Version > 0:
		s.log.Info("verifier set version moved past the agents'", "version", res.Version)
	}
}

// agentService is what enrolled agents call over mTLS.
type agentService struct {
	musterv1.UnimplementedAgentServiceServer
	s *Server
}

// GetVerifierSet answers the current set and the chain of sets published
// after the version the agent holds: an agent that missed several signer
// steps (offline across rotations, or a stream that carried only the
// latest set) takes them in turn, each signed by a key the one before
// holds as active or staged. Over this mTLS channel, the authority's
// identity checked by the agent, so a kept set reaches only agents of
// this authority; the chain's own signatures are what the agent trusts.
func (a *agentService) GetVerifierSet(ctx context.Context, req *musterv1.GetVerifierSetRequest) (*musterv1.GetVerifierSetResponse, error) {
	if err := a.standing(ctx); err != nil {
		return nil, err
	}
	if req.GetHaveVersion() < 0 {
		return nil, a.badRequest(ctx, "have_version must not be negative")
	}
	chain, err := a.s.signers.Chain(ctx, req.GetHaveVersion())
	if err != nil {
		return nil, toStatus(ctx, a.s.log, err)
	}
	raw, err := a.s.signers.VerifierSet(ctx)
	if err != nil {
		return nil, toStatus(ctx, a.s.log, err)
	}
	return &musterv1.GetVerifierSetResponse{VerifierSet: raw, Chain: chain, TrustBundle: a.s.trustBundleProto()}, nil
}

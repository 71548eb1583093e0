package authority

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/joinuri"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// validTokenName accepts a join token's ID or a bound-keypair token's name;
// a whole join token (ID.SECRET), which is also a valid node ID, is neither.
func validTokenName(name string) bool {
	return jointoken.ValidID(name) || (spiffeid.ValidNodeID(name) == nil && !jointoken.LooksLike(name))
}

const badTokenName = "a token is named by its token ID (6 characters of a-z 0-9, the part before the dot) or, for a bound-keypair token, by its name (a node ID not of the form ID.SECRET)"

func timeOf(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}

func tsOf(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// boundKeypairToProto fills the bound-keypair spec and status of p; the
// registration secret only with sealer set (a single token's answer, never
// a list).
// boundKeypairStatus is a bound-keypair token's status, without its
// registration secret.
func boundKeypairStatus(b *store.BoundKeypair) *musterv1.BoundKeypairStatus {
	st := &musterv1.BoundKeypairStatus{BoundPublicKey: b.BoundPublicKey, BoundInstanceId: b.BoundInstanceID,
		RecoveryCount: b.RecoveryCount, RecoverySequence: b.RecoverySequence, RecoveriesRemaining: -1,
		LastRecoveredAt: tsOf(b.LastRecoveredAt), LastRotatedAt: tsOf(b.LastRotatedAt), Epoch: b.Epoch}
	if k, err := boundkeypair.ParsePublicKey(b.BoundPublicKey); err == nil {
		st.BoundKeyFingerprint = k.Fingerprint()
	}
	if b.Spec.RecoveryMode == boundkeypair.ModeStandard {
		st.RecoveriesRemaining = boundkeypair.Status{Limit: b.Spec.RecoveryLimit, Count: b.RecoveryCount}.Remaining()
	}
	return st
}

func (s *Server) boundKeypairToProto(p *musterv1.Token, t store.Token, withSecret bool) error {
	b := t.BoundKeypair
	if b == nil {
		return nil
	}
	p.BoundKeypair = &musterv1.BoundKeypairSpec{InitialPublicKey: b.Spec.InitialPublicKey, MustRegisterBefore: tsOf(b.Spec.MustRegisterBefore),
		RecoveryLimit: b.Spec.RecoveryLimit, RecoveryMode: b.Spec.RecoveryMode, RotateAfter: tsOf(b.Spec.RotateAfter)}
	st := boundKeypairStatus(b)
	if withSecret && b.SecretCiphertext != nil {
		secret, err := s.tokens.Open(b.SecretCiphertext, b.SecretNonce, []byte(t.ID))
		if err != nil {
			return fmt.Errorf("authority: token %s: registration secret: %w", t.ID, err)
		}
		st.RegistrationSecret = string(secret)
	}
	p.BoundKeypairStatus = st
	return nil
}

func (a *adminService) ApplyToken(ctx context.Context, req *musterv1.ApplyTokenRequest) (*musterv1.ApplyTokenResponse, error) {
	resp, err := a.applyToken(ctx, req)
	err = toStatus(ctx, a.s.log, err)
	// A token created was recorded with its insert; one found as
	// applied, or a refusal, changed nothing and is recorded here.
	if err != nil || !resp.GetCreated() {
		a.record(ctx, applyAction(req), "token "+secretFree(req.GetName()), err)
	}
	return resp, err
}

func applyAction(req *musterv1.ApplyTokenRequest) string {
	if req.GetCreateOnly() {
		return "bot.add"
	}
	return "token.apply"
}

func (a *adminService) applyToken(ctx context.Context, req *musterv1.ApplyTokenRequest) (*musterv1.ApplyTokenResponse, error) {
	b := req.GetBoundKeypair()
	if b == nil {
		return nil, badRequest("spec.bound_keypair is required")
	}
	spec := boundkeypair.Spec{Name: req.GetName(), Node: req.GetNodeId(), InitialPublicKey: b.GetInitialPublicKey(),
		MustRegisterBefore: timeOf(b.GetMustRegisterBefore()), RecoveryLimit: b.GetRecoveryLimit(),
		RecoveryMode: b.GetRecoveryMode(), RotateAfter: timeOf(b.GetRotateAfter())}
	key, err := spec.Check()
	if err != nil {
		return nil, badRequest(err.Error())
	}
	usage, err := jointoken.ParseSVIDUsage(req.GetSvidUsage())
	if err != nil {
		return nil, badRequest("spec.svid_usage: " + err.Error())
	}
	if w := spec.Warning(); w != "" {
		a.s.log.Warn(w, "token", spec.Name)
	}
	stored := store.BoundKeypairSpec{InitialPublicKey: key.String(), MustRegisterBefore: spec.MustRegisterBefore,
		RecoveryLimit: spec.RecoveryLimit, RecoveryMode: spec.RecoveryMode, RotateAfter: spec.RotateAfter}
	now, err := a.s.store.Now(ctx)
	if err != nil {
		return nil, err
	}
	old, err := a.s.store.GetToken(ctx, spec.Name)
	switch {
	case err == nil && req.GetCreateOnly():
		return nil, status.Errorf(codes.AlreadyExists, "token %s exists; change it with muster token apply", spec.Name)
	case err == nil && old.JoinMethod != store.JoinMethodBoundKeypair:
		return nil, status.Errorf(codes.FailedPrecondition, "token %s is a %s token", spec.Name, old.JoinMethod)
	case err == nil && old.NodeID != spec.Node:
		return nil, badRequest(fmt.Sprintf("spec.node: token %s is for node %s; a token's node cannot change", spec.Name, old.NodeID))
	case err == nil:
		t, err := a.s.store.UpdateBoundKeypairSpec(ctx, spec.Name, stored, usage)
		if err != nil {
			return nil, err
		}
		return a.appliedToken(t, now, false)
	case !errors.Is(err, store.ErrNotFound):
		return nil, err
	}

	t := store.Token{ID: spec.Name, JoinMethod: store.JoinMethodBoundKeypair, Ciphertext: []byte{}, Nonce: []byte{},
		NodeID: spec.Node, CreatedBy: callerFrom(ctx).Actor(), CreatedAt: now, BoundKeypair: &store.BoundKeypair{Spec: stored}, SVIDUsage: usage}
	if key.IsZero() {
		// No key given: the agent binds its own with a one-use secret.
		raw := make([]byte, 16)
		if _, err := rand.Read(raw); err != nil {
			return nil, err
		}
		secret := hex.EncodeToString(raw)
		if t.BoundKeypair.SecretCiphertext, t.BoundKeypair.SecretNonce, err = a.s.tokens.Seal([]byte(secret), []byte(t.ID)); err != nil {
			return nil, err
		}
	} else {
		t.BoundKeypair.BoundPublicKey = key.String()
	}
	link, err := a.link(ctx, applyAction(req), "token "+secretFree(req.GetName()), "")
	if err != nil {
		return nil, err
	}
	if err := a.s.store.InsertToken(ctx, t, link.Build); errors.Is(err, store.ErrConflict) {
		return nil, status.Errorf(codes.AlreadyExists, "token %s exists", spec.Name)
	} else if err != nil {
		return nil, fmt.Errorf("token %s not created: it is written with its audit record or not at all, and the write failed: %w", spec.Name, err)
	}
	a.s.audit.Appended(link)
	return a.appliedToken(t, now, true)
}

func (a *adminService) appliedToken(t store.Token, now time.Time, created bool) (*musterv1.ApplyTokenResponse, error) {
	p := tokenToProto(t, now)
	if err := a.s.boundKeypairToProto(p, t, true); err != nil {
		return nil, err
	}
	uri := joinuri.URI{Method: joinuri.MethodBoundKeypair, KeypairName: t.ID,
		KeypairSecret: p.GetBoundKeypairStatus().GetRegistrationSecret(), Address: a.s.advertise(), Fingerprint: a.s.joinFingerprint()}
	return &musterv1.ApplyTokenResponse{Token: p, Created: created, Uri: uri.Reveal()}, nil
}

package authority

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/joinuri"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// Token states, as listed to operators.
const (
	tokenActive  = jointoken.StateActive
	tokenExpired = jointoken.StateExpired
	tokenUsedUp  = jointoken.StateUsedUp
)

func tokenState(t store.Token, now time.Time) string {
	return jointoken.Usage{ExpiresAt: t.ExpiresAt, UsesAllowed: t.UsesAllowed, UsesCount: t.UsesCount}.State(now)
}

func tokenToProto(t store.Token, now time.Time) *musterv1.Token {
	p := &musterv1.Token{
		Id: t.ID, JoinMethod: t.JoinMethod, UsesAllowed: t.UsesAllowed, UsesCount: t.UsesCount,
		NodeId: t.NodeID, Description: t.Description, Labels: t.Labels, CreatedBy: t.CreatedBy,
		CreatedAt: timestamppb.New(t.CreatedAt), State: tokenState(t, now), SvidUsage: t.SVIDUsageOrDefault(),
	}
	if !t.ExpiresAt.IsZero() {
		p.ExpiresAt = timestamppb.New(t.ExpiresAt)
	}
	if !t.LastUsedAt.IsZero() {
		p.LastUsedAt = timestamppb.New(t.LastUsedAt)
	}
	return p
}

func (a *adminService) CreateToken(ctx context.Context, req *musterv1.CreateTokenRequest) (*musterv1.CreateTokenResponse, error) {
	resp, target, err := a.createToken(ctx, req)
	if err != nil {
		err = toStatus(ctx, a.s.log, err)
		a.record(ctx, "token.create", target, err)
		return nil, err
	}
	return resp, nil
}

func (a *adminService) createToken(ctx context.Context, req *musterv1.CreateTokenRequest) (*musterv1.CreateTokenResponse, string, error) {
	spec := jointoken.Spec{TTL: jointoken.DefaultTTL, Uses: 1, Node: req.GetNodeId(), Description: req.GetDescription(),
		Labels: req.GetLabels(), UnsafeUnlimited: req.GetUnsafeUnlimited()}
	if req.Ttl != nil {
		spec.TTL = req.Ttl.AsDuration()
	}
	if req.Uses != nil {
		spec.Uses = req.GetUses()
	}
	if err := spec.Check(); err != nil {
		return nil, "", badRequest(err.Error())
	}
	usage, err := jointoken.ParseSVIDUsage(req.GetSvidUsage())
	if err != nil {
		return nil, "", badRequest(err.Error())
	}
	ttl, uses := spec.TTL, spec.Uses
	now, err := a.s.store.Now(ctx)
	if err != nil {
		return nil, "", err
	}
	t := store.Token{
		JoinMethod: store.JoinMethodToken, UsesAllowed: uses, NodeID: req.GetNodeId(),
		Description: req.GetDescription(), Labels: req.GetLabels(), CreatedBy: callerFrom(ctx).Actor(), CreatedAt: now,
		SVIDUsage: usage,
	}
	if ttl > 0 {
		t.ExpiresAt = now.Add(ttl)
	}
	// IDs are 6 random characters: a collision is rare, and the insert's
	// uniqueness check catches it.
	var tok jointoken.Token
	for attempt := 0; ; attempt++ {
		if tok, err = jointoken.Generate(); err != nil {
			return nil, "", err
		}
		t.ID = tok.ID
		if t.Ciphertext, t.Nonce, err = a.s.tokens.Seal(tok.Secret(), []byte(tok.ID)); err != nil {
			return nil, "", err
		}
		// The token goes in with its record, or neither does: a token
		// that cannot be audited admits no one.
		link, err := a.link(ctx, "token.create", "token "+t.ID, "")
		if err != nil {
			return nil, "", err
		}
		err = a.s.store.InsertToken(ctx, t, link.Build)
		if err == nil {
			a.s.audit.Appended(link)
			break
		}
		if !errors.Is(err, store.ErrConflict) || attempt == 4 {
			return nil, "", fmt.Errorf("token not created: it is written with its audit record or not at all, and the write failed: %w", err)
		}
	}
	if spec.Unlimited() {
		a.s.log.Warn("created a join token with no expiry and unlimited uses (--unsafe-unlimited)", "token_id", t.ID)
	}
	uri := joinuri.URI{Method: joinuri.MethodToken, Token: tok, Address: a.s.advertise(),
		Fingerprint: a.s.joinFingerprint(), Node: t.NodeID}
	target := fmt.Sprintf("token %s", t.ID)
	return &musterv1.CreateTokenResponse{Token: tok.Reveal(), Info: tokenToProto(t, now), Uri: uri.Reveal()}, target, nil
}

func (a *adminService) GetToken(ctx context.Context, req *musterv1.GetTokenRequest) (*musterv1.GetTokenResponse, error) {
	if !validTokenName(req.GetId()) {
		err := toStatus(ctx, a.s.log, badRequest(badTokenName))
		a.refused(ctx, "token.get", secretFree(req.GetId()), err)
		return nil, err
	}
	t, err := a.s.store.GetToken(ctx, req.GetId())
	if err != nil {
		return nil, toStatus(ctx, a.s.log, notFound(err, fmt.Sprintf("join token %q", req.GetId())))
	}
	p := tokenToProto(t, time.Now())
	// One token's answer shows a registration secret not yet used, as
	// DESIGN.md's status does; a list never does.
	if err := a.s.boundKeypairToProto(p, t, true); err != nil {
		return nil, toStatus(ctx, a.s.log, err)
	}
	return &musterv1.GetTokenResponse{Token: p}, nil
}

func (a *adminService) DeleteToken(ctx context.Context, req *musterv1.DeleteTokenRequest) (*musterv1.DeleteTokenResponse, error) {
	err := error(nil)
	if !validTokenName(req.GetId()) {
		err = badRequest(badTokenName)
	} else {
		err = a.deleteToken(ctx, req.GetId())
	}
	if err != nil {
		err = toStatus(ctx, a.s.log, err)
		a.record(ctx, "token.delete", "token "+secretFree(req.GetId()), err)
		return nil, err
	}
	return &musterv1.DeleteTokenResponse{}, nil
}

// deleteToken deletes token id with its token.delete record in the same
// transaction: a token whose deletion cannot be audited stays.
func (a *adminService) deleteToken(ctx context.Context, id string) error {
	link, err := a.link(ctx, "token.delete", "token "+id, "")
	if err != nil {
		return err
	}
	err = a.s.store.DeleteToken(ctx, id, link.Build)
	if errors.Is(err, store.ErrNotFound) {
		return notFound(err, fmt.Sprintf("join token %q", id))
	}
	if err != nil {
		return fmt.Errorf("token %s not deleted: it is deleted with its audit record or not at all, and the write failed: %w", id, err)
	}
	a.s.audit.Appended(link)
	return nil
}

// agentToProto summarises a node with its current instance, from the row
// the store reads with the page (or alone, for GetAgent), its stream by
// the store clock now.
func agentToProto(a store.AgentRow, now time.Time) *musterv1.Agent {
	n, inst := a.Node, a.Instance
	p := &musterv1.Agent{NodeId: n.ID, JoinMethod: n.JoinMethod, TokenId: n.TokenID, InstanceId: n.InstanceID,
		CreatedAt: timestamppb.New(n.CreatedAt), UpdatedAt: timestamppb.New(n.UpdatedAt),
		Generation: inst.Generation, LastIssuedAt: timestamppb.New(inst.LastIssuedAt)}
	if !a.NotAfter.IsZero() {
		p.NotAfter = timestamppb.New(a.NotAfter)
	}
	if l := a.Lock; l != nil {
		p.Locked = fmt.Sprintf("%s (%s %s)", l.ID, l.Kind, l.Target)
	}
	if a.Stream != nil {
		p.Stream = streamToProto(*a.Stream, now)
	}
	if a.BoundKeypair != nil {
		// Nil when the token is gone (deleted): the node keeps its
		// identity.
		p.BoundKeypair = boundKeypairStatus(a.BoundKeypair)
	}
	return p
}

// GetAgent answers "what does this machine hold, since when, and how did it
// get it": the node, every instance that held its ID (also before a
// deletion), and every certificate issued under it.
func (a *adminService) GetAgent(ctx context.Context, req *musterv1.GetAgentRequest) (*musterv1.GetAgentResponse, error) {
	resp, err := a.getAgent(ctx, req.GetNodeId())
	err = toStatus(ctx, a.s.log, notFound(err, fmt.Sprintf("node %q", req.GetNodeId())))
	if status.Code(err) == codes.InvalidArgument {
		a.refused(ctx, "agent.get", req.GetNodeId(), err)
	}
	return resp, err
}

func (a *adminService) getAgent(ctx context.Context, nodeID string) (*musterv1.GetAgentResponse, error) {
	if err := badName("node", "node", nodeID, nodesListed); err != nil {
		return nil, err
	}
	resp := &musterv1.GetAgentResponse{}
	now, err := a.s.store.Now(ctx)
	if err != nil {
		return nil, err
	}
	row, err := a.s.store.GetAgentRow(ctx, nodeID)
	switch {
	case err == nil:
		resp.Agent = agentToProto(row, now)
	case !errors.Is(err, store.ErrNotFound):
		return nil, err
	}
	insts, err := a.s.store.ListInstances(ctx, nodeID)
	if err != nil {
		return nil, err
	}
	if resp.Agent == nil && len(insts) == 0 {
		return nil, fmt.Errorf("node %s: %w", nodeID, store.ErrNotFound)
	}
	for _, i := range insts {
		resp.Instances = append(resp.Instances, &musterv1.AgentInstance{Id: i.ID, State: i.State, JoinMethod: i.JoinMethod,
			TokenId: i.TokenID, PreviousId: i.PreviousID, Generation: i.Generation, CreatedAt: timestamppb.New(i.CreatedAt)})
	}
	certs, err := a.s.store.ListCertificates(ctx, nodeID)
	if err != nil {
		return nil, err
	}
	for _, c := range certs {
		resp.Certificates = append(resp.Certificates, &musterv1.AgentCertificate{Serial: c.Serial, InstanceId: c.InstanceID,
			Generation: c.Generation, JoinMethod: c.JoinMethod, TokenId: c.TokenID, PublicKeySha256: hex.EncodeToString(c.PublicKey),
			NotBefore: timestamppb.New(c.NotBefore), NotAfter: timestamppb.New(c.NotAfter), IssuedAt: timestamppb.New(c.IssuedAt)})
	}
	return resp, nil
}

func (a *adminService) DeleteAgent(ctx context.Context, req *musterv1.DeleteAgentRequest) (*musterv1.DeleteAgentResponse, error) {
	err := error(nil)
	if verr := badName("node", "node", req.GetNodeId(), nodesListed); verr != nil {
		err = verr
	} else {
		err = a.deleteAgent(ctx, req.GetNodeId())
	}
	if err != nil {
		err = toStatus(ctx, a.s.log, err)
		a.record(ctx, "agent.delete", req.GetNodeId(), err)
		return nil, err
	}
	return &musterv1.DeleteAgentResponse{}, nil
}

// deleteAgent deletes node id with its agent.delete record in the same
// transaction: a node whose deletion cannot be audited keeps its identity.
func (a *adminService) deleteAgent(ctx context.Context, id string) error {
	link, err := a.link(ctx, "agent.delete", id, "")
	if err != nil {
		return err
	}
	err = a.s.store.DeleteNode(ctx, id, link.Build)
	if errors.Is(err, store.ErrNotFound) {
		return notFound(err, fmt.Sprintf("node %q", id))
	}
	if err != nil {
		return fmt.Errorf("node %s not deleted: it is deleted with its audit record or not at all, and the write failed: %w", id, err)
	}
	a.s.audit.Appended(link)
	return nil
}

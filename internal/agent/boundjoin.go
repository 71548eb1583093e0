package agent

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/boundkeypair"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// JoinBoundKeypair runs the bound-keypair stream (DESIGN.md, join method
// 3): it sends init, signs the authority's challenge with key, and returns
// the result. It signs only a challenge addressed to authorityID, the
// authority the caller pinned, so an answer cannot be replayed to another.
func JoinBoundKeypair(ctx context.Context, c musterv1.JoinServiceClient, init *musterv1.BoundKeypairInit, key ed25519.PrivateKey, authorityID string) (*musterv1.BoundKeypairResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.RegisterUsingBoundKeypair(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&musterv1.RegisterUsingBoundKeypairRequest{Payload: &musterv1.RegisterUsingBoundKeypairRequest_Init{Init: init}}); err != nil {
		return nil, err
	}
	msg, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	ch, err := boundkeypair.ParseChallenge(msg.GetChallenge())
	if err != nil {
		return nil, err
	}
	if ch.Audience != authorityID {
		return nil, fmt.Errorf("agent: the challenge is for authority %.64q, not %s", ch.Audience, authorityID)
	}
	answer, err := boundkeypair.Answer(key, ch, time.Now())
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&musterv1.RegisterUsingBoundKeypairRequest{Payload: &musterv1.RegisterUsingBoundKeypairRequest_ChallengeResponse{
		ChallengeResponse: answer}}); err != nil {
		return nil, err
	}
	msg, err = stream.Recv()
	if err != nil {
		return nil, err
	}
	if msg.GetResult() == nil {
		return nil, errors.New("agent: the authority sent no result after the challenge")
	}
	return msg.GetResult(), nil
}

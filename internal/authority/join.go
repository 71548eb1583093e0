package authority

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/enroll"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// joinService serves the join methods that need a challenge exchange.
type joinService struct {
	musterv1.UnimplementedJoinServiceServer
	s *Server
}

// recoveriesGauge is muster_bound_keypair_recoveries_remaining{token}. A
// token name is chosen by an operator and bounded by the number of tokens;
// it is not a secret.
func newRecoveriesGauge(reg prometheus.Registerer) (*prometheus.GaugeVec, error) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "muster_bound_keypair_recoveries_remaining",
		Help: "Recoveries a standard-mode bound-keypair token has left, as of its last join or refresh on this replica.",
	}, []string{"token"})
	return g, reg.Register(g)
}

// RegisterUsingBoundKeypair runs one bound-keypair join over the stream:
// init, then one challenge, a second one for a new key when the key
// rotates, then the result. Every wait for the caller (init, an answer, a
// new key) is bounded by the challenge's lifetime, and the whole exchange
// by that and a little more, so a caller that never answers holds nothing
// for long: its stream ends DEADLINE_EXCEEDED, audited.
func (j *joinService) RegisterUsingBoundKeypair(stream musterv1.JoinService_RegisterUsingBoundKeypairServer) (err error) {
	// A short-lived stream: a deferred recovery costs it nothing that
	// lasts (recover.go).
	defer j.s.recovered(stream.Context(), musterv1.JoinService_RegisterUsingBoundKeypair_FullMethodName, &err)
	ttl := j.s.challengeTTL()
	ctx, cancel := context.WithTimeout(stream.Context(), ttl+10*time.Second)
	defer cancel()
	start := time.Now()
	recv := func() (*musterv1.RegisterUsingBoundKeypairRequest, error) { return recvWithin(ctx, stream, ttl) }
	first, err := recv()
	if errors.Is(err, enroll.ErrNotAnsweredInTime) {
		msg := fmt.Sprintf("no init within %s", ttl)
		j.s.refuseUnread(ctx, musterv1.JoinService_RegisterUsingBoundKeypair_FullMethodName, msg)
		return refused(codes.DeadlineExceeded, msg)
	}
	if errors.Is(err, io.EOF) {
		// A stream closed before init is a request, refused and audited
		// like one, not an error without a code.
		const msg = "the stream ended before init"
		j.s.refuseUnread(ctx, musterv1.JoinService_RegisterUsingBoundKeypair_FullMethodName, msg)
		return refused(codes.InvalidArgument, msg)
	}
	if err != nil {
		return err
	}
	init := first.GetInit()
	if init == nil {
		const msg = "the first message must be init"
		j.s.refuseUnread(ctx, musterv1.JoinService_RegisterUsingBoundKeypair_FullMethodName, msg)
		return refused(codes.InvalidArgument, msg)
	}
	exchange := func(ctx context.Context, challenge []byte) ([]byte, error) {
		if err := stream.Send(&musterv1.RegisterUsingBoundKeypairResponse{
			Payload: &musterv1.RegisterUsingBoundKeypairResponse_Challenge{Challenge: challenge}}); err != nil {
			return nil, exchangeErr(ctx, err)
		}
		msg, err := recv()
		if err != nil {
			return nil, exchangeErr(ctx, err)
		}
		if _, ok := msg.GetPayload().(*musterv1.RegisterUsingBoundKeypairRequest_ChallengeResponse); !ok {
			return nil, errNotAnAnswer
		}
		return []byte(msg.GetChallengeResponse()), nil
	}
	newKey := func(ctx context.Context) (string, error) {
		if err := stream.Send(&musterv1.RegisterUsingBoundKeypairResponse{
			Payload: &musterv1.RegisterUsingBoundKeypairResponse_NewKeyRequest{NewKeyRequest: true}}); err != nil {
			return "", exchangeErr(ctx, err)
		}
		msg, err := recv()
		if err != nil {
			return "", exchangeErr(ctx, err)
		}
		if _, ok := msg.GetPayload().(*musterv1.RegisterUsingBoundKeypairRequest_NewPublicKey); !ok {
			return "", errNotANewKey
		}
		return msg.GetNewPublicKey(), nil
	}
	res, err := j.s.enroll.RegisterUsingBoundKeypair(ctx, requestOf(ctx), enroll.BoundKeypairPayload{
		Token: init.GetToken(), NodeID: init.GetNodeId(), CSR: init.GetCsr(), JoinState: init.GetPreviousJoinState(),
		PublicKey: init.GetPublicKey(), RegistrationSecret: init.GetRegistrationSecret(), Cert: callerFrom(ctx).Cert,
		NewPublicKey: init.GetNewPublicKey(), NewKey: newKey,
	}, exchange)
	var iss *enroll.Issued
	if res != nil {
		iss = res.Issued
	}
	j.s.metrics.join(store.JoinMethodBoundKeypair, start, iss, err)
	if err != nil {
		return toStatus(ctx, j.s.log, err)
	}
	out := &musterv1.BoundKeypairResult{
		CertificateChainPem: string(res.ChainPEM), CaCertificatePem: res.CAPEM, InstanceId: res.InstanceID,
		Generation: res.Generation, JoinState: res.JoinState, AuthorityId: j.s.info.AuthorityID,
		TrustDomain: j.s.info.TrustDomain, RecoveriesRemaining: res.Remaining,
		VerifierSet: j.s.verifierSetOf(ctx, iss), BoundKeyFingerprint: res.BoundKey,
		TrustBundle: j.s.trustBundleProto(),
	}
	if a := j.s.advertise(); a != "" {
		out.Endpoints = []string{a}
	}
	return stream.Send(&musterv1.RegisterUsingBoundKeypairResponse{Payload: &musterv1.RegisterUsingBoundKeypairResponse_Result{Result: out}})
}

// exchangeErr is what ended a challenge exchange, as the domain judges it:
// a caller that went away (its stream's context cancelled) or did not
// finish in time wraps context's error, so it is answered and audited as a
// cancellation or a deadline rather than as a bad request; a stream the
// caller closed is the caller's bad request; anything else keeps only its
// message (a gRPC status from the transport says no more than that).
func exchangeErr(ctx context.Context, err error) error {
	if errors.Is(err, io.EOF) {
		return errStreamEnded
	}
	if errors.Is(err, enroll.ErrNotAnsweredInTime) {
		return err
	}
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("%w: %v", cerr, status.Convert(err).Message())
	}
	switch st := status.Convert(err); st.Code() {
	case codes.Canceled:
		return fmt.Errorf("%w: %s", context.Canceled, st.Message())
	case codes.DeadlineExceeded:
		return fmt.Errorf("%w: %s", context.DeadlineExceeded, st.Message())
	default:
		return errors.New(st.Message())
	}
}

var (
	errStreamEnded = errors.New("the stream ended first")
	errNotAnAnswer = errors.New("a challenge must be answered with challenge_response")
	errNotANewKey  = errors.New("new_key_request must be answered with new_public_key")
)

// challengeTTL is how long the caller of a bound-keypair exchange is
// waited for at each step.
func (s *Server) challengeTTL() time.Duration {
	return enroll.BoundKeypairConfig{ChallengeTTL: s.cfg.BoundKeypairChallengeTTL}.ChallengeLifetime()
}

// recvWithin is stream.Recv bounded by ctx and d. gRPC's Recv heeds only
// the stream's own context, which ends when the caller hangs up, so a
// caller that never sends would otherwise hold the handler (and its
// goroutines and buffers) for as long as it keeps the connection. On
// expiry the handler returns, which ends the stream and the Recv left
// waiting with it; nothing calls Recv again meanwhile.
func recvWithin(ctx context.Context, stream musterv1.JoinService_RegisterUsingBoundKeypairServer, d time.Duration) (*musterv1.RegisterUsingBoundKeypairRequest, error) {
	type received struct {
		msg *musterv1.RegisterUsingBoundKeypairRequest
		err error
	}
	got := make(chan received, 1)
	go func() {
		msg, err := stream.Recv()
		got <- received{msg, err}
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case r := <-got:
		return r.msg, r.err
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	case <-t.C:
		return nil, fmt.Errorf("%w: waited %s", enroll.ErrNotAnsweredInTime, d)
	}
}

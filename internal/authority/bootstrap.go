package authority

import (
	"context"
	"time"

	"github.com/muster-dev/muster/internal/enroll"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// maxRequestSize bounds every request message. gRPC refuses a larger one
// with RESOURCE_EXHAUSTED before unmarshalling it.
const maxRequestSize = 64 << 10

type bootstrapService struct {
	musterv1.UnimplementedBootstrapServiceServer
	s *Server
}

func requestOf(ctx context.Context) enroll.Request {
	c := callerFrom(ctx)
	return enroll.Request{Source: c.Source, CorrelationID: c.CorrelationID}
}

func (b *bootstrapService) GetTrustBundle(ctx context.Context, req *musterv1.GetTrustBundleRequest) (*musterv1.GetTrustBundleResponse, error) {
	jws, err := b.s.enroll.TrustBundle(ctx, requestOf(ctx), req.GetTokenId())
	if err != nil {
		return nil, toStatus(ctx, b.s.log, err)
	}
	return &musterv1.GetTrustBundleResponse{Jws: jws}, nil
}

func (b *bootstrapService) ExchangeJoinToken(ctx context.Context, req *musterv1.ExchangeJoinTokenRequest) (*musterv1.ExchangeJoinTokenResponse, error) {
	start := time.Now()
	iss, err := b.s.enroll.ExchangeJoinToken(ctx, requestOf(ctx), req.GetJoinToken(), req.GetNodeId(), req.GetCsr())
	b.s.metrics.join(store.JoinMethodToken, start, iss, err)
	if err != nil {
		return nil, toStatus(ctx, b.s.log, err)
	}
	return &musterv1.ExchangeJoinTokenResponse{
		CertificateChainPem: string(iss.ChainPEM),
		CaCertificatePem:    iss.CAPEM,
		Pkcs12:              iss.PKCS12,
		Pkcs12Password:      iss.PKCS12Password,
		InstanceId:          iss.InstanceID,
		Generation:          iss.Generation,
		AuthorityId:         b.s.info.AuthorityID,
		TrustDomain:         b.s.info.TrustDomain,
		VerifierSet:         b.s.verifierSet(ctx),
		TrustBundle:         b.s.trustBundleProto(),
	}, nil
}

type certificateService struct {
	musterv1.UnimplementedCertificateServiceServer
	s *Server
}

// RequestCertificate is a renewal for a caller with an agent certificate
// (authorize has checked it) and a PSK bootstrap for one without.
func (c *certificateService) RequestCertificate(ctx context.Context, req *musterv1.RequestCertificateRequest) (*musterv1.RequestCertificateResponse, error) {
	start := time.Now()
	var (
		iss *enroll.Issued
		err error
	)
	if cert := callerFrom(ctx).Cert; cert != nil {
		iss, err = c.s.enroll.Renew(ctx, requestOf(ctx), cert, req.GetCsr())
		c.s.metrics.renewal(start, iss, err)
	} else {
		iss, err = c.s.enroll.BootstrapWithPSK(ctx, requestOf(ctx), req.GetBootstrapPsk(), req.GetReferralTicket(), req.GetCsr())
		c.s.metrics.join(store.JoinMethodPSK, start, iss, err)
		// The join wrote its report to discovery in the store; wake the
		// delivery if this replica leads it.
		if err == nil && iss.TicketID != "" && c.s.discovery != nil {
			c.s.discovery.reportJoined()
		}
	}
	if err != nil {
		return nil, toStatus(ctx, c.s.log, err)
	}
	resp := &musterv1.RequestCertificateResponse{
		CertificateChainPem: string(iss.ChainPEM),
		CaCertificatePem:    iss.CAPEM,
		InstanceId:          iss.InstanceID,
		Generation:          iss.Generation,
		VerifierSet:         c.s.verifierSetOf(ctx, iss),
		TrustBundle:         c.s.trustBundleProto(),
	}
	if callerFrom(ctx).Cert == nil {
		if a := c.s.advertise(); a != "" {
			resp.Endpoints = []string{a}
		}
	}
	return resp, nil
}

package authority

import (
	"context"
	"errors"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/jwtsvid"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// MintJWTSVID signs a JWT-SVID for the calling agent, after the same
// standing checks as any agent RPC (a locked, deleted or superseded
// instance gets none). Mints are not audited one by one (workloads ask
// for tokens often, and a mint changes no state); refusals are, through
// the flood guard, and answer with the standing's reason.
func (a *agentService) MintJWTSVID(ctx context.Context, req *musterv1.MintJWTSVIDRequest) (*musterv1.MintJWTSVIDResponse, error) {
	c := callerFrom(ctx)
	if err := a.standing(ctx); err != nil {
		return nil, err
	}
	now := time.Now()
	iss := a.s.jwt.Load()
	tok, exp, err := iss.Mint(c.ID.String(), req.GetAudience(), now, c.Cert.NotAfter)
	if errors.Is(err, jwtsvid.ErrAudience) {
		return nil, a.badRequest(ctx, err.Error())
	} else if errors.Is(err, jwtsvid.ErrSalt) {
		// UNAVAILABLE: the agent retries, and gets a token once an
		// operator has rotated the damaged version away.
		method, _ := grpc.Method(ctx)
		return nil, a.s.deny(ctx, c, method, codes.Unavailable, "JWT-SVID not signed: "+a.s.jwtSaltWayOut(iss))
	} else if err != nil {
		return nil, toStatus(ctx, a.s.log, err)
	}
	jwks, err := iss.JWKS()
	if err != nil {
		return nil, toStatus(ctx, a.s.log, err)
	}
	return &musterv1.MintJWTSVIDResponse{Token: tok, ExpiresAt: timestamppb.New(exp), Jwks: jwks}, nil
}

// GetJWTBundle answers the JWKS of JWT-SVIDs.
func (a *agentService) GetJWTBundle(ctx context.Context, _ *musterv1.GetJWTBundleRequest) (*musterv1.GetJWTBundleResponse, error) {
	if err := a.standing(ctx); err != nil {
		return nil, err
	}
	iss := a.s.jwt.Load()
	jwks, err := iss.JWKS()
	if err != nil {
		return nil, toStatus(ctx, a.s.log, err)
	}
	resp := &musterv1.GetJWTBundleResponse{Jwks: jwks}
	if pf := a.s.publishedFor(iss); pf != nil {
		resp.PublishedFor = map[string]*durationpb.Duration{}
		for kid, d := range pf {
			resp.PublishedFor[kid] = durationpb.New(d)
		}
	}
	return resp, nil
}

// jwksPath is where the --crl-listen listener serves the JWKS to relying
// parties: public verification data, like the revocation lists, on the
// same plain-HTTP listener (the metrics listener is the operators').
const jwksPath = "/.well-known/jwks.json"

func (s *Server) jwksHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		jwks, err := s.jwt.Load().JWKS()
		if err != nil {
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/jwk-set+json")
		w.Header().Set("Cache-Control", "max-age=300")
		w.Write(jwks)
	})
}

// relyingPartyHandler is the --crl-listen listener's: revocation lists
// under /crl/ and the JWT-SVID keys at /.well-known/jwks.json.
func (s *Server) relyingPartyHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(jwksPath, s.jwksHandler())
	mux.Handle("/", s.crlHandler())
	return mux
}

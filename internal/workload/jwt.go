package workload

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	spiffejwt "github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/muster-dev/muster/internal/jwtsvid"
)

// jwksMaxAge is how long the server reuses the JWKS it fetched, for
// validation; FetchJWTBundles streams look again as often.
var jwksMaxAge = time.Minute

// jwksRetry is how soon a failed fetch is tried again while the keys
// fetched before are served.
const jwksRetry = 10 * time.Second

// minKeyPublished is how long after a fetch a key is used that the
// authority did not say how long it keeps publishing (an older
// authority): the minimum rotation period (a JWT-SVID's lifetime and a
// minute), the least time between two rotations.
const minKeyPublished = jwtsvid.TTL + time.Minute

func (s *Server) noJWT() error {
	return status.Error(codes.Unimplemented, "workload api: JWT-SVIDs are not served by this agent")
}

// authorityError reports a failure to reach the authority, or its refusal
// of the node (locked, deleted, superseded) as PERMISSION_DENIED: the
// workload is told the node is not entitled to it, not to retry a
// connection that works.
func authorityError(what string, err error) error {
	if st, ok := status.FromError(err); ok && st.Code() == codes.PermissionDenied {
		return status.Errorf(codes.PermissionDenied, "workload api: %s: the authority refused this node: %s", what, st.Message())
	}
	return status.Errorf(codes.Unavailable, "workload api: %s: %v", what, err)
}

// FetchJWTSVID mints (or reuses) a JWT-SVID of the node for the audiences.
func (s *Server) FetchJWTSVID(ctx context.Context, req *workloadpb.JWTSVIDRequest) (*workloadpb.JWTSVIDResponse, error) {
	if s.cfg.JWT == nil {
		return nil, s.noJWT()
	}
	if len(req.GetAudience()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "audience must be specified")
	}
	snap, _ := s.src.Current()
	if snap == nil {
		return nil, status.Error(codes.Unavailable, "workload api: the agent has no identity yet")
	}
	if id := req.GetSpiffeId(); id != "" && id != snap.ID {
		err := status.Errorf(codes.PermissionDenied, "workload api: this agent serves only %s; ask for it, or leave spiffe_id empty", snap.ID)
		s.refused("other_spiffe_id", callerCreds(ctx), err)
		return nil, err
	}
	tok, _, err := s.cfg.JWT.JWTSVID(ctx, req.GetAudience())
	if status.Code(err) == codes.InvalidArgument {
		return nil, err
	} else if err != nil {
		return nil, authorityError("minting a JWT-SVID", err)
	}
	return &workloadpb.JWTSVIDResponse{Svids: []*workloadpb.JWTSVID{{SpiffeId: snap.ID, Svid: tok}}}, nil
}

// jwksNow returns the JWKS, fetched again once older than jwksMaxAge, or,
// after a fetch that failed, jwksRetry after it.
func (s *Server) jwksNow(ctx context.Context) ([]byte, error) {
	s.jwksMu.Lock()
	defer s.jwksMu.Unlock()
	reuse := jwksMaxAge
	if s.jwksErr != nil {
		reuse = jwksRetry
	}
	if s.jwks != nil && s.now().Sub(s.jwksAsked) < reuse {
		return s.jwks, nil
	}
	jwks, err := s.fetchJWKS(ctx)
	if err != nil {
		if s.jwks != nil {
			// The authority unreachable: the keys we had (as long as
			// keyUsable lets them be used), and the next try in
			// jwksRetry, so callers queued on jwksMu do not each wait
			// for a fetch of their own.
			return s.jwks, nil
		}
		return nil, err
	}
	return jwks, nil
}

// fetchJWKS asks the authority for the JWKS, records the attempt
// (jwksAsked, jwksErr) and, when it answered, makes its JWKS the one held,
// with when each key may leave the authority's JWKS. Called with jwksMu
// held.
//
// The authority says how long from its answer it keeps publishing each
// key (published_for): a duration, which this agent counts on its own
// clock from when it asked, so neither clock's date matters (an agent
// minutes apart from the authority stops when the authority's schedule
// says, not minutes early or late), and the answer's time in transit
// (up to the agent's call timeout) shortens the time rather than
// lengthening it.
func (s *Server) fetchJWKS(ctx context.Context) ([]byte, error) {
	asked := s.now()
	jwks, publishedFor, err := s.cfg.JWT.JWTBundle(ctx)
	s.jwksAsked, s.jwksErr = s.now(), err
	if err != nil {
		return nil, err
	}
	s.jwks, s.jwksGot = jwks, asked
	s.jwksUntil = make(map[string]time.Time, len(publishedFor))
	for kid, d := range publishedFor {
		s.jwksUntil[kid] = asked.Add(d)
	}
	close(s.jwksFresh)
	s.jwksFresh = make(chan struct{})
	return jwks, nil
}

// keyUntil is until when the key kid of the JWKS held may be used (the
// authority's published_for, counted from the fetch; the minimum
// rotation period for a key it named no time for). The copy held is good
// for jwksMaxAge in any case: the authority published every key in it
// then, and the copy is that old at most while the authority answers.
// Called with jwksMu held.
func (s *Server) keyUntil(kid string) time.Time {
	until, ok := s.jwksUntil[kid]
	if !ok {
		until = s.jwksGot.Add(minKeyPublished)
	}
	return later(until, s.jwksGot.Add(jwksMaxAge))
}

// keyUsable refuses a key of the JWKS held that the authority may have
// unpublished since it was fetched (keyUntil): an agent that cannot reach
// the authority (down, or refusing this node) would otherwise validate
// with it forever, also after a rotation retired it (a leaked key
// included).
func (s *Server) keyUsable(kid string) error {
	s.jwksMu.Lock()
	defer s.jwksMu.Unlock()
	until := s.keyUntil(kid)
	if s.now().Before(until) {
		return nil
	}
	why := "no answer"
	if s.jwksErr != nil {
		why = s.jwksErr.Error()
	}
	return status.Errorf(codes.Unavailable,
		"workload api: the agent has not reached the authority since %s (%s), and the key %q the JWT-SVID names may have left the authority's JWKS at %s (its rotation schedule): not validated with it until the authority answers",
		s.jwksGot.UTC().Format(time.RFC3339), why, kid, until.UTC().Format(time.RFC3339))
}

// usableJWKS is the JWKS held without the keys keyUsable refuses now,
// when the first of the keys left stops being usable (zero: none left),
// and a channel closed at the next fetch that answers.
func (s *Server) usableJWKS() ([]byte, time.Time, <-chan struct{}, error) {
	s.jwksMu.Lock()
	defer s.jwksMu.Unlock()
	now := s.now()
	var next time.Time
	jwks, err := filterJWKS(s.jwks, func(kid string) bool {
		until := s.keyUntil(kid)
		if !now.Before(until) {
			return false
		}
		if next.IsZero() || until.Before(next) {
			next = until
		}
		return true
	})
	return jwks, next, s.jwksFresh, err
}

// filterJWKS is jwks with only the keys keep keeps, each as the
// authority wrote it; jwks itself when it keeps them all.
func filterJWKS(jwks []byte, keep func(kid string) bool) ([]byte, error) {
	var set map[string]json.RawMessage
	if err := json.Unmarshal(jwks, &set); err != nil {
		return nil, fmt.Errorf("the authority's JWKS: %w", err)
	}
	var keys []json.RawMessage
	if err := json.Unmarshal(set["keys"], &keys); err != nil {
		return nil, fmt.Errorf("the authority's JWKS: keys: %w", err)
	}
	kept := make([]json.RawMessage, 0, len(keys))
	for _, k := range keys {
		var id struct {
			KeyID string `json:"kid"`
		}
		if err := json.Unmarshal(k, &id); err != nil {
			return nil, fmt.Errorf("the authority's JWKS: a key: %w", err)
		}
		if keep(id.KeyID) {
			kept = append(kept, k)
		}
	}
	if len(kept) == len(keys) {
		return jwks, nil
	}
	raw, err := json.Marshal(kept)
	if err != nil {
		return nil, err
	}
	set["keys"] = raw
	return json.Marshal(set)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// jwksAgain fetches the JWKS now, for a token whose key the one held
// does not have: the authority published it since (the JWKS held is
// stale: the authority was unreachable through rotations), or it is no
// key of the authority's. At most one fetch per jwksRetry, so tokens
// naming made-up keys cost the authority nothing more; within it, the
// last fetch's answer.
func (s *Server) jwksAgain(ctx context.Context) ([]byte, error) {
	s.jwksMu.Lock()
	defer s.jwksMu.Unlock()
	if s.now().Sub(s.jwksAsked) < jwksRetry {
		return s.jwks, s.jwksErr
	}
	return s.fetchJWKS(ctx)
}

// keyID is the kid in a JWT-SVID's header, "" if it has none or is no
// ES256 JWT (the authority signs only those; the validation refuses it).
func keyID(token string) string {
	sig, err := jose.ParseSignedCompact(token, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil || len(sig.Signatures) != 1 {
		return ""
	}
	return sig.Signatures[0].Header.KeyID
}

// FetchJWTBundles streams the trust domain's JWKS, again when it changes.
// It holds the same keys ValidateJWTSVID validates with: a key past its
// time (keyUntil: the agent cut off from the authority beyond what the
// authority said it keeps publishing the key) is sent no more, in a JWKS
// without it (an empty one when no key is left), and sent again once a
// fetch that answers brings it back. A stream ended with an error would
// not do: go-spiffe's client retries the stream and its source keeps the
// last JWKS it received, so its workload would go on trusting the key;
// a JWKS without it replaces that one.
func (s *Server) FetchJWTBundles(_ *workloadpb.JWTBundlesRequest, stream workloadpb.SpiffeWorkloadAPI_FetchJWTBundlesServer) error {
	if s.cfg.JWT == nil {
		return s.noJWT()
	}
	ctx := stream.Context()
	var last []byte
	for {
		snap, changed := s.src.Current()
		wait := jwksMaxAge
		var fresh <-chan struct{}
		if snap != nil {
			if _, err := s.jwksNow(ctx); err != nil {
				// Only before any JWKS was fetched: after, jwksNow
				// answers with the one held.
				return authorityError("fetching the JWT bundle", err)
			}
			jwks, next, f, err := s.usableJWKS()
			if err != nil {
				return status.Errorf(codes.Internal, "workload api: %v", err)
			}
			fresh = f
			if last == nil || !bytes.Equal(jwks, last) {
				if err := sendWithin(stream.Send, &workloadpb.JWTBundlesResponse{Bundles: map[string][]byte{"spiffe://" + snap.TrustDomain: jwks}}, s.cfg.SendTimeout); err != nil {
					return err
				}
				last = jwks
			}
			if !next.IsZero() {
				wait = min(wait, next.Sub(s.now()))
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-fresh:
		case <-s.after(wait):
		}
	}
}

// ValidateJWTSVID checks a JWT-SVID of this trust domain against the
// authority's keys and the audience.
func (s *Server) ValidateJWTSVID(ctx context.Context, req *workloadpb.ValidateJWTSVIDRequest) (*workloadpb.ValidateJWTSVIDResponse, error) {
	if s.cfg.JWT == nil {
		return nil, s.noJWT()
	}
	if req.GetAudience() == "" {
		return nil, status.Error(codes.InvalidArgument, "audience must be specified")
	}
	if req.GetSvid() == "" {
		return nil, status.Error(codes.InvalidArgument, "svid must be specified")
	}
	snap, _ := s.src.Current()
	if snap == nil {
		return nil, status.Error(codes.Unavailable, "workload api: the agent has no identity yet")
	}
	td, err := spiffeid.TrustDomainFromString(snap.TrustDomain)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "workload api: %v", err)
	}
	jwks, err := s.jwksNow(ctx)
	if err != nil {
		return nil, authorityError("fetching the JWT bundle", err)
	}
	b, err := jwtbundle.Parse(td, jwks)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "workload api: the authority's JWKS: %v", err)
	}
	kid := keyID(req.GetSvid())
	if kid != "" && !b.HasJWTAuthority(kid) {
		// Not known to be invalid: a JWKS this agent could not refresh
		// lacks the keys published since. UNAVAILABLE, which a caller
		// retries, unless the authority's JWKS lacks it too.
		jwks, err := s.jwksAgain(ctx)
		if err != nil {
			return nil, authorityError(fmt.Sprintf("the JWT bundle held has no key %q; fetching it again", kid), err)
		}
		if b, err = jwtbundle.Parse(td, jwks); err != nil {
			return nil, status.Errorf(codes.Internal, "workload api: the authority's JWKS: %v", err)
		}
	}
	if kid != "" && b.HasJWTAuthority(kid) {
		if err := s.keyUsable(kid); err != nil {
			return nil, err
		}
	}
	svid, err := spiffejwt.ParseAndValidate(req.GetSvid(), b, []string{req.GetAudience()})
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	claims, err := structpb.NewStruct(svid.Claims)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "workload api: claims: %v", err)
	}
	return &workloadpb.ValidateJWTSVIDResponse{SpiffeId: svid.ID.String(), Claims: claims}, nil
}

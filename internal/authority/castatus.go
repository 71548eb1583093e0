package authority

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/trustbundle"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// caStatusPage is how many agents GetCAStatus reads at once to count who
// holds each certificate.
const caStatusPage = 1000

// GetCAStatus lists every CA certificate (the root, every intermediate of
// the store with its state, the cross-certificates of the bundle) and how
// many connected agents (on any replica: their last heartbeat, as the
// store keeps it) hold a bundle that includes it.
func (a *adminService) GetCAStatus(ctx context.Context, _ *musterv1.GetCAStatusRequest) (*musterv1.GetCAStatusResponse, error) {
	resp, err := a.s.caStatus(ctx)
	if err != nil {
		return nil, toStatus(ctx, a.s.log, err)
	}
	return resp, nil
}

func (s *Server) caStatus(ctx context.Context) (*musterv1.GetCAStatusResponse, error) {
	rows, err := s.store.ListCACerts(ctx)
	if err != nil {
		return nil, err
	}
	now, err := s.store.Now(ctx)
	if err != nil {
		return nil, err
	}
	h, err := s.countBundleHolders(ctx, now)
	if err != nil {
		return nil, err
	}
	b := s.trustBundle()
	resp := &musterv1.GetCAStatusResponse{RootKeyOnline: s.ca.Roots().SigningKey != nil, ConnectedAgents: h.connected, AwayAgents: h.away, BundleDigest: b.digest}
	entry := func(kind, role, state, where string, c *x509.Certificate) *musterv1.CACertificateStatus {
		f := trustbundle.CertFingerprint(c)
		return &musterv1.CACertificateStatus{Kind: kind, Role: role, State: state, Serial: c.SerialNumber.Text(16),
			NotBefore: timestamppb.New(c.NotBefore), NotAfter: timestamppb.New(c.NotAfter), Subject: c.Subject.String(),
			AgentsHolding: h.holding[f], AgentsAwayHolding: h.awayHolding[f], Fingerprint: f, KeyCustody: where}
	}
	rot, err := s.store.GetRootRotation(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range b.set.Roots {
		resp.Certificates = append(resp.Certificates, entry("root", "", store.CAActive, s.rootCustody(rot, r), r))
	}
	if w := newRootNotHeld(rot, h); w != "" {
		resp.Warnings = append(resp.Warnings, w)
	}
	for _, r := range rows {
		c, err := x509.ParseCertificate(r.CertDER)
		if err != nil {
			return nil, fmt.Errorf("%s intermediate %s: %w", r.Role, r.Serial, err)
		}
		where := custody.Where(r.KeyRef)
		switch {
		case len(r.KeyRef) == 0:
			// Retired (or discarded), and its key destroyed: the
			// reference left the store with its ca.destroy_key record.
			where = "destroyed"
		case r.State == store.CARetired:
			// Its destruction failed or is under way; the leader's
			// clock takes it again.
			where = "destroy pending: " + where
		}
		if custody.IsPKCS11Ref(r.KeyRef) && r.State != store.CARetired && s.inter != nil {
			// The URI alone would say the key is there: look the object
			// up (no signature), one lookup per key in the token.
			if _, err := s.inter.custody.Signer(ctx, keyName(r.Role, r.Serial), custody.Key{Public: c.PublicKey, Ref: r.KeyRef}); errors.Is(err, custody.ErrKeyMissing) {
				where = "missing: " + where
				resp.Warnings = append(resp.Warnings, missingKeyWarning(r, s.inter.lostKeyWayOut(r.Role, r.State)))
			}
		}
		resp.Certificates = append(resp.Certificates, entry("intermediate", r.Role, r.State, where, c))
		if r.State != store.CAActive {
			continue
		}
		if w := s.rotationBlocked(ca.Role(r.Role), c, hasPrepared(rows, r.Role), now); w != "" {
			resp.Warnings = append(resp.Warnings, w)
		}
	}
	for _, c := range b.set.Cross {
		resp.Certificates = append(resp.Certificates, entry("cross", "", store.CAActive, "", c))
	}
	return resp, nil
}

// rootCustody says where root c's key is: where the root rotation's
// record keeps it (sealed or a token object) for a root a rotation made
// or stored, "file" for the data directory's root with its key there,
// "offline" otherwise.
func (s *Server) rootCustody(rot store.RootRotation, c *x509.Certificate) string {
	switch {
	case rot.NewCertDER != nil && bytes.Equal(rot.NewCertDER, c.Raw) && rot.NewKeyRef != nil:
		return custody.Where(rot.NewKeyRef)
	case rot.OldCertDER != nil && bytes.Equal(rot.OldCertDER, c.Raw) && rot.OldKeyRef != nil:
		return custody.Where(rot.OldKeyRef)
	case s.ca.RootKey != nil && s.ca.Root != nil && s.ca.Root.Equal(c):
		return "file"
	}
	return "offline"
}

// missingKeyWarning says what a key gone from the token means for its
// intermediate, and the way out when there is one to take.
func missingKeyWarning(r store.CACert, wayOut string) string {
	if r.State == store.CARetiring {
		return fmt.Sprintf("the retiring %s intermediate %s's key is missing from the token: it stays in the trust bundle until it retires and signs nothing; its revocation list is no longer renewed (docs/hsm.md \"A lost token\")", r.Role, r.Serial)
	}
	return fmt.Sprintf("the %s %s intermediate %s's key is missing from the token: %s", r.State, r.Role, r.Serial, wayOut)
}

func hasPrepared(rows []store.CACert, role string) bool {
	for _, r := range rows {
		if r.Role == role && r.State == store.CAPrepared {
			return true
		}
	}
	return false
}

// bundleHolders counts, among agents connected and away, how many
// reported holding each certificate (by trustbundle.CertFingerprint).
type bundleHolders struct {
	connected, away      int64
	holding, awayHolding map[string]int64
}

// countBundleHolders reads every agent's stream row and counts, among the
// ones connected at now by the store clock (streamLive: not a killed
// replica's rows), how many reported holding each certificate; and the
// same among agents away (seen before, not live now, their latest
// certificate still valid: expected back), from their last heartbeat.
func (s *Server) countBundleHolders(ctx context.Context, now time.Time) (bundleHolders, error) {
	h := bundleHolders{holding: map[string]int64{}, awayHolding: map[string]int64{}}
	after := ""
	for {
		page, err := s.store.ListAgentsPage(ctx, after, caStatusPage)
		if err != nil {
			return bundleHolders{}, err
		}
		for _, r := range page {
			if r.Stream == nil {
				continue
			}
			held := h.holding
			switch {
			case streamLive(r.Stream, now):
				h.connected++
			case r.NotAfter.After(now):
				h.away++
				held = h.awayHolding
			default:
				continue
			}
			var hb heartbeatJSON
			if json.Unmarshal([]byte(r.Stream.Report), &hb) != nil {
				continue
			}
			for _, f := range hb.TrustBundleCerts {
				held[f]++
			}
		}
		if len(page) < caStatusPage {
			return h, nil
		}
		after = page[len(page)-1].Node.ID
	}
}

// newRootNotHeld is the warning, during a root rotation, about the agents
// that have not reported holding its new root: connected and away (their
// last heartbeat), since an agent away through the overlap comes back to
// a standby it cannot follow. "" with no rotation or none behind.
func newRootNotHeld(rot store.RootRotation, h bundleHolders) string {
	if rot.NewCertDER == nil || rot.Phase == store.RootPhaseStandby {
		return ""
	}
	c, err := x509.ParseCertificate(rot.NewCertDER)
	if err != nil {
		return ""
	}
	f := trustbundle.CertFingerprint(c)
	connected, away := h.connected-h.holding[f], h.away-h.awayHolding[f]
	if connected <= 0 && away <= 0 {
		return ""
	}
	return fmt.Sprintf("root rotation in %s: %d of %d connected agents and %d of %d agents away (seen before, certificate still valid) have not reported holding the new root %s; the step to standby waits for them and names them, and an agent away through it must join again by hand",
		rot.Phase, max(connected, 0), h.connected, max(away, 0), h.away, f)
}

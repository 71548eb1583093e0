package discovery

import (
	"crypto"
	"crypto/x509"
	"errors"
	"time"

	"github.com/muster-dev/muster/internal/spiffeid"
)

// JoinReport tells discovery that a referral ticket led to a real join.
// Daily quotas count these, never tickets handed out, so nobody can use a
// quota up by asking. InstanceID identifies the join: a replayed report is
// counted once.
type JoinReport struct {
	AuthorityID string
	NodeID      string
	InstanceID  string
	TicketID    string
	JoinedAt    time.Time
}

// Document returns the canonical JSON the signature covers.
func (r JoinReport) Document() ([]byte, error) {
	if !validUTF8(r.AuthorityID, r.NodeID, r.InstanceID, r.TicketID) {
		return nil, errors.New("discovery: join report: a field is not valid UTF-8")
	}
	return canonical(struct {
		Type        string `json:"type"`
		AuthorityID string `json:"authority_id"`
		NodeID      string `json:"node_id"`
		InstanceID  string `json:"instance_id"`
		TicketID    string `json:"ticket_id"`
		JoinedAt    string `json:"joined_at"`
	}{TypeJoinReport, r.AuthorityID, r.NodeID, r.InstanceID, r.TicketID, r.JoinedAt.UTC().Format(time.RFC3339Nano)})
}

// Sign signs the report with the policy signing key.
func (r JoinReport) Sign(key crypto.Signer) ([]byte, error) {
	doc, err := r.Document()
	if err != nil {
		return nil, err
	}
	return sign(key, doc)
}

// Verify checks the report's fields and its signature by the policy
// signing certificate registered for the authority.
func (r JoinReport) Verify(policyCert *x509.Certificate, sig []byte) error {
	if err := spiffeid.NameError("node ID", "node", r.NodeID); err != nil {
		return errors.New("discovery: join report: " + err.Error())
	}
	if r.InstanceID == "" || len(r.InstanceID) > 64 || len(r.TicketID) > 128 {
		return errors.New("discovery: join report: instance_id is required (at most 64 characters), ticket_id at most 128")
	}
	if r.JoinedAt.IsZero() {
		return errors.New("discovery: join report: joined_at is required")
	}
	doc, err := r.Document()
	if err != nil {
		return err
	}
	return verify(policyCert, doc, sig)
}

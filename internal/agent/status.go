package agent

import (
	"os"
	"time"
)

// Status is what `muster agent status` shows.
type Status struct {
	NodeID      string     `json:"node_id"`
	SPIFFEID    string     `json:"spiffe_id"`
	InstanceID  string     `json:"instance_id"`
	AuthorityID string     `json:"authority_id"`
	TrustDomain string     `json:"trust_domain"`
	Authority   string     `json:"authority"`
	Generation  int64      `json:"generation"`
	JoinMethod  string     `json:"join_method"`
	JoinedAt    time.Time  `json:"joined_at"`
	LastRenewal *time.Time `json:"last_renewal"`
	NotAfter    time.Time  `json:"not_after"`
	Serial      string     `json:"serial"`
	Expired     bool       `json:"expired"`
	// RenewalPending is set while a renewal's key waits for its
	// certificate (the last attempt failed or was interrupted).
	RenewalPending bool `json:"renewal_pending"`
}

// Status reads the identity without changing anything; ErrNoIdentity if
// the agent has not joined.
func (a *Agent) Status() (*Status, error) {
	st, id, err := a.load(false)
	if err != nil {
		return nil, err
	}
	leaf := id.Leaf()
	sid, _ := id.ID()
	_, pendErr := os.Stat(a.dir.PendingKeyFile())
	return &Status{
		NodeID: st.NodeID, SPIFFEID: sid.String(), InstanceID: st.InstanceID, AuthorityID: st.AuthorityID,
		TrustDomain: st.TrustDomain, Authority: a.address(st), Generation: st.Generation, JoinMethod: st.JoinMethod,
		JoinedAt: st.JoinedAt, LastRenewal: st.LastRenewal, NotAfter: leaf.NotAfter.UTC(), Serial: serialOf(leaf),
		Expired: !a.now().Before(leaf.NotAfter), RenewalPending: pendErr == nil,
	}, nil
}

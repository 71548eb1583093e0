package agent

import (
	"os"
)

// Status is what `muster agent status` shows: the state, with the address
// renewals go to now and the certificate's own view, and what the agent
// can tell without asking anyone.
type Status struct {
	State
	SPIFFEID string `json:"spiffe_id"`
	Expired  bool   `json:"expired"`
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
	view := *st
	view.Authority, view.NotAfter, view.Serial = a.address(st), leaf.NotAfter.UTC(), serialOf(leaf)
	return &Status{State: view, SPIFFEID: sid.String(), Expired: !a.now().Before(leaf.NotAfter),
		RenewalPending: pendErr == nil}, nil
}

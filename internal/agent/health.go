package agent

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// nearExpiry is the share of a certificate's lifetime under which /readyz
// fails. The agent renews at about half of the lifetime, so an identity
// with less than a quarter left means renewals have failed for a long
// while: the machine will lose its identity unless someone acts.
const nearExpiry = 4 // remaining < lifetime/nearExpiry

// health is what /readyz reads: the validity window of the identity the
// agent last loaded, joined or renewed. Safe for concurrent use.
type health struct {
	mu               sync.Mutex
	issued, notAfter time.Time
}

// observe records the identity in st. The start of the window is the last
// renewal, or the join: the times the agent itself recorded, so no
// certificate needs parsing here.
func (h *health) observe(st *State) {
	issued := st.JoinedAt
	if st.LastRenewal != nil {
		issued = *st.LastRenewal
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.issued, h.notAfter = issued, st.NotAfter
}

var errNotReady = errors.New("no identity yet")

// ready is nil while the identity is valid at now and more than
// 1/nearExpiry of its lifetime remains.
func (h *health) ready(now time.Time) error {
	h.mu.Lock()
	issued, notAfter := h.issued, h.notAfter
	h.mu.Unlock()
	switch {
	case notAfter.IsZero():
		return errNotReady
	case !now.Before(notAfter):
		return fmt.Errorf("identity expired at %s", notAfter.UTC().Format(time.RFC3339))
	case notAfter.Sub(now) < notAfter.Sub(issued)/nearExpiry:
		return fmt.Errorf("identity expires at %s and has not been renewed", notAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

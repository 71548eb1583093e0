// Package workload serves the SPIFFE Workload API on the agent's Unix
// socket (docs/workload-api.md): the node's X.509-SVID and the trust
// domain's bundle, pushed to every open stream when they change.
//
// Callers are admitted by their Unix credentials (SO_PEERCRED) against an
// allow-list of UIDs and GIDs; there is no other workload attestation.
package workload

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
)

// Snapshot is what the Workload API serves at one time: the agent's
// X.509-SVID (leaf and intermediates, without a root), its key, and the
// trusted roots of its trust domain.
type Snapshot struct {
	ID          string
	TrustDomain string
	Chain       []*x509.Certificate
	Key         crypto.Signer
	Roots       []*x509.Certificate
}

// same reports whether s and o carry the same certificates (a key changes
// only with its certificate).
func (s *Snapshot) same(o *Snapshot) bool {
	if s == nil || o == nil {
		return s == o
	}
	return sameCerts(s.Chain, o.Chain) && sameCerts(s.Roots, o.Roots)
}

func sameCerts(a, b []*x509.Certificate) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i].Raw, b[i].Raw) {
			return false
		}
	}
	return true
}

// Source holds the current Snapshot and tells watchers when it changes.
// The identity and the trusted roots are read in one place, the load
// function (the agent's data directory: certs/agent.crt, agent.key and
// ca.crt); Reload is how the agent's renewal path, the file watcher and a
// trust bundle update say they may have changed.
type Source struct {
	load func() (*identity.Identity, error)
	log  *slog.Logger

	mu      sync.Mutex
	cur     *Snapshot
	changed chan struct{}
	// lastErr keeps a failing load from logging on every event.
	lastErr string
	// now is the clock Reload judges expiry by (time.Now; tests set it,
	// as they set the Server's, so both judge a certificate alike).
	now func() time.Time
}

// NewSource returns a source reading with load; it holds nothing until
// the first Reload.
func NewSource(load func() (*identity.Identity, error), log *slog.Logger) *Source {
	return &Source{load: load, log: log, changed: make(chan struct{}), now: time.Now}
}

// Current returns the snapshot (nil before the agent has an identity) and
// a channel closed at the next change.
func (s *Source) Current() (*Snapshot, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur, s.changed
}

// Reload reads the identity again and, if its certificates or roots
// changed, makes it current and wakes every watcher. A load that fails
// (no identity yet, a renewal half written) keeps the current snapshot:
// the write that completes it brings another Reload. An expired
// certificate is never made current: an agent started with one either
// exits (a token agent) or recovers (a bound-keypair one, whose recovery
// reloads), and meanwhile streams wait rather than get an SVID no peer
// accepts.
func (s *Source) Reload() {
	id, err := s.load()
	var snap *Snapshot
	if err == nil {
		snap, err = snapshotOf(id)
	}
	if err == nil && !s.now().Before(snap.Chain[0].NotAfter) {
		snap, err = nil, fmt.Errorf("the certificate expired at %s", snap.Chain[0].NotAfter.UTC().Format(time.RFC3339))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if msg := err.Error(); msg != s.lastErr {
			s.lastErr = msg
			s.log.Debug("workload api: identity not loaded; serving the previous one", "err", err)
		}
		return
	}
	s.lastErr = ""
	if snap.same(s.cur) {
		return
	}
	s.cur = snap
	close(s.changed)
	s.changed = make(chan struct{})
	s.log.Info("workload api: identity loaded", "spiffe_id", snap.ID, "not_after", snap.Chain[0].NotAfter, "roots", len(snap.Roots))
}

func snapshotOf(id *identity.Identity) (*Snapshot, error) {
	sid, err := spiffeid.FromCertificate(id.Leaf())
	if err != nil {
		return nil, err
	}
	return &Snapshot{ID: sid.String(), TrustDomain: sid.TrustDomain, Chain: id.Chain, Key: id.Key, Roots: id.Roots}, nil
}

// debounce is how long Watch waits after a file event for the rest of a
// multi-file write before it reloads.
const debounce = 50 * time.Millisecond

// Watch reloads whenever a file in dir (the agent's certs/) changes, until
// ctx ends: a renewal by another process (muster agent renew) or a
// trust bundle written beside the identity. The agent's own renewals
// call Reload directly.
func (s *Source) Watch(ctx context.Context, dir string) {
	events := make(chan struct{}, 1)
	go watchDir(ctx, dir, events, s.log)
	var timer <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-events:
			timer = time.After(debounce)
		case <-timer:
			timer = nil
			s.Reload()
		}
	}
}

// notify signals ch without blocking.
func notify(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

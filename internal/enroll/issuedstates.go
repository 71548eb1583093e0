package enroll

import (
	"crypto/sha256"
	"sync"

	"github.com/muster-dev/muster/internal/boundkeypair"
)

// maxIssuedStates bounds the join state documents remembered: a hash and
// the claims, a few hundred bytes each, so a few MiB at most.
const maxIssuedStates = 1 << 13

// issuedStates remembers, by their SHA-256, the join state documents this
// process signed, with their claims. An agent presents the document it
// was last given, so most joins present one of these: the same bytes this
// process signed need no signature verification (one Ed25519 verification
// and a JWT parse per recovery, measured as a fifth of the bound-keypair
// handler's own work). A miss (another replica signed it, a restart, an
// evicted entry) is verified as before. Only the hash and the claims are
// kept, never the document. Safe for concurrent use.
type issuedStates struct {
	mu    sync.Mutex
	byKey map[[sha256.Size]byte]boundkeypair.JoinState
	order [][sha256.Size]byte // insertion order, for eviction
	next  int                 // the oldest entry once order is full
}

func (m *issuedStates) add(doc string, js boundkeypair.JoinState) {
	sum := sha256.Sum256([]byte(doc))
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byKey == nil {
		m.byKey = make(map[[sha256.Size]byte]boundkeypair.JoinState)
	}
	if _, ok := m.byKey[sum]; ok {
		return
	}
	if len(m.order) < maxIssuedStates {
		m.order = append(m.order, sum)
	} else {
		delete(m.byKey, m.order[m.next])
		m.order[m.next] = sum
		m.next = (m.next + 1) % maxIssuedStates
	}
	m.byKey[sum] = js
}

// lookup returns the claims of doc if this process signed exactly doc.
func (m *issuedStates) lookup(doc string) (boundkeypair.JoinState, bool) {
	sum := sha256.Sum256([]byte(doc))
	m.mu.Lock()
	defer m.mu.Unlock()
	js, ok := m.byKey[sum]
	return js, ok
}

package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"database/sql"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/agent"
	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/errinfo"
	"github.com/muster-dev/muster/internal/identity"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// crashBot is one bound-keypair client of TestAuthorityCrashConsistency. It
// behaves as the agent does: one exchange at a time; a failed exchange
// keeps its CSR key (so the retry of a lost reply is recognised) and its
// pending rotation key (offered again); a rotation's key becomes the
// current one only when a result names it bound.
type crashBot struct {
	name string
	n    int

	mu       sync.Mutex
	offered  map[string]bool // every key offered, authorized_keys form
	current  ed25519.PrivateKey
	next     ed25519.PrivateKey // offered for rotation, not yet seen bound
	state    string             // the last join state received
	id       *identity.Identity // the last certificate, for refreshes
	csrKey   *ecdsa.PrivateKey  // kept after a failure
	csr      []byte
	locked   bool
	outcomes map[string]int
}

func publicKeyOf(t *testing.T, k ed25519.PrivateKey) boundkeypair.PublicKey {
	pk, err := boundkeypair.NewPublicKey(k.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	return pk
}

// addBots registers n bots, each with a static key.
func (c *crashRun) addBots(t *testing.T, n int) {
	for i := range n {
		_, key, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		pk := publicKeyOf(t, key)
		file := filepath.Join(t.TempDir(), "bot.pub")
		if err := os.WriteFile(file, []byte(pk.String()+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("crash-bot-%d", i)
		mustRun(t, "bot", "add", name, "--public-key", file, "--recovery-limit", "1000000", "--data", c.dir)
		c.bots = append(c.bots, &crashBot{name: name, n: i, current: key, offered: map[string]bool{pk.String(): true},
			outcomes: map[string]int{}})
	}
}

// boundJoin runs one bound-keypair exchange for a random bot: a refresh
// over its certificate or a join/recovery without one, offering a new key
// now and then.
func (c *crashRun) boundJoin(t *testing.T) {
	b := c.bots[mrand.IntN(len(c.bots))]
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.locked {
		return
	}
	if b.csr == nil {
		b.csrKey, b.csr = csrFor(t, "")
	}
	if b.next == nil && mrand.IntN(4) == 0 {
		_, next, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		b.next = next
		b.offered[publicKeyOf(t, next).String()] = true
	}
	var id *identity.Identity
	op := "recovery"
	if b.id != nil && mrand.IntN(2) == 0 {
		id, op = b.id, "refresh"
	}
	if b.next != nil {
		op += "+rotation"
	}
	// Each bot from a loopback address of its own, as machines are: the
	// per-source rate limit is not what this test is about.
	src := &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(10+b.n))}
	conn := c.conn(t, id, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		return (&net.Dialer{LocalAddr: src}).DialContext(ctx, "tcp", addr)
	}))
	if conn == nil {
		return
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := agent.ExchangeBoundKeypair(ctx, musterv1.NewJoinServiceClient(conn),
		&musterv1.BoundKeypairInit{Token: b.name, NodeId: b.name, Csr: b.csr, PreviousJoinState: b.state},
		&agent.BoundKeys{Current: b.current, Next: b.next}, c.td)
	if err != nil {
		reason := errinfo.Reason(err)
		if reason == "" {
			reason = strings.ToLower(status.Code(err).String())
		}
		b.outcomes[op+": "+reason]++
		switch {
		case reason == "locked":
			b.locked = true
		case b.next != nil && strings.Contains(status.Convert(err).Message(), "already bound"):
			// The rotation committed and its reply was lost.
			b.current, b.next = b.next, nil
		case b.next != nil && reason == "challenge_failed":
			// Which key is bound is unknown after a lost reply: try
			// the other one next time.
			b.current, b.next = b.next, b.current
		}
		return
	}
	b.outcomes[op+": ok"]++
	if b.next != nil {
		if res.GetBoundKeyFingerprint() == publicKeyOf(t, b.next).Fingerprint() {
			b.current = b.next
		}
		b.next = nil
	}
	b.state = res.GetJoinState()
	chain, err := ca.ParseCertsPEM([]byte(res.GetCertificateChainPem()))
	if err != nil || len(chain) == 0 {
		t.Errorf("bot %s: the authority answered an unreadable chain: %v", b.name, err)
		return
	}
	b.id = &identity.Identity{Chain: chain, Key: b.csrKey, Roots: []*x509.Certificate{c.root}}
	b.csrKey, b.csr = nil, nil
	c.mu.Lock()
	c.received[b.name] = append(c.received[b.name], chain[0].SerialNumber.Text(16))
	c.mu.Unlock()
}

// checkBots checks the bound-keypair invariants in the store: no node has
// two current instances, no two instances were made from one join state
// (one previous instance each), each bot's token counts one recovery per
// instance of its node, and its bound key is one its client offered.
func (c *crashRun) checkBots(t *testing.T, db *sql.DB) {
	rows, err := db.Query(`SELECT node_id, state, previous_id FROM instances`)
	if err != nil {
		t.Fatal(err)
	}
	current, instances, successors := map[string]int{}, map[string]int{}, map[string]int{}
	for rows.Next() {
		var node, state, prev string
		if err := rows.Scan(&node, &state, &prev); err != nil {
			t.Fatal(err)
		}
		instances[node]++
		if state == "current" {
			current[node]++
		}
		if prev != "" {
			successors[prev]++
		}
	}
	rows.Close()
	for node, n := range current {
		if n > 1 {
			t.Errorf("node %s has %d current instances", node, n)
		}
	}
	for prev, n := range successors {
		if n > 1 {
			t.Errorf("instance %s was recovered from %d times", prev, n)
		}
	}
	rows, err = db.Query(`SELECT t.node_id, b.bound_public_key, b.recovery_count FROM bound_keypairs b JOIN tokens t ON t.id = b.token_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var node, bound string
		var count int
		if err := rows.Scan(&node, &bound, &count); err != nil {
			t.Fatal(err)
		}
		for _, b := range c.bots {
			if b.name != node {
				continue
			}
			seen++
			if bound != "" && !b.offered[bound] {
				t.Errorf("bot %s: the bound key %s is none of the %d keys its client offered", node, bound, len(b.offered))
			}
			if count != instances[node] {
				t.Errorf("bot %s: %d recoveries counted for %d instances", node, count, instances[node])
			}
		}
	}
	if seen != len(c.bots) {
		t.Errorf("the store holds %d of the %d bots", seen, len(c.bots))
	}
}

// botOutcomes sums what the bots' exchanges were answered with.
func (c *crashRun) botOutcomes() map[string]int {
	all := map[string]int{}
	for _, b := range c.bots {
		b.mu.Lock()
		for k, v := range b.outcomes {
			all[k] += v
		}
		if b.locked {
			all["bots locked"]++
		}
		b.mu.Unlock()
	}
	return all
}

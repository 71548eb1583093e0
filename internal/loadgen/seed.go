package loadgen

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
)

// SeedLoader writes a batch of fixture rows; inserted says which tokens
// were written (a token whose ID is taken is skipped). Both store
// backends have it.
type SeedLoader interface {
	LoadSeed(ctx context.Context, b store.Seed) (inserted []bool, err error)
}

// SeedConfig says how large a store to build and with what.
type SeedConfig struct {
	// Tokens join tokens in all, Nodes of which were used to join one
	// node each (Nodes ≤ Tokens); the rest are unused single-use tokens.
	Tokens, Nodes int
	// Batch is how many tokens (and nodes) one transaction writes.
	Batch int
	// CA issues the nodes' certificates, as the authority's does.
	CA          *ca.Hierarchy
	TrustDomain string
	// Sealer seals token secrets (seal.InfoToken, the token ID as
	// associated data), as the authority's token creation does.
	Sealer  *seal.Sealer
	CertTTL time.Duration
	// TokenTTL is the unused tokens' lifetime from now.
	TokenTTL time.Duration
	// Labels are every token's labels (nil for none).
	Labels   map[string]string
	Actor    string
	Progress io.Writer
	// Started, if set, is called once with the run's name before the
	// first row is written; if it fails, the seed writes nothing and
	// returns its error. muster bench seed audits the seed's start there,
	// so that a seed killed part-way (each batch commits on its own) still
	// leaves a record of the rows it wrote.
	Started func(run string) error
}

// SeedResult is what a seed wrote.
type SeedResult struct {
	Run     string        `json:"run"`
	Tokens  int           `json:"tokens"`
	Nodes   int           `json:"nodes"`
	Elapsed time.Duration `json:"elapsed_ns"`
	// Collisions is how many generated token IDs were taken already and
	// drawn again.
	Collisions int `json:"collisions"`
}

// seedKeys is how many agent keys the seeded certificates share: a key
// pair per node would make the seed an hour of key generation for no
// difference in what is measured (a certificate's key is looked up by
// serial and instance, never by key).
const seedKeys = 64

// Seed writes cfg.Tokens tokens and cfg.Nodes joined nodes (each with
// its instance and certificate, signed by the CA) in batches, with a
// progress line per batch. Rows are as the authority writes them: token
// secrets sealed, certificates real, the instance holding the chain.
func Seed(ctx context.Context, l SeedLoader, cfg SeedConfig) (*SeedResult, error) {
	switch {
	case cfg.Tokens < 0 || cfg.Nodes < 0:
		return nil, errors.New("loadgen: seed: counts must not be negative")
	case cfg.Nodes > cfg.Tokens:
		return nil, fmt.Errorf("loadgen: seed: %d nodes need as many tokens, not %d (each node joined with its own)", cfg.Nodes, cfg.Tokens)
	case cfg.Batch < 1:
		return nil, fmt.Errorf("loadgen: seed: batch %d: want at least 1", cfg.Batch)
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	keys := make([]seedKey, seedKeys)
	for i := range keys {
		k, err := newKey()
		if err != nil {
			return nil, err
		}
		der, err := x509.MarshalPKIXPublicKey(k.Public())
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(der)
		keys[i] = seedKey{key: k, id: sum[:]}
	}
	runID := make([]byte, 3)
	rand.Read(runID)
	res := &SeedResult{Run: "seed-" + hex.EncodeToString(runID)}
	if cfg.Started != nil {
		if err := cfg.Started(res.Run); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	seen := map[string]bool{}
	for res.Tokens < cfg.Tokens {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		now := time.Now()
		n := min(cfg.Batch, cfg.Tokens-res.Tokens)
		used := min(n, cfg.Nodes-res.Nodes)
		tokens, err := seedTokens(cfg, n, used, now, seen)
		if err != nil {
			return res, err
		}
		inserted, err := l.LoadSeed(ctx, store.Seed{Tokens: tokens})
		if err != nil {
			return res, err
		}
		var joined []store.Token
		for i, ok := range inserted {
			switch {
			case !ok:
				res.Collisions++
			case i < used:
				joined = append(joined, tokens[i])
				res.Tokens++
			default:
				res.Tokens++
			}
		}
		if len(joined) > 0 {
			b, err := seedJoins(cfg, res.Run, res.Nodes, joined, keys, now)
			if err != nil {
				return res, err
			}
			if _, err := l.LoadSeed(ctx, b); err != nil {
				return res, err
			}
			res.Nodes += len(joined)
		}
		el := time.Since(start)
		fmt.Fprintf(cfg.Progress, "seed: %d of %d tokens, %d of %d nodes, %s (%.0f tokens/s)\n", res.Tokens, cfg.Tokens,
			res.Nodes, cfg.Nodes, el.Round(100*time.Millisecond), float64(res.Tokens)/el.Seconds())
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

type seedKey struct {
	key *ecdsa.PrivateKey
	id  []byte
}

// seedTokens makes n tokens, the first used of them spent by a join.
func seedTokens(cfg SeedConfig, n, used int, now time.Time, seen map[string]bool) ([]store.Token, error) {
	out := make([]store.Token, 0, n)
	for len(out) < n {
		tok, err := jointoken.Generate()
		if err != nil {
			return nil, err
		}
		if seen[tok.ID] {
			continue
		}
		seen[tok.ID] = true
		t := store.Token{ID: tok.ID, JoinMethod: store.JoinMethodToken, UsesAllowed: 1, Description: "muster bench seed", Labels: cfg.Labels,
			CreatedBy: cfg.Actor, CreatedAt: now, ExpiresAt: now.Add(cfg.TokenTTL)}
		if t.Ciphertext, t.Nonce, err = cfg.Sealer.Seal(tok.Secret(), []byte(tok.ID)); err != nil {
			return nil, err
		}
		if len(out) < used {
			t.UsesCount, t.LastUsedAt = 1, now
		}
		out = append(out, t)
	}
	return out, nil
}

// seedJoins makes the rows of one join per token: the instance with the
// chain, the node, the certificate record. Certificates are signed on
// every core.
func seedJoins(cfg SeedConfig, run string, first int, tokens []store.Token, keys []seedKey, now time.Time) (store.Seed, error) {
	n := len(tokens)
	b := store.Seed{Instances: make([]store.Instance, n), Nodes: make([]store.Node, n), Certificates: make([]store.Certificate, n)}
	issuer := cfg.CA.Issuer(ca.RoleAgent)
	errs := make([]error, n)
	var wg sync.WaitGroup
	workers := runtime.GOMAXPROCS(0)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				errs[i] = seedJoin(cfg, issuer, &b, i, fmt.Sprintf("%s-%07d", run, first+i), tokens[i].ID, keys[(first+i)%len(keys)], now)
			}
		})
	}
	wg.Wait()
	return b, errors.Join(errs...)
}

func seedJoin(cfg SeedConfig, issuer *ca.Issuer, b *store.Seed, i int, node, token string, k seedKey, now time.Time) error {
	id, err := spiffeid.New(cfg.TrustDomain, spiffeid.RoleAgent, node)
	if err != nil {
		return err
	}
	leaf, err := issuer.Issue(ca.LeafRequest{PublicKey: k.key.Public(), SPIFFEID: id.URL(), CommonName: node, ClientAuth: true,
		NotBefore: now, TTL: cfg.CertTTL})
	if err != nil {
		return err
	}
	serial := leaf.SerialNumber.Text(16)
	inst := store.Instance{ID: uuid.NewString(), NodeID: node, JoinMethod: store.JoinMethodToken, TokenID: token,
		State: store.InstanceCurrent, CreatedAt: now, LastSerial: serial, LastPublicKey: k.id, LastChainPEM: issuer.ChainPEM(leaf),
		LastIssuedAt: now}
	b.Instances[i] = inst
	b.Nodes[i] = store.Node{ID: node, JoinMethod: inst.JoinMethod, TokenID: token, InstanceID: inst.ID, CreatedAt: now, UpdatedAt: now}
	b.Certificates[i] = store.Certificate{Serial: serial, NodeID: node, InstanceID: inst.ID, JoinMethod: inst.JoinMethod,
		TokenID: token, PublicKey: k.id, NotBefore: leaf.NotBefore, NotAfter: leaf.NotAfter, IssuedAt: now}
	return nil
}

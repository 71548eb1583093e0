package authority

import (
	"context"
	"crypto/x509"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/store"
)

// errLostCommit is what a store returns when the connection went while
// PostgreSQL committed: the write may or may not have landed.
var errLostCommit = errors.New("postgres: insert ca cert: commit: unexpected EOF")

// lostCommitStore commits InsertCACert (when commit is set) and then
// answers errLostCommit either way.
type lostCommitStore struct {
	store.Store
	commit bool
}

func (s lostCommitStore) InsertCACert(ctx context.Context, c store.CACert, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if s.commit {
		if err := s.Store.InsertCACert(ctx, c, audit); err != nil {
			return err
		}
	}
	return errLostCommit
}

// countingCustody counts the keys destroyed.
type countingCustody struct {
	custody.Custody
	destroyed atomic.Int32
}

func (c *countingCustody) Destroy(ctx context.Context, name string, k custody.Key) error {
	c.destroyed.Add(1)
	return c.Custody.Destroy(ctx, name, k)
}

// TestPrepareIntermediateAfterAnAmbiguousCommit: a commit whose answer is
// lost may have landed; the key of an intermediate the store holds is
// kept (and the intermediate returned), and only the key of one it does
// not hold is destroyed.
func TestPrepareIntermediateAfterAnAmbiguousCommit(t *testing.T) {
	a := startBench(t)
	srv := a.srvs[0]
	rs := srv.ca.Roots()
	for _, tc := range []struct {
		name      string
		commit    bool
		wantErr   bool
		destroyed int32
	}{
		{"the commit landed", true, false, 0},
		{"the commit did not land", false, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			c := &countingCustody{Custody: srv.inter.custody}
			st := lostCommitStore{Store: a.store, commit: tc.commit}
			row, err := prepareIntermediate(ctx, st, c, srv.ca, ca.RoleAgent, rs.Signing, rs.SigningKey, srv.caIntermediateTTL(), srv.testPrepareLink)
			if got := c.destroyed.Load(); got != tc.destroyed {
				t.Errorf("%d keys destroyed, want %d", got, tc.destroyed)
			}
			if tc.wantErr {
				if !errors.Is(err, errLostCommit) {
					t.Fatalf("prepareIntermediate = %v, want the store's error", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("prepareIntermediate = %v, want the intermediate the store holds", err)
			}
			rows, err := a.store.ListCACerts(ctx)
			if err != nil {
				t.Fatal(err)
			}
			p, _ := preparedOf(rows, ca.RoleAgent)
			if p == nil || p.Serial != row.Serial || string(p.KeyRef) != string(row.KeyRef) {
				t.Fatalf("the store's prepared agent intermediate is %+v, want the one returned (%s)", p, row.Serial)
			}
			cert, err := x509.ParseCertificate(p.CertDER)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := srv.inter.custody.Signer(ctx, keyName(p.Role, p.Serial), custody.Key{Public: cert.PublicKey, Ref: p.KeyRef}); err != nil {
				t.Fatalf("the stored intermediate's key does not open: %v", err)
			}
		})
	}
}

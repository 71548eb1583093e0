package sqlite

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/muster-dev/muster/internal/store"
)

func testToken(id string, usesAllowed int64) store.Token {
	return store.Token{
		ID: id, JoinMethod: store.JoinMethodToken, Ciphertext: []byte("c"), Nonce: []byte("n"),
		UsesAllowed: usesAllowed, CreatedBy: "admin", CreatedAt: time.Now(),
	}
}

// testJoin is a join that leaves every field the store may fill empty.
func testJoin(tokenID, nodeID, instanceID string) store.Join {
	now := time.Now()
	return store.Join{
		TokenID: tokenID, NodeID: nodeID,
		Instance: store.Instance{ID: instanceID, JoinMethod: store.JoinMethodToken, CreatedAt: now, LastChainPEM: []byte("chain")},
		Certificate: store.Certificate{
			Serial: fmt.Sprintf("%x", instanceID), PublicKey: []byte("key " + instanceID),
			NotBefore: now, NotAfter: now.Add(time.Hour), IssuedAt: now,
		},
	}
}

// TestCommitJoinTwoHandles uses one token from two independent handles on
// one file, as two authority processes would: only the database's write
// lock and the conditional UPDATE can keep the count.
func TestCommitJoinTwoHandles(t *testing.T) {
	ctx := t.Context()
	a, path := openTemp(t)
	b, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const allowed, joiners = 5, 24
	if err := a.InsertToken(ctx, testToken("t1", allowed), benchLink); err != nil {
		t.Fatal(err)
	}

	var (
		wg          sync.WaitGroup
		mu          sync.Mutex
		ok, spent   int
		unexpectedE []error
	)
	for i := range joiners {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Go(func() {
			_, err := s.CommitJoin(ctx, testJoin("t1", fmt.Sprintf("node-%d", i), fmt.Sprintf("i-%d", i)))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, store.ErrTokenSpent):
				spent++
			default:
				unexpectedE = append(unexpectedE, err)
			}
		})
	}
	wg.Wait()
	for _, err := range unexpectedE {
		t.Errorf("CommitJoin: %v", err)
	}
	if ok != allowed || spent != joiners-allowed {
		t.Errorf("%d joins succeeded and %d found the token spent, want %d and %d", ok, spent, allowed, joiners-allowed)
	}
	tok, err := b.GetToken(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if tok.UsesCount != allowed {
		t.Errorf("UsesCount = %d, want %d", tok.UsesCount, allowed)
	}
}

func TestCommitJoinFillsRecords(t *testing.T) {
	s, _ := openTemp(t)
	ctx := t.Context()
	if err := s.InsertToken(ctx, testToken("t1", 0), benchLink); err != nil {
		t.Fatal(err)
	}
	j := testJoin("t1", "node-1", "i1")
	res, err := s.CommitJoin(ctx, j)
	if err != nil {
		t.Fatal(err)
	}
	want := store.Instance{
		ID: "i1", NodeID: "node-1", JoinMethod: store.JoinMethodToken, TokenID: "t1",
		State: store.InstanceCurrent, CreatedAt: store.StoredTime(j.Instance.CreatedAt),
		LastSerial: j.Certificate.Serial, LastPublicKey: j.Certificate.PublicKey,
		LastChainPEM: []byte("chain"), LastIssuedAt: store.StoredTime(j.Certificate.IssuedAt),
	}
	if diff := cmp.Diff(want, res.Instance); diff != "" {
		t.Errorf("instance (-want +got):\n%s", diff)
	}
	stored, err := s.GetInstance(ctx, "i1")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(res.Instance, stored); diff != "" {
		t.Errorf("stored instance differs from the one returned (-returned +stored):\n%s", diff)
	}
	c, err := s.GetCertificate(ctx, j.Certificate.Serial)
	if err != nil {
		t.Fatal(err)
	}
	if c.NodeID != "node-1" || c.InstanceID != "i1" || c.TokenID != "t1" || c.JoinMethod != store.JoinMethodToken {
		t.Errorf("certificate %+v: want node-1, i1, t1 and %s filled in", c, store.JoinMethodToken)
	}

	r, err := s.CommitRenewal(ctx, store.Renewal{
		InstanceID: "i1", FromGeneration: 0, ChainPEM: []byte("chain 2"),
		Certificate: store.Certificate{Serial: "0b", PublicKey: []byte("k2"), NotBefore: time.Now(), NotAfter: time.Now(), IssuedAt: time.Now()},
	})
	if err != nil {
		t.Fatal(err)
	}
	c, err = s.GetCertificate(ctx, "0b")
	if err != nil {
		t.Fatal(err)
	}
	if c.NodeID != "node-1" || c.InstanceID != "i1" || c.Generation != 1 || c.TokenID != "t1" || r.Generation != 1 {
		t.Errorf("renewal certificate %+v, instance generation %d: want node-1, i1, generation 1, t1", c, r.Generation)
	}
}

// TestCommitJoinRejectsContradictions checks that a join whose records
// disagree with it fails before anything is written, the token use
// included.
func TestCommitJoinRejectsContradictions(t *testing.T) {
	t.Parallel()
	for name, mod := range map[string]func(*store.Join){
		"no node ID":                func(j *store.Join) { j.NodeID = "" },
		"no instance ID":            func(j *store.Join) { j.Instance.ID, j.Certificate.InstanceID = "", "" },
		"no serial":                 func(j *store.Join) { j.Certificate.Serial = "" },
		"instance of another token": func(j *store.Join) { j.Instance.TokenID = "t2" },
		"certificate of another node": func(j *store.Join) {
			j.Certificate.NodeID = "node-2"
		},
		"certificate of another instance": func(j *store.Join) { j.Certificate.InstanceID = "i2" },
		"certificate at generation 1":     func(j *store.Join) { j.Certificate.Generation = 1 },
		"instance of another serial":      func(j *store.Join) { j.Instance.LastSerial = "ff" },
		"instance of another key":         func(j *store.Join) { j.Instance.LastPublicKey = []byte("other") },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s, _ := openTemp(t)
			ctx := t.Context()
			if err := s.InsertToken(ctx, testToken("t1", 1), benchLink); err != nil {
				t.Fatal(err)
			}
			j := testJoin("t1", "node-1", "i1")
			mod(&j)
			if _, err := s.CommitJoin(ctx, j); err == nil {
				t.Fatal("CommitJoin succeeded")
			}
			tok, err := s.GetToken(ctx, "t1")
			if err != nil {
				t.Fatal(err)
			}
			if tok.UsesCount != 0 {
				t.Errorf("UsesCount = %d after a rejected join, want 0", tok.UsesCount)
			}
			if nodes, err := s.ListNodes(ctx); err != nil || len(nodes) != 0 {
				t.Errorf("ListNodes = %v, %v; want none", nodes, err)
			}
		})
	}
}

// TestJoinSchemaInvariants checks the constraints that back the
// conditional writes, against writes that bypass them.
func TestJoinSchemaInvariants(t *testing.T) {
	s, _ := openTemp(t)
	ctx := t.Context()
	if err := s.InsertToken(ctx, testToken("t1", 1), benchLink); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CommitJoin(ctx, testJoin("t1", "node-1", "i1")); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`UPDATE tokens SET uses_count = 2 WHERE id = 't1'`,
		`UPDATE tokens SET labels = 'null' WHERE id = 't1'`,
		`INSERT INTO instances (` + instanceColumns + `)
			VALUES ('i2', 'node-1', 'token', '', '', 'current', 0, 0, '', x'00', NULL, NULL)`,
		`UPDATE instances SET state = 'locked' WHERE id = 'i1'`,
		`UPDATE nodes SET instance_id = 'nope' WHERE id = 'node-1'`,
	} {
		if _, err := s.w.ExecContext(ctx, q); err == nil {
			t.Errorf("%s succeeded, want it refused", q)
		}
	}
}

func TestDeleteExpiredTokensNegativeRetention(t *testing.T) {
	s, _ := openTemp(t)
	ctx := t.Context()
	live := testToken("live", 1)
	live.ExpiresAt = time.Now().Add(time.Minute)
	if err := s.InsertToken(ctx, live, benchLink); err != nil {
		t.Fatal(err)
	}
	ids, err := s.DeleteExpiredTokens(ctx, -time.Hour, func([]string) func(store.AuditHead) (store.AuditRecord, error) { return benchLink })
	if err != nil || len(ids) != 0 {
		t.Errorf("DeleteExpiredTokens(-1h) = %v, %v; want nothing deleted", ids, err)
	}
}

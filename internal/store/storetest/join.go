package storetest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// storeNow returns the store clock as a record would hold it.
func storeNow(t *testing.T, ctx context.Context, s store.Store) time.Time {
	t.Helper()
	now, err := s.Now(ctx)
	mustNil(t, "Now", err)
	return now.UTC().Truncate(time.Microsecond)
}

// pubKey stands in for the SHA-256 of a certified public key.
func pubKey(name string) []byte {
	sum := sha256.Sum256([]byte(name))
	return sum[:]
}

// serial returns a lower-case hex serial, unique per name.
func serial(name string) string { return hex.EncodeToString([]byte(name)) }

// newJoin returns a complete, consistent join of nodeID with tokenID ("" for
// a method without a token) that creates instanceID, certifying
// pubKey(keyName), at created. Its RetryWindow is zero.
func newJoin(tokenID, nodeID, instanceID, keyName string, created time.Time) store.Join {
	method := store.JoinMethodToken
	if tokenID == "" {
		method = store.JoinMethodPSK
	}
	k, sn := pubKey(keyName), serial(instanceID)
	return store.Join{
		TokenID: tokenID,
		NodeID:  nodeID,
		Instance: store.Instance{
			ID: instanceID, JoinMethod: method, TokenID: tokenID, CreatedAt: created,
			LastSerial: sn, LastPublicKey: k, LastChainPEM: []byte("chain of " + sn), LastIssuedAt: created,
		},
		Certificate: store.Certificate{
			Serial: sn, NodeID: nodeID, InstanceID: instanceID, Generation: 0,
			JoinMethod: method, TokenID: tokenID, PublicKey: k,
			NotBefore: created.Add(-time.Minute), NotAfter: created.Add(time.Hour), IssuedAt: created,
		},
	}
}

// wantInstance is the instance CommitJoin stores for j when it supersedes
// prev ("" for none).
func wantInstance(j store.Join, prev string) store.Instance {
	in := j.Instance
	in.NodeID, in.State, in.Generation, in.PreviousID = j.NodeID, store.InstanceCurrent, 0, prev
	return in
}

// wantNode is the node after join j, for a node first created at created.
func wantNode(j store.Join, created time.Time) store.Node {
	return store.Node{
		ID: j.NodeID, JoinMethod: j.Instance.JoinMethod, TokenID: j.TokenID, InstanceID: j.Instance.ID,
		CreatedAt: created, UpdatedAt: j.Instance.CreatedAt,
	}
}

func insertTokens(t *testing.T, ctx context.Context, s store.Store, ts ...store.Token) {
	t.Helper()
	for _, tok := range ts {
		mustNil(t, "InsertToken "+tok.ID, s.InsertToken(ctx, tok, link(record("token.create"))))
	}
}

func mustJoin(t *testing.T, ctx context.Context, s store.Store, j store.Join) store.JoinResult {
	t.Helper()
	res, err := s.CommitJoin(ctx, j)
	mustNil(t, "CommitJoin "+j.Instance.ID, err)
	return res
}

// state is everything the join methods write, read back, for checking that
// a failed or repeated call wrote nothing: token use counts included.
type state struct {
	Tokens       []store.Token
	Nodes        []store.Node
	Instances    map[string][]store.Instance
	Certificates map[string][]store.Certificate
}

func snapshot(t *testing.T, ctx context.Context, s store.Store, nodeIDs ...string) state {
	t.Helper()
	var (
		st  = state{Instances: map[string][]store.Instance{}, Certificates: map[string][]store.Certificate{}}
		err error
	)
	st.Tokens, err = s.ListTokens(ctx)
	mustNil(t, "ListTokens", err)
	st.Nodes, err = s.ListNodes(ctx)
	mustNil(t, "ListNodes", err)
	for _, id := range nodeIDs {
		st.Instances[id], err = s.ListInstances(ctx, id)
		mustNil(t, "ListInstances "+id, err)
		st.Certificates[id], err = s.ListCertificates(ctx, id)
		mustNil(t, "ListCertificates "+id, err)
	}
	return st
}

// concurrently runs f(0) … f(n-1) in parallel and returns their errors by
// index.
func concurrently(n int, f func(i int) error) []error {
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			errs[i] = f(i)
		})
	}
	close(start)
	wg.Wait()
	return errs
}

// tally counts errs by outcome: nil, wrapping want, and anything else,
// which it reports.
func tally(t *testing.T, errs []error, want error) (ok, wanted int) {
	t.Helper()
	for i, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, want):
			wanted++
		default:
			t.Errorf("call %d: %v, want nil or an error wrapping %v", i, err, want)
		}
	}
	return ok, wanted
}

func joinCases() []testCase {
	cases := []testCase{
		{"admits and records everything", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			tok := token("t1", 1, now.Add(time.Hour), time.Hour)
			insertTokens(t, ctx, s, tok)
			j := newJoin("t1", "node-1", "i1", "key-1", now)
			res, err := s.CommitJoin(ctx, j)
			mustNil(t, "CommitJoin", err)
			after := storeNow(t, ctx, s)
			wantEqual(t, "JoinResult", res, store.JoinResult{Instance: wantInstance(j, "")})

			n, err := s.GetNode(ctx, "node-1")
			mustNil(t, "GetNode", err)
			wantEqual(t, "GetNode", n, wantNode(j, now))
			in, err := s.GetInstance(ctx, "i1")
			mustNil(t, "GetInstance", err)
			wantEqual(t, "GetInstance", in, res.Instance)
			c, err := s.GetCertificate(ctx, j.Certificate.Serial)
			mustNil(t, "GetCertificate", err)
			wantEqual(t, "GetCertificate", c, j.Certificate)
			wantEqual(t, "state", snapshot(t, ctx, s, "node-1"), state{
				Tokens:       []store.Token{tok}, // plus the use, by withTokenUse
				Nodes:        []store.Node{n},
				Instances:    map[string][]store.Instance{"node-1": {in}},
				Certificates: map[string][]store.Certificate{"node-1": {c}},
			}.withTokenUse(t, ctx, s, "t1", 1, now, after))
		}},
		{"admits without a token", func(t *testing.T, ctx context.Context, s store.Store) {
			j := newJoin("", "node-1", "i1", "key-1", at(0))
			res := mustJoin(t, ctx, s, j)
			wantEqual(t, "JoinResult", res, store.JoinResult{Instance: wantInstance(j, "")})
			n, err := s.GetNode(ctx, "node-1")
			mustNil(t, "GetNode", err)
			wantEqual(t, "GetNode", n, wantNode(j, at(0)))
		}},
		{"supersedes when allowed", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			bound := token("b", 1, time.Time{}, 0)
			bound.NodeID = "node-1"
			insertTokens(t, ctx, s, token("a", 1, time.Time{}, time.Hour), bound)
			j1 := newJoin("a", "node-1", "i1", "key-1", now.Add(-time.Hour))
			first := mustJoin(t, ctx, s, j1)
			j2 := newJoin("b", "node-1", "i2", "key-2", now)
			j2.MaySupersede = true
			res := mustJoin(t, ctx, s, j2)
			wantEqual(t, "JoinResult", res, store.JoinResult{Instance: wantInstance(j2, "i1"), Superseded: "i1"})

			old := first.Instance
			old.State = store.InstanceSuperseded
			got, err := s.GetInstance(ctx, "i1")
			mustNil(t, "GetInstance i1", err)
			wantEqual(t, "superseded instance", got, old)
			n, err := s.GetNode(ctx, "node-1")
			mustNil(t, "GetNode", err)
			wantEqual(t, "GetNode", n, wantNode(j2, j1.Instance.CreatedAt))
			is, err := s.ListInstances(ctx, "node-1")
			mustNil(t, "ListInstances", err)
			wantEqual(t, "ListInstances", is, []store.Instance{old, res.Instance})
			cs, err := s.ListCertificates(ctx, "node-1")
			mustNil(t, "ListCertificates", err)
			wantEqual(t, "ListCertificates", cs, []store.Certificate{j1.Certificate, j2.Certificate})
		}},
	}

	// Each failure sets up the store, then the join must fail with want
	// and leave the store exactly as it was: in particular no token use is
	// taken by a join that fails for another reason.
	failures := []struct {
		name  string
		setup func(t *testing.T, ctx context.Context, s store.Store, now time.Time)
		join  func(now time.Time) store.Join
		want  error
	}{
		{
			name: "used-up token",
			setup: func(t *testing.T, ctx context.Context, s store.Store, now time.Time) {
				tok := token("t1", 2, time.Time{}, time.Hour)
				tok.UsesCount = 2
				insertTokens(t, ctx, s, tok)
			},
			join: func(now time.Time) store.Join { return newJoin("t1", "node-1", "i1", "key-1", now) },
			want: store.ErrTokenSpent,
		},
		{
			name: "expired token",
			setup: func(t *testing.T, ctx context.Context, s store.Store, now time.Time) {
				insertTokens(t, ctx, s, token("t1", 5, now.Add(-time.Second), time.Hour))
			},
			join: func(now time.Time) store.Join { return newJoin("t1", "node-1", "i1", "key-1", now) },
			want: store.ErrTokenSpent,
		},
		{
			name: "expired unlimited token",
			setup: func(t *testing.T, ctx context.Context, s store.Store, now time.Time) {
				insertTokens(t, ctx, s, token("t1", 0, now.Add(-time.Second), time.Hour))
			},
			join: func(now time.Time) store.Join { return newJoin("t1", "node-1", "i1", "key-1", now) },
			want: store.ErrTokenSpent,
		},
		{
			name: "missing token",
			setup: func(t *testing.T, ctx context.Context, s store.Store, now time.Time) {
				insertTokens(t, ctx, s, token("other", 0, time.Time{}, time.Hour))
			},
			join: func(now time.Time) store.Join { return newJoin("t1", "node-1", "i1", "key-1", now) },
			want: store.ErrNotFound,
		},
		{
			name: "node taken",
			setup: func(t *testing.T, ctx context.Context, s store.Store, now time.Time) {
				insertTokens(t, ctx, s, token("a", 1, time.Time{}, time.Hour), token("b", 1, time.Time{}, time.Hour))
				mustJoin(t, ctx, s, newJoin("a", "node-1", "i0", "key-0", now))
			},
			join: func(now time.Time) store.Join { return newJoin("b", "node-1", "i1", "key-1", now) },
			want: store.ErrNodeTaken,
		},
		{
			name: "node taken by a join without a token",
			setup: func(t *testing.T, ctx context.Context, s store.Store, now time.Time) {
				insertTokens(t, ctx, s, token("b", 0, time.Time{}, time.Hour))
				mustJoin(t, ctx, s, newJoin("", "node-1", "i0", "key-0", now))
			},
			join: func(now time.Time) store.Join { return newJoin("b", "node-1", "i1", "key-1", now) },
			want: store.ErrNodeTaken,
		},
		{
			name: "supersession with a used-up token",
			setup: func(t *testing.T, ctx context.Context, s store.Store, now time.Time) {
				spent := token("b", 1, time.Time{}, time.Hour)
				spent.UsesCount = 1
				insertTokens(t, ctx, s, token("a", 1, time.Time{}, time.Hour), spent)
				mustJoin(t, ctx, s, newJoin("a", "node-1", "i0", "key-0", now))
			},
			join: func(now time.Time) store.Join {
				j := newJoin("b", "node-1", "i1", "key-1", now)
				j.MaySupersede = true
				return j
			},
			want: store.ErrTokenSpent,
		},
		{
			name: "duplicate instance ID",
			setup: func(t *testing.T, ctx context.Context, s store.Store, now time.Time) {
				insertTokens(t, ctx, s, token("a", 0, time.Time{}, time.Hour))
				mustJoin(t, ctx, s, newJoin("a", "node-2", "i1", "key-0", now))
			},
			join: func(now time.Time) store.Join {
				j := newJoin("a", "node-1", "i1", "key-1", now)
				j.Certificate.Serial = serial("another")
				j.Instance.LastSerial = j.Certificate.Serial
				return j
			},
			want: store.ErrConflict,
		},
		{
			name: "duplicate serial",
			setup: func(t *testing.T, ctx context.Context, s store.Store, now time.Time) {
				insertTokens(t, ctx, s, token("a", 0, time.Time{}, time.Hour))
				mustJoin(t, ctx, s, newJoin("a", "node-2", "i0", "key-0", now))
			},
			join: func(now time.Time) store.Join {
				j := newJoin("a", "node-1", "i1", "key-1", now)
				j.Certificate.Serial = serial("i0")
				j.Instance.LastSerial = j.Certificate.Serial
				return j
			},
			want: store.ErrConflict,
		},
	}
	for _, f := range failures {
		cases = append(cases, testCase{f.name, func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			f.setup(t, ctx, s, now)
			before := snapshot(t, ctx, s, "node-1", "node-2")
			_, err := s.CommitJoin(ctx, f.join(now))
			wantErr(t, "CommitJoin", err, f.want)
			wantEqual(t, "state after a failed join", snapshot(t, ctx, s, "node-1", "node-2"), before)
		}})
	}

	return append(cases, joinRaceCases()...)
}

// withTokenUse checks that the token id in the store has uses use(s), the
// last taken within [from, to] by the store clock, and returns st with the
// token's UsesCount and LastUsedAt as the store holds them.
func (st state) withTokenUse(t *testing.T, ctx context.Context, s store.Store, id string, uses int64, from, to time.Time) state {
	t.Helper()
	got, err := s.GetToken(ctx, id)
	mustNil(t, "GetToken "+id, err)
	if got.UsesCount != uses {
		t.Errorf("token %s: UsesCount = %d, want %d", id, got.UsesCount, uses)
	}
	if got.LastUsedAt.Before(from) || got.LastUsedAt.After(to) {
		t.Errorf("token %s: LastUsedAt = %v, want within [%v, %v]", id, got.LastUsedAt, from, to)
	}
	for i := range st.Tokens {
		if st.Tokens[i].ID == id {
			st.Tokens[i].UsesCount, st.Tokens[i].LastUsedAt = uses, got.LastUsedAt
		}
	}
	return st
}

// joinRaceCases check that the conditions of CommitJoin hold under
// concurrent joins: only the backend's single conditional write can make
// them hold.
func joinRaceCases() []testCase {
	const joiners = 20
	return []testCase{
		{"token uses race", func(t *testing.T, ctx context.Context, s store.Store) {
			const allowed = 3
			insertTokens(t, ctx, s, token("t1", allowed, time.Time{}, time.Hour))
			errs := concurrently(joiners, func(i int) error {
				id := string(rune('a' + i))
				_, err := s.CommitJoin(ctx, newJoin("t1", "node-"+id, "i-"+id, "key-"+id, at(0)))
				return err
			})
			ok, spent := tally(t, errs, store.ErrTokenSpent)
			if ok != allowed || spent != joiners-allowed {
				t.Errorf("%d joins succeeded and %d found the token spent, want %d and %d", ok, spent, allowed, joiners-allowed)
			}
			tok, err := s.GetToken(ctx, "t1")
			mustNil(t, "GetToken", err)
			if tok.UsesCount != allowed {
				t.Errorf("UsesCount = %d, want %d", tok.UsesCount, allowed)
			}
			nodes, err := s.ListNodes(ctx)
			mustNil(t, "ListNodes", err)
			if len(nodes) != allowed {
				t.Errorf("ListNodes returned %d nodes, want %d", len(nodes), allowed)
			}
		}},
		{"unlimited token admits all", func(t *testing.T, ctx context.Context, s store.Store) {
			insertTokens(t, ctx, s, token("t1", 0, time.Time{}, time.Hour))
			errs := concurrently(joiners, func(i int) error {
				id := string(rune('a' + i))
				_, err := s.CommitJoin(ctx, newJoin("t1", "node-"+id, "i-"+id, "key-"+id, at(0)))
				return err
			})
			if ok, _ := tally(t, errs, store.ErrTokenSpent); ok != joiners {
				t.Errorf("%d joins succeeded, want %d", ok, joiners)
			}
			tok, err := s.GetToken(ctx, "t1")
			mustNil(t, "GetToken", err)
			if tok.UsesCount != joiners {
				t.Errorf("UsesCount = %d, want %d", tok.UsesCount, joiners)
			}
		}},
		{"node ID race", func(t *testing.T, ctx context.Context, s store.Store) {
			// Each joiner has its own token, so a loser's use must be
			// rolled back with the rest of its join. Half of them read
			// the node free before any committed, as the authority
			// does (NodeFreeAtRead): a wrong guess refuses as well.
			for i := range joiners {
				insertTokens(t, ctx, s, token("t-"+string(rune('a'+i)), 1, time.Time{}, time.Hour))
			}
			errs := concurrently(joiners, func(i int) error {
				id := string(rune('a' + i))
				j := newJoin("t-"+id, "node-1", "i-"+id, "key-"+id, at(0))
				j.NodeFreeAtRead = i%2 == 0
				_, err := s.CommitJoin(ctx, j)
				return err
			})
			ok, taken := tally(t, errs, store.ErrNodeTaken)
			if ok != 1 || taken != joiners-1 {
				t.Errorf("%d joins succeeded and %d found the node taken, want 1 and %d", ok, taken, joiners-1)
			}
			toks, err := s.ListTokens(ctx)
			mustNil(t, "ListTokens", err)
			var uses int64
			for _, tok := range toks {
				uses += tok.UsesCount
			}
			if uses != 1 {
				t.Errorf("the tokens have %d uses in all, want 1", uses)
			}
			is, err := s.ListInstances(ctx, "node-1")
			mustNil(t, "ListInstances", err)
			if len(is) != 1 {
				t.Errorf("ListInstances returned %d instances, want 1", len(is))
			}
		}},
	}
}

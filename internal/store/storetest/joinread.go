package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

func joinReadCases() []testCase {
	var (
		node1 = store.LockTarget{Kind: store.LockNode, Target: "node-1"}
		tok1  = store.LockTarget{Kind: store.LockToken, Target: "tok-1"}
		inst1 = store.LockTarget{Kind: store.LockInstance, Target: "i-1"}
		key1  = store.LockTarget{Kind: store.LockPublicKey, Target: "pk-1"}
	)
	return []testCase{
		{"token, node and lock in one read agree with their own reads", func(t *testing.T, ctx context.Context, s store.Store) {
			locks := lockFixture(t, ctx, s)
			// A token of N uses: ReadJoin may leave out an unlimited
			// token's latest uses (store.JoinRead), not this one's.
			tok := token("tok-1", 5, time.Time{}, time.Hour)
			insertTokens(t, ctx, s, tok)
			mustJoin(t, ctx, s, newJoin("tok-1", "node-1", "inst-1", "key-1", storeNow(t, ctx, s)))
			wantTok, err := s.GetToken(ctx, "tok-1")
			mustNil(t, "GetToken", err)
			wantNode, err := s.GetNode(ctx, "node-1")
			mustNil(t, "GetNode", err)

			// The expired instance lock is passed over; of the two in force,
			// the one on the earlier target wins, as FindAnyLock chooses.
			for _, tc := range []struct {
				targets []store.LockTarget
				want    string
			}{
				{[]store.LockTarget{inst1, tok1, node1}, "live"},
				{[]store.LockTarget{node1, tok1}, "forever"},
				{[]store.LockTarget{inst1, key1}, ""},
				{nil, ""},
			} {
				got, err := s.ReadJoin(ctx, "tok-1", "node-1", tc.targets)
				mustNil(t, "ReadJoin", err)
				want := store.JoinRead{Token: wantTok, TokenFound: true, Node: wantNode, NodeFound: true}
				if tc.want != "" {
					want.Lock, want.Locked = locks[tc.want], true
				}
				wantEqual(t, "ReadJoin", got, want)
			}
		}},
		{"unknown token and free node are flags, not errors", func(t *testing.T, ctx context.Context, s store.Store) {
			insertTokens(t, ctx, s, token("tok-1", 1, time.Time{}, time.Hour))
			got, err := s.ReadJoin(ctx, "nosuch", "node-9", []store.LockTarget{node1})
			mustNil(t, "ReadJoin", err)
			wantEqual(t, "ReadJoin of nothing", got, store.JoinRead{})
			// Nothing asked, nothing read.
			got, err = s.ReadJoin(ctx, "", "", nil)
			mustNil(t, "ReadJoin of no IDs", err)
			wantEqual(t, "ReadJoin of no IDs", got, store.JoinRead{})
			// The plain read has no decoy either.
			_, err = s.GetToken(ctx, "nosuch")
			wantErr(t, "GetToken nosuch", err, store.ErrNotFound)
		}},
		{"a bound-keypair token comes with its keypair", func(t *testing.T, ctx context.Context, s store.Store) {
			insertTokens(t, ctx, s, bkToken("bot-1", "bot-1", 2, "standard"), token("tok-1", 1, time.Time{}, time.Hour))
			want, err := s.GetToken(ctx, "bot-1")
			mustNil(t, "GetToken", err)
			if want.BoundKeypair == nil {
				t.Fatal("GetToken bot-1: no BoundKeypair")
			}
			got, err := s.ReadJoin(ctx, "bot-1", "", nil)
			mustNil(t, "ReadJoin", err)
			wantEqual(t, "ReadJoin bot-1", got, store.JoinRead{Token: want, TokenFound: true})
			got, err = s.ReadJoin(ctx, "tok-1", "", nil)
			mustNil(t, "ReadJoin", err)
			if got.Token.BoundKeypair != nil {
				t.Errorf("ReadJoin tok-1: a join token with a BoundKeypair %+v", got.Token.BoundKeypair)
			}
		}},
	}
}

func renewalReadCases() []testCase {
	// setup joins node-1 through token tok-1 (instance inst-1) and
	// returns the record of its certificate.
	setup := func(t *testing.T, ctx context.Context, s store.Store) store.Certificate {
		insertTokens(t, ctx, s, token("tok-1", 0, time.Time{}, time.Hour))
		j := newJoin("tok-1", "node-1", "inst-1", "key-1", storeNow(t, ctx, s))
		mustJoin(t, ctx, s, j)
		c, err := s.GetCertificate(ctx, j.Certificate.Serial)
		mustNil(t, "GetCertificate", err)
		return c
	}
	return []testCase{
		{"record, instance, node and lock agree with their own reads", func(t *testing.T, ctx context.Context, s store.Store) {
			c := setup(t, ctx, s)
			in, err := s.GetInstance(ctx, "inst-1")
			mustNil(t, "GetInstance", err)
			n, err := s.GetNode(ctx, "node-1")
			mustNil(t, "GetNode", err)
			set, err := s.SignerSetID(ctx)
			mustNil(t, "SignerSetID", err)
			base := store.RenewalRead{Certificate: c, CertificateFound: true, Instance: in, InstanceFound: true, Node: n, NodeFound: true,
				SignerSet: set}
			got, err := s.ReadRenewal(ctx, c.Serial, []string{"ab12"})
			mustNil(t, "ReadRenewal", err)
			wantEqual(t, "ReadRenewal without locks", got, base)

			// Locks on each target, latest target first: each read must name
			// the lock on the earliest target still locked, as FindAnyLock
			// does over RenewalLockTargets.
			now := storeNow(t, ctx, s)
			targets := store.RenewalLockTargets(c, in, []string{"ab12"})
			if len(targets) != 5 {
				t.Fatalf("RenewalLockTargets = %v, want node, instance, token and two keys", targets)
			}
			expired := store.Lock{ID: "l-expired", Kind: store.LockNode, Target: "node-1", CreatedBy: "admin",
				CreatedAt: now.Add(-time.Hour), ExpiresAt: now.Add(-time.Minute)}
			mustNil(t, "InsertLock", s.InsertLock(ctx, expired, link(record("lock.create"))))
			for i := len(targets) - 1; i >= 0; i-- {
				l := store.Lock{ID: fmt.Sprintf("l-%d", i), Kind: targets[i].Kind, Target: targets[i].Target,
					Reason: "r", CreatedBy: "admin", CreatedAt: now.Add(-time.Hour)}
				mustNil(t, "InsertLock", s.InsertLock(ctx, l, link(record("lock.create"))))
				want, err := s.FindAnyLock(ctx, targets)
				mustNil(t, "FindAnyLock", err)
				if want.ID != l.ID {
					t.Fatalf("FindAnyLock = %s, want %s", want.ID, l.ID)
				}
				got, err := s.ReadRenewal(ctx, c.Serial, []string{"ab12"})
				mustNil(t, "ReadRenewal", err)
				w := base
				w.Lock, w.Locked = want, true
				wantEqual(t, fmt.Sprintf("ReadRenewal with a lock on %v", targets[i]), got, w)
			}
		}},
		{"only a lock of the right kind on a named target counts", func(t *testing.T, ctx context.Context, s store.Store) {
			// A PSK join: its instance has no token, so no token target.
			j := newJoin("", "node-p", "inst-p", "key-p", storeNow(t, ctx, s))
			mustJoin(t, ctx, s, j)
			c, err := s.GetCertificate(ctx, j.Certificate.Serial)
			mustNil(t, "GetCertificate", err)
			now := storeNow(t, ctx, s)
			keyHex := fmt.Sprintf("%x", c.PublicKey)
			for i, l := range []store.Lock{
				{Kind: store.LockToken, Target: ""},          // the instance's empty token
				{Kind: store.LockInstance, Target: "node-p"}, // the node's ID as another kind
				{Kind: store.LockNode, Target: "inst-p"},
				{Kind: store.LockNode, Target: keyHex},
				{Kind: store.LockPublicKey, Target: "cd34"}, // a key not asked about
			} {
				l.ID, l.Reason, l.CreatedBy, l.CreatedAt = fmt.Sprintf("l-other-%d", i), "r", "admin", now.Add(-time.Hour)
				mustNil(t, "InsertLock", s.InsertLock(ctx, l, link(record("lock.create"))))
			}
			got, err := s.ReadRenewal(ctx, c.Serial, []string{keyHex, "ab12"})
			mustNil(t, "ReadRenewal", err)
			if got.Locked || !got.CertificateFound || !got.InstanceFound || !got.NodeFound {
				t.Fatalf("ReadRenewal = %+v: want the record, instance and node, no lock", got)
			}
			// The record's key, named again among keys: found, as
			// FindAnyLock finds it at its first position.
			key := store.Lock{ID: "l-key", Kind: store.LockPublicKey, Target: keyHex, Reason: "r", CreatedBy: "admin",
				CreatedAt: now.Add(-time.Hour)}
			second := store.Lock{ID: "l-ab12", Kind: store.LockPublicKey, Target: "ab12", Reason: "r", CreatedBy: "admin",
				CreatedAt: now.Add(-2 * time.Hour)}
			mustNil(t, "InsertLock", s.InsertLock(ctx, second, link(record("lock.create"))))
			mustNil(t, "InsertLock", s.InsertLock(ctx, key, link(record("lock.create"))))
			want, err := s.FindAnyLock(ctx, store.RenewalLockTargets(c, got.Instance, []string{keyHex, "ab12"}))
			mustNil(t, "FindAnyLock", err)
			got, err = s.ReadRenewal(ctx, c.Serial, []string{keyHex, "ab12"})
			mustNil(t, "ReadRenewal", err)
			if !got.Locked || got.Lock.ID != "l-key" || want.ID != "l-key" {
				t.Errorf("ReadRenewal lock %+v (locked %v), FindAnyLock %s: want l-key", got.Lock, got.Locked, want.ID)
			}
		}},
		{"unknown serial reads nothing", func(t *testing.T, ctx context.Context, s store.Store) {
			setup(t, ctx, s)
			got, err := s.ReadRenewal(ctx, "00ff", nil)
			mustNil(t, "ReadRenewal", err)
			wantEqual(t, "ReadRenewal of an unknown serial", got, store.RenewalRead{})
		}},
		{"deleted node: the record and instance, no node", func(t *testing.T, ctx context.Context, s store.Store) {
			c := setup(t, ctx, s)
			mustNil(t, "DeleteNode", s.DeleteNode(ctx, "node-1", link(record("agent.delete"))))
			in, err := s.GetInstance(ctx, "inst-1")
			mustNil(t, "GetInstance", err)
			set, err := s.SignerSetID(ctx)
			mustNil(t, "SignerSetID", err)
			got, err := s.ReadRenewal(ctx, c.Serial, nil)
			mustNil(t, "ReadRenewal", err)
			wantEqual(t, "ReadRenewal after DeleteNode", got,
				store.RenewalRead{Certificate: c, CertificateFound: true, Instance: in, InstanceFound: true, SignerSet: set})
		}},
		{"the verifier set's ID is the one in force at the read, as SignerSetID reads it", func(t *testing.T, ctx context.Context, s store.Store) {
			c := setup(t, ctx, s)
			before, err := s.ReadRenewal(ctx, c.Serial, nil)
			mustNil(t, "ReadRenewal", err)
			if before.SignerSet.Version != 0 {
				t.Fatalf("ReadRenewal before any signer: set %+v, want version 0", before.SignerSet)
			}
			v, err := s.ApplySignerChanges(ctx, idAt(t, ctx, s, 0), []store.SignerChange{insert(signerRow("v1", store.SignerStaged, 0))}, stepLink)
			mustNil(t, "ApplySignerChanges", err)
			want, err := s.SignerSetID(ctx)
			mustNil(t, "SignerSetID", err)
			got, err := s.ReadRenewal(ctx, c.Serial, nil)
			mustNil(t, "ReadRenewal", err)
			if got.SignerSet != want || got.SignerSet.Version != v {
				t.Errorf("ReadRenewal after a step to %d: set %+v, SignerSetID %+v", v, got.SignerSet, want)
			}
			// A lock and a deleted node change nothing of it.
			mustNil(t, "InsertLock", s.InsertLock(ctx, store.Lock{ID: "l-n", Kind: store.LockNode, Target: "node-1",
				Reason: "r", CreatedBy: "admin", CreatedAt: storeNow(t, ctx, s).Add(-time.Hour)}, link(record("lock.create"))))
			mustNil(t, "DeleteNode", s.DeleteNode(ctx, "node-1", link(record("agent.delete"))))
			got, err = s.ReadRenewal(ctx, c.Serial, nil)
			mustNil(t, "ReadRenewal", err)
			if !got.Locked || got.NodeFound || got.SignerSet != want {
				t.Errorf("ReadRenewal locked and deleted = %+v: want the lock, no node, set %+v", got, want)
			}
			// An unknown serial reads nothing, not even the set.
			got, err = s.ReadRenewal(ctx, "00ff", nil)
			mustNil(t, "ReadRenewal", err)
			wantEqual(t, "ReadRenewal of an unknown serial", got, store.RenewalRead{})
		}},
	}
}

package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// carried is in advanced to generation gen with a certificate issued at
// issued, as the store a restore replaced holds it.
func carried(in store.Instance, gen int64, issued time.Time) (store.Instance, store.Certificate) {
	r := renewalOf(store.Instance{ID: in.ID, NodeID: in.NodeID, JoinMethod: in.JoinMethod, TokenID: in.TokenID, Generation: gen - 1}, "carried", issued)
	out := in
	out.Generation, out.LastSerial, out.LastPublicKey, out.LastChainPEM, out.LastIssuedAt = gen, r.Certificate.Serial, r.Certificate.PublicKey, r.ChainPEM, issued
	return out, r.Certificate
}

func carryCases() []testCase {
	return []testCase{
		{"carry advances the instance only while it is as read", func(t *testing.T, ctx context.Context, s store.Store) {
			_, held := admit(t, ctx, s, "node-1", "i1", at(0))
			in, cert := carried(held, 3, at(time.Hour))
			stale := held
			stale.Generation = 2
			before := snapshot(t, ctx, s, "node-1")
			seq := auditSeq(t, ctx, s)
			err := s.CarryIdentity(ctx, store.CarriedIdentity{Instance: in, Certificate: cert, Held: &stale}, link(record("store.reapply")))
			wantErr(t, "CarryIdentity from a generation not held", err, store.ErrConflict)
			wantEqual(t, "after the refused carry", snapshot(t, ctx, s, "node-1"), before)
			if after := auditSeq(t, ctx, s); after != seq {
				t.Errorf("the refused carry appended records %d to %d", seq+1, after)
			}
			mustNil(t, "CarryIdentity", s.CarryIdentity(ctx, store.CarriedIdentity{Instance: in, Certificate: cert, Held: &held}, link(record("store.reapply"))))
			got, err := s.GetInstance(ctx, "i1")
			mustNil(t, "GetInstance", err)
			wantEqual(t, "the instance carried", got, in)
			c, err := s.GetCertificate(ctx, cert.Serial)
			mustNil(t, "GetCertificate", err)
			wantEqual(t, "the certificate carried", c, cert)
			if after := auditSeq(t, ctx, s); after != seq+1 {
				t.Errorf("the carry appended records %d to %d, want one", seq+1, after)
			}
			// Again from the same read: the instance moved on.
			wantErr(t, "CarryIdentity twice", s.CarryIdentity(ctx, store.CarriedIdentity{Instance: in, Certificate: cert, Held: &held}, link(record("store.reapply"))), store.ErrConflict)
			// Never backwards, even from the instance as it is now.
			back, backCert := carried(held, 2, at(2*time.Hour))
			wantErr(t, "CarryIdentity to an older generation", s.CarryIdentity(ctx, store.CarriedIdentity{Instance: back, Certificate: backCert, Held: &got}, link(record("store.reapply"))), store.ErrConflict)
			wantEqual(t, "after the refused carries", snapshot(t, ctx, s, "node-1").Instances["node-1"], []store.Instance{in})
			// Not into a deleted node's instance.
			mustNil(t, "DeleteNode", s.DeleteNode(ctx, "node-1", link(record("agent.delete"))))
			next, nextCert := carried(held, 4, at(3*time.Hour))
			wantErr(t, "CarryIdentity into a deleted node", s.CarryIdentity(ctx, store.CarriedIdentity{Instance: next, Certificate: nextCert, Held: &got}, link(record("store.reapply"))), store.ErrConflict)
			gone := held
			gone.ID = "i-gone"
			goneIn, goneCert := carried(gone, 1, at(time.Hour))
			wantErr(t, "CarryIdentity of no instance", s.CarryIdentity(ctx, store.CarriedIdentity{Instance: goneIn, Certificate: goneCert, Held: &gone}, link(record("store.reapply"))), store.ErrNotFound)
		}},
		{"carry inserts a node joined since only while its IDs are free", func(t *testing.T, ctx context.Context, s store.Store) {
			admit(t, ctx, s, "node-1", "i1", at(0))
			joined := store.Instance{ID: "i2", NodeID: "node-2", JoinMethod: "token", TokenID: "t-i2", State: store.InstanceCurrent, CreatedAt: at(time.Hour)}
			in, cert := carried(joined, 1, at(2*time.Hour))
			n := store.Node{ID: "node-2", JoinMethod: "token", TokenID: "t-i2", InstanceID: "i2", CreatedAt: at(time.Hour), UpdatedAt: at(time.Hour)}
			mustNil(t, "CarryIdentity", s.CarryIdentity(ctx, store.CarriedIdentity{Instance: in, Certificate: cert, Node: n}, link(record("store.reapply"))))
			gotNode, err := s.GetNode(ctx, "node-2")
			mustNil(t, "GetNode", err)
			wantEqual(t, "the node carried", gotNode, n)
			got, err := s.GetInstance(ctx, "i2")
			mustNil(t, "GetInstance", err)
			wantEqual(t, "the instance carried", got, in)
			c, err := s.GetCertificate(ctx, cert.Serial)
			mustNil(t, "GetCertificate", err)
			wantEqual(t, "the certificate carried", c, cert)

			// The node ID held by another node (node-1, instance i1).
			taken := store.Instance{ID: "i3", NodeID: "node-1", JoinMethod: "token", TokenID: "t-i3", State: store.InstanceCurrent, CreatedAt: at(time.Hour)}
			tin, tcert := carried(taken, 1, at(2*time.Hour))
			tn := store.Node{ID: "node-1", JoinMethod: "token", TokenID: "t-i3", InstanceID: "i3", CreatedAt: at(time.Hour), UpdatedAt: at(time.Hour)}
			before := snapshot(t, ctx, s, "node-1", "node-2")
			seq := auditSeq(t, ctx, s)
			wantErr(t, "CarryIdentity of a node ID held", s.CarryIdentity(ctx, store.CarriedIdentity{Instance: tin, Certificate: tcert, Node: tn}, link(record("store.reapply"))), store.ErrConflict)
			wantErr(t, "CarryIdentity twice", s.CarryIdentity(ctx, store.CarriedIdentity{Instance: in, Certificate: cert, Node: n}, link(record("store.reapply"))), store.ErrConflict)
			wantEqual(t, "after the refused carries", snapshot(t, ctx, s, "node-1", "node-2"), before)
			if after := auditSeq(t, ctx, s); after != seq {
				t.Errorf("the refused carries appended records %d to %d", seq+1, after)
			}
		}},
		{"retire moves an instance deleted since and inserts its certificates, for the CRL", func(t *testing.T, ctx context.Context, s store.Store) {
			now, err := s.Now(ctx)
			mustNil(t, "Now", err)
			now = now.Truncate(time.Microsecond)
			// The restored store: node-1's instance as the backup held it,
			// deleted by the node deletion re-applied.
			admit(t, ctx, s, "node-1", "i1", now.Add(-20*time.Minute))
			mustNil(t, "DeleteNode", s.DeleteNode(ctx, "node-1", link(record("agent.delete"))))
			held, err := s.GetInstance(ctx, "i1")
			mustNil(t, "GetInstance", err)
			// The store kept aside: i1 renewed twice since, then deleted.
			r2 := renewalOf(held, "k2", now.Add(-10*time.Minute))
			in2 := held
			in2.Generation, in2.LastSerial = 2, r2.Certificate.Serial
			r3 := renewalOf(in2, "k3", now.Add(-5*time.Minute))
			gone := held
			gone.State, gone.Generation, gone.LastSerial, gone.LastPublicKey, gone.LastChainPEM, gone.LastIssuedAt =
				store.InstanceDeleted, 3, r3.Certificate.Serial, r3.Certificate.PublicKey, r3.ChainPEM, r3.Certificate.IssuedAt
			r := store.RetiredIdentity{Instance: gone, Last: r3.Certificate, Certificates: []store.Certificate{r2.Certificate, r3.Certificate}, Held: &held}

			stale := held
			stale.Generation = 2
			seq := auditSeq(t, ctx, s)
			bad := r
			bad.Held = &stale
			wantErr(t, "RetireIdentity from a generation not held", s.RetireIdentity(ctx, bad, link(record("store.reapply"))), store.ErrConflict)
			if _, err := s.GetCertificate(ctx, r2.Certificate.Serial); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("the refused retire wrote certificate %s: %v", r2.Certificate.Serial, err)
			}
			if err := s.RetireIdentity(ctx, r, nil); err == nil {
				t.Error("RetireIdentity without a record: no error")
			}
			current := r
			current.Instance.State = store.InstanceCurrent
			if err := s.RetireIdentity(ctx, current, link(record("store.reapply"))); err == nil {
				t.Error("RetireIdentity to a current instance: no error")
			}
			if after := auditSeq(t, ctx, s); after != seq {
				t.Errorf("the refused retires appended records %d to %d", seq+1, after)
			}

			mustNil(t, "RetireIdentity", s.RetireIdentity(ctx, r, link(record("store.reapply"))))
			got, err := s.GetInstance(ctx, "i1")
			mustNil(t, "GetInstance", err)
			wantEqual(t, "the instance retired", got, gone)
			revoked, err := s.ListRevokedCertificates(ctx, now.Add(-15*time.Minute))
			mustNil(t, "ListRevokedCertificates", err)
			serials := map[string]bool{}
			for _, c := range revoked {
				serials[c.Serial] = c.Reason == store.RevokedReasonDeleted
			}
			for _, c := range r.Certificates {
				if !serials[c.Serial] {
					t.Errorf("the CRL's list lacks certificate %s of the deleted node: %+v", c.Serial, revoked)
				}
			}
			wantErr(t, "RetireIdentity twice", s.RetireIdentity(ctx, r, link(record("store.reapply"))), store.ErrConflict)

			// An instance made since the backup and superseded since: inserted,
			// with no node; its ID taken, refused.
			made := store.Instance{ID: "i2", NodeID: "node-2", JoinMethod: "token", TokenID: "t-i2", CreatedAt: now.Add(-time.Minute)}
			mr := renewalOf(made, "m1", now.Add(-time.Minute))
			made.State, made.Generation, made.LastSerial, made.LastPublicKey, made.LastChainPEM, made.LastIssuedAt =
				store.InstanceSuperseded, 1, mr.Certificate.Serial, mr.Certificate.PublicKey, mr.ChainPEM, mr.Certificate.IssuedAt
			m := store.RetiredIdentity{Instance: made, Last: mr.Certificate, Certificates: []store.Certificate{mr.Certificate}}
			mustNil(t, "RetireIdentity of an instance made since", s.RetireIdentity(ctx, m, link(record("store.reapply"))))
			got, err = s.GetInstance(ctx, "i2")
			mustNil(t, "GetInstance", err)
			wantEqual(t, "the instance inserted", got, made)
			if _, err := s.GetNode(ctx, "node-2"); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("node-2 after retiring its instance: %v, want none", err)
			}
			wantErr(t, "RetireIdentity of an instance held", s.RetireIdentity(ctx, m, link(record("store.reapply"))), store.ErrConflict)
		}},
		{"carry join state moves a bound-keypair token forward only while it is as read", func(t *testing.T, ctx context.Context, s store.Store) {
			insertTokens(t, ctx, s, bkToken("bot-1", "node-1", 5, store.RecoveryStandard), bkToken("bot-2", "node-2", 5, store.RecoveryStandard))
			if _, err := s.CommitJoin(ctx, bkJoin("bot-1", "node-1", "i1", at(0), register("bot-1", "key-a")...)); err != nil {
				t.Fatalf("CommitJoin: %v", err)
			}
			held := getBK(t, ctx, s, "bot-1")
			// The store kept aside: the key rotated by a refresh since.
			rotated := held
			rotated.BoundPublicKey, rotated.LastRotatedAt = "key-b", at(time.Hour)
			carry := store.CarriedJoinState{TokenID: "bot-1", Held: held, State: rotated}
			seq := auditSeq(t, ctx, s)
			stale := carry
			stale.Held.BoundPublicKey = "key-x"
			wantErr(t, "CarryJoinState from a key not bound", s.CarryJoinState(ctx, stale, link(record("store.reapply"))), store.ErrConflict)
			unknown := carry
			unknown.State.Epoch, unknown.State.RecoverySequence = "ep-unknown", 7
			wantErr(t, "CarryJoinState into an epoch the store does not know", s.CarryJoinState(ctx, unknown, link(record("store.reapply"))), store.ErrConflict)
			back := carry
			back.State.RecoverySequence = held.RecoverySequence - 1
			if err := s.CarryJoinState(ctx, back, link(record("store.reapply"))); err == nil {
				t.Error("CarryJoinState to a lower recovery sequence: no error")
			}
			if err := s.CarryJoinState(ctx, store.CarriedJoinState{TokenID: "bot-1", Held: held, State: held}, link(record("store.reapply"))); err == nil {
				t.Error("CarryJoinState of the join state held: no error")
			}
			if err := s.CarryJoinState(ctx, carry, nil); err == nil {
				t.Error("CarryJoinState without a record: no error")
			}
			wantEqual(t, "after the refused carries", getBK(t, ctx, s, "bot-1"), held)
			if after := auditSeq(t, ctx, s); after != seq {
				t.Errorf("the refused carries appended records %d to %d", seq+1, after)
			}

			mustNil(t, "CarryJoinState", s.CarryJoinState(ctx, carry, link(record("store.reapply"))))
			wantEqual(t, "the join state carried", getBK(t, ctx, s, "bot-1"), rotated)
			if after := auditSeq(t, ctx, s); after != seq+1 {
				t.Errorf("the carry appended records %d to %d, want one", seq+1, after)
			}
			// Again from the same read: the token moved on.
			wantErr(t, "CarryJoinState twice", s.CarryJoinState(ctx, carry, link(record("store.reapply"))), store.ErrConflict)

			// Into a later epoch the store knows: a recovery in a window.
			_, err := s.OpenResync(ctx, openResync("ep-1", time.Hour), epochLink("bound_keypair.resync.open"))
			mustNil(t, "OpenResync", err)
			resynced := rotated
			resynced.Epoch, resynced.RecoverySequence, resynced.BoundInstanceID, resynced.LastRecoveredAt = "ep-1", 4, "i9", at(2*time.Hour)
			mustNil(t, "CarryJoinState into a later epoch", s.CarryJoinState(ctx, store.CarriedJoinState{TokenID: "bot-1", Held: rotated, State: resynced}, link(record("store.reapply"))))
			wantEqual(t, "the join state carried into epoch ep-1", getBK(t, ctx, s, "bot-1"), resynced)
			// Never back to an epoch before the token's.
			if err := s.CarryJoinState(ctx, store.CarriedJoinState{TokenID: "bot-1", Held: resynced, State: rotated}, link(record("store.reapply"))); err == nil {
				t.Error("CarryJoinState back to the initial epoch: no error")
			}

			// A registration since: the restored secret is cleared, never set.
			held2 := getBK(t, ctx, s, "bot-2")
			reg := held2
			reg.SecretCiphertext, reg.SecretNonce = nil, nil
			reg.BoundPublicKey, reg.BoundInstanceID, reg.RecoverySequence, reg.RecoveryCount, reg.LastRecoveredAt = "key-c", "i2", 1, 1, at(time.Hour)
			mustNil(t, "CarryJoinState of a registration", s.CarryJoinState(ctx, store.CarriedJoinState{TokenID: "bot-2", Held: held2, State: reg}, link(record("store.reapply"))))
			wantEqual(t, "the registration carried", getBK(t, ctx, s, "bot-2"), reg)

			gone := carry
			gone.TokenID = "bot-gone"
			wantErr(t, "CarryJoinState of no token", s.CarryJoinState(ctx, gone, link(record("store.reapply"))), store.ErrNotFound)
		}},
		{"carry join state inserts the join-state keys the store lacks", func(t *testing.T, ctx context.Context, s store.Store) {
			old := store.JoinStateKey{ID: "js-old", PublicKey: []byte("pub-old"), Ciphertext: []byte("ct-old"), Nonce: []byte("nonce-old"), CreatedAt: at(0)}
			mustNil(t, "InsertJoinStateKey", s.InsertJoinStateKey(ctx, old))
			since := store.JoinStateKey{ID: "js-new", PublicKey: []byte("pub-new"), Ciphertext: []byte("ct-new"), Nonce: []byte("nonce-new"), CreatedAt: at(time.Hour)}
			seq := auditSeq(t, ctx, s)
			if err := s.CarryJoinState(ctx, store.CarriedJoinState{}, link(record("store.reapply"))); err == nil {
				t.Error("CarryJoinState of nothing: no error")
			}
			wantErr(t, "CarryJoinState of keys held", s.CarryJoinState(ctx, store.CarriedJoinState{Keys: []store.JoinStateKey{old}}, link(record("store.reapply"))), store.ErrConflict)
			if after := auditSeq(t, ctx, s); after != seq {
				t.Errorf("the refused carries appended records %d to %d", seq+1, after)
			}
			mustNil(t, "CarryJoinState of a key made since", s.CarryJoinState(ctx, store.CarriedJoinState{Keys: []store.JoinStateKey{old, since}}, link(record("store.reapply"))))
			ks, err := s.ListJoinStateKeys(ctx)
			mustNil(t, "ListJoinStateKeys", err)
			wantEqual(t, "the keys", ks, []store.JoinStateKey{since, old})
			if after := auditSeq(t, ctx, s); after != seq+1 {
				t.Errorf("the carry appended records %d to %d, want one", seq+1, after)
			}
			wantErr(t, "CarryJoinState of the keys again", s.CarryJoinState(ctx, store.CarriedJoinState{Keys: []store.JoinStateKey{since}}, link(record("store.reapply"))), store.ErrConflict)
		}},
		{"carry refuses parts that disagree, and no record", func(t *testing.T, ctx context.Context, s store.Store) {
			_, held := admit(t, ctx, s, "node-1", "i1", at(0))
			in, cert := carried(held, 2, at(time.Hour))
			other := cert
			other.Serial = "0bad"
			before := snapshot(t, ctx, s, "node-1")
			if err := s.CarryIdentity(ctx, store.CarriedIdentity{Instance: in, Certificate: other, Held: &held}, link(record("store.reapply"))); err == nil {
				t.Error("CarryIdentity of a certificate not the instance's last: no error")
			}
			if err := s.CarryIdentity(ctx, store.CarriedIdentity{Instance: in, Certificate: cert, Held: &held}, nil); err == nil {
				t.Error("CarryIdentity without a record: no error")
			}
			wantEqual(t, "after the refused carries", snapshot(t, ctx, s, "node-1"), before)
		}},
	}
}

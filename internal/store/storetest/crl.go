package storetest

import (
	"context"
	"encoding/hex"
	"sort"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

func crlCases() []testCase {
	return []testCase{
		{"put is conditional on the number before", func(t *testing.T, ctx context.Context, s store.Store) {
			_, err := s.GetCRL(ctx, "agent-0a")
			wantErr(t, "GetCRL of none", err, store.ErrNotFound)
			first := store.CRL{Issuer: "agent-0a", Number: 1, ThisUpdate: at(0), NextUpdate: at(time.Hour), Digest: []byte("d1"), DER: []byte("der1")}
			mustNil(t, "PutCRL 1", s.PutCRL(ctx, first, store.CRL{}))
			wantErr(t, "PutCRL 1 again", s.PutCRL(ctx, first, store.CRL{}), store.ErrConflict)
			second := store.CRL{Issuer: "agent-0a", Number: 2, ThisUpdate: at(time.Minute), NextUpdate: at(2 * time.Hour), Digest: []byte("d2"), DER: []byte("der2")}
			otherTime := first
			otherTime.ThisUpdate = at(-time.Second)
			wantErr(t, "PutCRL after a list of the stored number signed at another time", s.PutCRL(ctx, second, otherTime), store.ErrConflict)
			mustNil(t, "PutCRL 2", s.PutCRL(ctx, second, first))
			// A replica that read number 1 loses.
			third := second
			third.Number, third.DER = 2, []byte("der3")
			wantErr(t, "PutCRL after a stale read", s.PutCRL(ctx, third, first), store.ErrConflict)
			wantErr(t, "PutCRL that does not advance", s.PutCRL(ctx, third, second), store.ErrConflict)
			got, err := s.GetCRL(ctx, "agent-0a")
			mustNil(t, "GetCRL", err)
			wantEqual(t, "GetCRL", got, second)
			// Issuers are apart.
			other := first
			other.Issuer = "admin-0b"
			mustNil(t, "PutCRL of another issuer", s.PutCRL(ctx, other, store.CRL{}))
		}},
		{"revoked certificates", func(t *testing.T, ctx context.Context, s store.Store) {
			now, err := s.Now(ctx)
			mustNil(t, "Now", err)
			now = now.Truncate(time.Microsecond)
			recent := now.Add(-10 * time.Minute)
			j1, _ := admit(t, ctx, s, "node-1", "i1", recent) // node lock
			j2, _ := admit(t, ctx, s, "node-2", "i2", recent) // instance lock
			j3, _ := admit(t, ctx, s, "node-3", "i3", recent) // public-key lock
			j4, _ := admit(t, ctx, s, "node-4", "i4", recent) // deleted
			admit(t, ctx, s, "node-5", "i5", recent)          // untouched
			admit(t, ctx, s, "node-6", "i6", now.Add(-2*time.Hour))
			admit(t, ctx, s, "node-7", "i7", recent)                   // lock expired
			admit(t, ctx, s, "node-8", "i8", now.Add(-50*time.Minute)) // deleted, last issued before issuedAfter
			mustNil(t, "DeleteNode 4", s.DeleteNode(ctx, "node-4", link(record("agent.delete"))))
			mustNil(t, "DeleteNode 8", s.DeleteNode(ctx, "node-8", link(record("agent.delete"))))
			lock := func(id, kind, target string, expires time.Time) {
				mustNil(t, "InsertLock "+id, s.InsertLock(ctx, store.Lock{ID: id, Kind: kind, Target: target, CreatedBy: "test", CreatedAt: now.Add(-time.Minute), ExpiresAt: expires}, link(record("lock.create"))))
			}
			lock("l1", store.LockNode, "node-1", time.Time{})
			lock("l2", store.LockInstance, "i2", now.Add(time.Hour))
			lock("l3", store.LockPublicKey, hex.EncodeToString(j3.Certificate.PublicKey), time.Time{})
			lock("l6", store.LockNode, "node-6", time.Time{}) // its certificate expired
			lock("l7", store.LockNode, "node-7", now.Add(-time.Second))
			lock("l9", store.LockPublicKey, "not-hex", time.Time{})
			lock("la", store.LockAdmin, "alice", time.Time{})
			lock("lt", store.LockToken, "t-i5", time.Time{}) // a token lock revokes nothing
			op := func(serial string, notAfter time.Time) store.Operator {
				return store.Operator{Serial: serial, Name: "alice", SPIFFEID: "spiffe://td/admin/alice", NotBefore: notAfter.Add(-time.Hour),
					NotAfter: notAfter, CreatedBy: "test", CreatedAt: notAfter.Add(-time.Hour), Reissue: true}
			}
			mustNil(t, "InsertOperator", s.InsertOperator(ctx, op("a1", now.Add(time.Hour)), link(record("operator.add"))))
			mustNil(t, "InsertOperator expired", s.InsertOperator(ctx, op("a0", now.Add(-time.Hour)), link(record("operator.add"))))

			got, err := s.ListRevokedCertificates(ctx, recent.Add(-time.Second))
			mustNil(t, "ListRevokedCertificates", err)
			sort.Slice(got, func(a, b int) bool { return got[a].Serial < got[b].Serial })
			locked := func(c store.Certificate, reason string) store.RevokedCertificate {
				return store.RevokedCertificate{Serial: c.Serial, NotBefore: c.NotBefore, NotAfter: c.NotAfter, Reason: reason, Since: now.Add(-time.Minute)}
			}
			want := []store.RevokedCertificate{
				locked(j1.Certificate, store.LockNode), locked(j2.Certificate, store.LockInstance),
				locked(j3.Certificate, store.LockPublicKey),
				{Serial: j4.Certificate.Serial, NotBefore: j4.Certificate.NotBefore, NotAfter: j4.Certificate.NotAfter, Reason: store.RevokedReasonDeleted},
				{Serial: "a1", NotBefore: now, NotAfter: now.Add(time.Hour), Operator: true, Reason: store.LockAdmin, Since: now.Add(-time.Minute)},
			}
			sort.Slice(want, func(a, b int) bool { return want[a].Serial < want[b].Serial })
			// node-8 was deleted too, but its last certificate was issued
			// before issuedAfter: only a later bound brings it in.
			wantEqual(t, "ListRevokedCertificates", got, want)
			all, err := s.ListRevokedCertificates(ctx, now.Add(-24*time.Hour))
			mustNil(t, "ListRevokedCertificates with an earlier bound", err)
			if len(all) != len(want)+1 {
				t.Errorf("with an earlier bound: %d certificates, want %d (node-8's too)", len(all), len(want)+1)
			}
		}},
	}
}

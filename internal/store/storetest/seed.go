package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// seedLoader is the bulk loader of muster bench seed; every backend has it.
type seedLoader interface {
	LoadSeed(ctx context.Context, b store.Seed) ([]bool, error)
}

func seedCases() []testCase {
	return []testCase{
		{"rows read back as written, a taken token ID skipped", func(t *testing.T, ctx context.Context, s store.Store) {
			l, ok := s.(seedLoader)
			if !ok {
				t.Fatalf("%T has no LoadSeed", s)
			}
			used := token("used", 1, at(24*time.Hour), time.Hour)
			used.UsesCount, used.LastUsedAt = 1, at(0)
			free := token("free", 1, at(24*time.Hour), time.Hour)
			free.Labels = map[string]string{"fleet": "a"}
			inserted, err := l.LoadSeed(ctx, store.Seed{Tokens: []store.Token{used, free}})
			mustNil(t, "LoadSeed tokens", err)
			wantEqual(t, "inserted", inserted, []bool{true, true})

			in := store.Instance{ID: "inst-1", NodeID: "node-1", JoinMethod: store.JoinMethodToken, TokenID: "used",
				State: store.InstanceCurrent, CreatedAt: at(0), LastSerial: "0abc", LastPublicKey: []byte{1, 2, 3},
				LastChainPEM: []byte("chain"), LastIssuedAt: at(0)}
			node := store.Node{ID: "node-1", JoinMethod: store.JoinMethodToken, TokenID: "used", InstanceID: "inst-1",
				CreatedAt: at(0), UpdatedAt: at(0)}
			cert := store.Certificate{Serial: "0abc", NodeID: "node-1", InstanceID: "inst-1", JoinMethod: store.JoinMethodToken,
				TokenID: "used", PublicKey: []byte{1, 2, 3}, NotBefore: at(-time.Minute), NotAfter: at(time.Hour), IssuedAt: at(0)}
			_, err = l.LoadSeed(ctx, store.Seed{Instances: []store.Instance{in}, Nodes: []store.Node{node},
				Certificates: []store.Certificate{cert}})
			mustNil(t, "LoadSeed joins", err)
			// Its certificate expired long ago (at is in 2025), as a join
			// of it would count.
			wantEqual(t, "counts of the seeded node", countCerts(t, ctx, s), store.AgentCertificateCounts{Expired: 1})

			for _, want := range []store.Token{used, free} {
				got, err := s.GetToken(ctx, want.ID)
				mustNil(t, "GetToken", err)
				wantEqual(t, "GetToken", got, want)
			}
			gotNode, err := s.GetNode(ctx, "node-1")
			mustNil(t, "GetNode", err)
			wantEqual(t, "GetNode", gotNode, node)
			gotInst, err := s.GetInstance(ctx, "inst-1")
			mustNil(t, "GetInstance", err)
			wantEqual(t, "GetInstance", gotInst, in)
			gotCert, err := s.GetCertificate(ctx, "0abc")
			mustNil(t, "GetCertificate", err)
			wantEqual(t, "GetCertificate", gotCert, cert)

			// A second seed drawing a taken ID skips it and keeps the first.
			again := token("free", 5, at(48*time.Hour), 0)
			other := token("other", 1, at(24*time.Hour), 0)
			inserted, err = l.LoadSeed(ctx, store.Seed{Tokens: []store.Token{again, other}})
			mustNil(t, "LoadSeed again", err)
			wantEqual(t, "inserted again", inserted, []bool{false, true})
			got, err := s.GetToken(ctx, "free")
			mustNil(t, "GetToken", err)
			wantEqual(t, "GetToken after a collision", got, free)
		}},
	}
}

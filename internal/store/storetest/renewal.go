package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// admit joins nodeID as instanceID with a token of its own, created at
// created, and returns the join and the instance.
func admit(t *testing.T, ctx context.Context, s store.Store, nodeID, instanceID string, created time.Time) (store.Join, store.Instance) {
	t.Helper()
	insertTokens(t, ctx, s, token("t-"+instanceID, 1, time.Time{}, time.Hour))
	j := newJoin("t-"+instanceID, nodeID, instanceID, "key-"+instanceID, created)
	return j, mustJoin(t, ctx, s, j).Instance
}

// renewalOf returns the renewal of in from its generation, certifying
// pubKey(keyName), issued at issued.
func renewalOf(in store.Instance, keyName string, issued time.Time) store.Renewal {
	g := in.Generation + 1
	sn := serial(fmt.Sprintf("%s/%d/%s", in.ID, g, keyName))
	return store.Renewal{
		InstanceID:     in.ID,
		FromGeneration: in.Generation,
		ChainPEM:       []byte("chain of " + sn),
		Certificate: store.Certificate{
			Serial: sn, NodeID: in.NodeID, InstanceID: in.ID, Generation: g,
			JoinMethod: in.JoinMethod, TokenID: in.TokenID, PublicKey: pubKey(keyName),
			NotBefore: issued.Add(-time.Minute), NotAfter: issued.Add(time.Hour), IssuedAt: issued,
		},
	}
}

// renewed is in after r.
func renewed(in store.Instance, r store.Renewal) store.Instance {
	in.Generation++
	in.LastSerial, in.LastPublicKey = r.Certificate.Serial, r.Certificate.PublicKey
	in.LastChainPEM, in.LastIssuedAt = r.ChainPEM, r.Certificate.IssuedAt
	return in
}

func renewalCases() []testCase {
	cases := []testCase{
		{"advances the generation", func(t *testing.T, ctx context.Context, s store.Store) {
			j, in := admit(t, ctx, s, "node-1", "i1", at(0))
			r1 := renewalOf(in, "key-2", at(time.Hour))
			got, err := s.CommitRenewal(ctx, r1)
			mustNil(t, "CommitRenewal 1", err)
			wantEqual(t, "CommitRenewal 1", got, renewed(in, r1))
			r2 := renewalOf(got, "key-3", at(2*time.Hour))
			got, err = s.CommitRenewal(ctx, r2)
			mustNil(t, "CommitRenewal 2", err)
			wantEqual(t, "CommitRenewal 2", got, renewed(renewed(in, r1), r2))
			if got.Generation != 2 {
				t.Errorf("Generation = %d after two renewals, want 2", got.Generation)
			}

			stored, err := s.GetInstance(ctx, "i1")
			mustNil(t, "GetInstance", err)
			wantEqual(t, "GetInstance", stored, got)
			c, err := s.GetCertificate(ctx, r1.Certificate.Serial)
			mustNil(t, "GetCertificate", err)
			wantEqual(t, "GetCertificate", c, r1.Certificate)
			cs, err := s.ListCertificates(ctx, "node-1")
			mustNil(t, "ListCertificates", err)
			wantEqual(t, "ListCertificates", cs, []store.Certificate{j.Certificate, r1.Certificate, r2.Certificate})
		}},
		{"concurrent renewals from one generation", func(t *testing.T, ctx context.Context, s store.Store) {
			const renewers = 10
			_, in := admit(t, ctx, s, "node-1", "i1", at(0))
			rs := make([]store.Renewal, renewers)
			for i := range rs {
				rs[i] = renewalOf(in, fmt.Sprintf("key-%d", i), at(time.Hour))
			}
			errs := concurrently(renewers, func(i int) error {
				_, err := s.CommitRenewal(ctx, rs[i])
				return err
			})
			ok, conflicts := tally(t, errs, store.ErrConflict)
			if ok != 1 || conflicts != renewers-1 {
				t.Fatalf("%d renewals succeeded and %d conflicted, want 1 and %d", ok, conflicts, renewers-1)
			}
			var winner store.Renewal
			for i, err := range errs {
				if err == nil {
					winner = rs[i]
				}
			}
			got, err := s.GetInstance(ctx, "i1")
			mustNil(t, "GetInstance", err)
			wantEqual(t, "GetInstance", got, renewed(in, winner))
			cs, err := s.ListCertificates(ctx, "node-1")
			mustNil(t, "ListCertificates", err)
			if len(cs) != 2 {
				t.Errorf("ListCertificates returned %d certificates, want 2", len(cs))
			}
		}},
	}

	// Each failure sets up node-1 and returns the renewal to try, which
	// must fail with want and write nothing.
	failures := []struct {
		name  string
		setup func(t *testing.T, ctx context.Context, s store.Store) store.Renewal
		want  error
	}{
		{
			name: "stale generation",
			setup: func(t *testing.T, ctx context.Context, s store.Store) store.Renewal {
				_, in := admit(t, ctx, s, "node-1", "i1", at(0))
				_, err := s.CommitRenewal(ctx, renewalOf(in, "key-2", at(time.Hour)))
				mustNil(t, "CommitRenewal", err)
				return renewalOf(in, "key-3", at(time.Hour))
			},
			want: store.ErrConflict,
		},
		{
			name: "future generation",
			setup: func(t *testing.T, ctx context.Context, s store.Store) store.Renewal {
				_, in := admit(t, ctx, s, "node-1", "i1", at(0))
				in.Generation = 5
				return renewalOf(in, "key-2", at(time.Hour))
			},
			want: store.ErrConflict,
		},
		{
			name: "superseded instance",
			setup: func(t *testing.T, ctx context.Context, s store.Store) store.Renewal {
				_, in := admit(t, ctx, s, "node-1", "i1", at(0))
				insertTokens(t, ctx, s, token("b", 1, time.Time{}, 0))
				j := newJoin("b", "node-1", "i2", "key-2", at(time.Minute))
				j.MaySupersede = true
				mustJoin(t, ctx, s, j)
				return renewalOf(in, "key-3", at(time.Hour))
			},
			want: store.ErrConflict,
		},
		{
			name: "deleted instance",
			setup: func(t *testing.T, ctx context.Context, s store.Store) store.Renewal {
				_, in := admit(t, ctx, s, "node-1", "i1", at(0))
				mustNil(t, "DeleteNode", s.DeleteNode(ctx, "node-1", link(record("agent.delete"))))
				return renewalOf(in, "key-2", at(time.Hour))
			},
			want: store.ErrConflict,
		},
		{
			name: "unknown instance",
			setup: func(t *testing.T, ctx context.Context, s store.Store) store.Renewal {
				admit(t, ctx, s, "node-1", "i1", at(0))
				return renewalOf(store.Instance{ID: "nope", NodeID: "node-1", JoinMethod: store.JoinMethodToken}, "key-2", at(time.Hour))
			},
			want: store.ErrNotFound,
		},
		{
			name: "duplicate serial",
			setup: func(t *testing.T, ctx context.Context, s store.Store) store.Renewal {
				j, in := admit(t, ctx, s, "node-1", "i1", at(0))
				r := renewalOf(in, "key-2", at(time.Hour))
				r.Certificate.Serial = j.Certificate.Serial
				return r
			},
			want: store.ErrConflict,
		},
	}
	for _, f := range failures {
		cases = append(cases, testCase{f.name, func(t *testing.T, ctx context.Context, s store.Store) {
			r := f.setup(t, ctx, s)
			before := snapshot(t, ctx, s, "node-1")
			beforeInstance, beforeErr := s.GetInstance(ctx, r.InstanceID)
			_, err := s.CommitRenewal(ctx, r)
			wantErr(t, "CommitRenewal", err, f.want)
			wantEqual(t, "state after a failed renewal", snapshot(t, ctx, s, "node-1"), before)
			afterInstance, afterErr := s.GetInstance(ctx, r.InstanceID)
			wantEqual(t, "instance after a failed renewal", afterInstance, beforeInstance)
			if (beforeErr == nil) != (afterErr == nil) {
				t.Errorf("GetInstance before: %v, after: %v", beforeErr, afterErr)
			}
		}})
	}
	return cases
}

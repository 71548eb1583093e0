package authority

import (
	"context"
	"testing"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/muster-dev/muster/internal/signer"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestSignerStepsNameKeyCustody: the answer to each lifecycle step names
// where each changed signer's key lives, as muster signer list does
// (stage and activate printed "-" where list printed "sealed").
func TestSignerStepsNameKeyCustody(t *testing.T) {
	b := startReplicas(t, nil, 1, noCAClock)
	a := &adminService{s: b.srvs[0]}
	ctx := t.Context()
	steps := []struct {
		name string
		step func(context.Context) (*musterv1.SignerChangeResponse, error)
	}{
		{"stage", func(ctx context.Context) (*musterv1.SignerChangeResponse, error) {
			return a.StageSigner(ctx, &musterv1.StageSignerRequest{EffectiveIn: durationpb.New(defaultSignerEffectiveIn)})
		}},
		{"activate", func(ctx context.Context) (*musterv1.SignerChangeResponse, error) {
			return a.ActivateSigner(ctx, &musterv1.ActivateSignerRequest{})
		}},
		{"rollback", func(ctx context.Context) (*musterv1.SignerChangeResponse, error) {
			return a.RollbackSigner(ctx, &musterv1.RollbackSignerRequest{})
		}},
		{"activate again", func(ctx context.Context) (*musterv1.SignerChangeResponse, error) {
			return a.ActivateSigner(ctx, &musterv1.ActivateSignerRequest{})
		}},
		{"retire", func(ctx context.Context) (*musterv1.SignerChangeResponse, error) {
			return a.RetireSigner(ctx, &musterv1.RetireSignerRequest{})
		}},
	}
	for _, s := range steps {
		resp, err := s.step(ctx)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		list, err := a.ListSigners(ctx, &musterv1.ListSignersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		listed := map[string]string{}
		for _, l := range list.GetSigners() {
			listed[l.GetVersionId()] = l.GetKeyCustody()
		}
		if len(resp.GetChanged()) == 0 {
			t.Fatalf("%s changed nothing", s.name)
		}
		for _, c := range resp.GetChanged() {
			// An ended signer's key goes with the step that ends it.
			kept := "sealed"
			if st := c.GetState(); st == "retired" || st == "revoked" {
				kept = signer.KeyDestroyed
			}
			if got, want := c.GetKeyCustody(), listed[c.GetVersionId()]; got != want || got != kept {
				t.Errorf("%s: %s (%s) key custody %q, signer list says %q; want both %s", s.name, c.GetVersionId(), c.GetState(), got, want, kept)
			}
		}
	}
}

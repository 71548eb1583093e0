package authority

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestLockedAgentRefusalsAudited: a locked agent's calls that do not go
// through enrollment (JWT-SVIDs, the JWKS, the verifier set, the stream)
// are refused with the lock's reason and each refusal is in the audit
// log, naming the method.
func TestLockedAgentRefusalsAudited(t *testing.T) {
	a := startBench(t)
	ctx := t.Context()
	conn := a.dial(a.joinedIdentity(t, "locked-1"))
	defer conn.Close()
	agent := musterv1.NewAgentServiceClient(conn)
	if _, err := agent.MintJWTSVID(ctx, &musterv1.MintJWTSVIDRequest{Audience: []string{"db"}}); err != nil {
		t.Fatalf("mint before the lock: %v", err)
	}
	if err := a.store.InsertLock(ctx, store.Lock{ID: "l-standing", Kind: store.LockNode, Target: "locked-1", Reason: "r",
		CreatedBy: "admin", CreatedAt: time.Now()}, setupLink); err != nil {
		t.Fatal(err)
	}
	calls := map[string]func() error{
		"/muster.v1.AgentService/MintJWTSVID": func() error {
			_, err := agent.MintJWTSVID(ctx, &musterv1.MintJWTSVIDRequest{Audience: []string{"db"}})
			return err
		},
		"/muster.v1.AgentService/GetJWTBundle": func() error {
			_, err := agent.GetJWTBundle(ctx, &musterv1.GetJWTBundleRequest{})
			return err
		},
		"/muster.v1.AgentService/GetVerifierSet": func() error {
			_, err := agent.GetVerifierSet(ctx, &musterv1.GetVerifierSetRequest{})
			return err
		},
		"/muster.v1.AgentService/Connect": func() error {
			s, err := agent.Connect(ctx)
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		},
	}
	for method, call := range calls {
		if err := call(); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s by a locked agent: %v, want PERMISSION_DENIED", method, err)
		}
		recs, err := a.store.ListAudit(ctx, store.AuditFilter{Action: "api.access"})
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, r := range recs {
			if r.Target == method && r.Result == audit.ResultDenied && r.Actor != "" && r.Reason != "" {
				found = true
			}
		}
		if !found {
			t.Errorf("no api.access denial audited for %s", method)
		}
	}
}

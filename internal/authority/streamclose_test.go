package authority

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestStreamClosuresAudited: when the authority closes an open agent
// stream for a lock the closure is audited as agent.stream_close with its
// reason; it was only logged. The certificate's expiry, the routine end
// of every stream (the agent renewed at half-life and opened its next
// one), is not: it would be a denied record per agent per lifetime.
func TestStreamClosuresAudited(t *testing.T) {
	for _, c := range []struct {
		name   string
		ttl    time.Duration
		close  func(t *testing.T, a *benchAuthority, node string)
		code   codes.Code
		reason string
	}{
		{"lock", 0, func(t *testing.T, a *benchAuthority, node string) {
			if err := a.store.InsertLock(t.Context(), store.Lock{ID: "l-" + node, Kind: store.LockNode, Target: node, Reason: "r",
				CreatedBy: "admin", CreatedAt: time.Now()}, setupLink); err != nil {
				t.Fatal(err)
			}
		}, codes.PermissionDenied, "locked"},
		{"certificate expiry", 5 * time.Second, func(*testing.T, *benchAuthority, string) {}, codes.Unauthenticated, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := startReplicas(t, nil, 1, func(cfg *Config) {
				if c.ttl > 0 {
					cfg.AgentCertTTL = c.ttl
				}
			})
			ctx := t.Context()
			node := "closed-" + strings.ReplaceAll(c.name, " ", "-")
			conn := a.dial(a.joinedIdentity(t, node))
			defer conn.Close()
			stream, err := musterv1.NewAgentServiceClient(conn).Connect(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := stream.Recv(); err != nil {
				t.Fatalf("first message: %v", err)
			}
			c.close(t, a, node)
			ended := make(chan error, 1)
			go func() {
				for {
					if _, err := stream.Recv(); err != nil {
						ended <- err
						return
					}
				}
			}()
			select {
			case err := <-ended:
				if status.Code(err) != c.code {
					t.Fatalf("stream ended with %v, want %s", err, c.code)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the stream was not closed within 30 s")
			}
			recs, err := a.store.ListAudit(ctx, store.AuditFilter{Action: "agent.stream_close"})
			if err != nil {
				t.Fatal(err)
			}
			if c.reason == "" {
				if len(recs) != 0 {
					t.Fatalf("agent.stream_close records %+v; want none", recs)
				}
				return
			}
			if len(recs) != 1 || recs[0].Target != node || recs[0].Result != audit.ResultDenied ||
				!strings.Contains(recs[0].Reason, c.reason) || !strings.Contains(recs[0].Actor, "/agent/"+node) {
				t.Fatalf("agent.stream_close records %+v; want one for %s naming %q", recs, node, c.reason)
			}
		})
	}
}

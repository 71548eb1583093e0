package authority

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestBadNodeNameSaysWhatIsWrong: a node or operator name an admin call
// cannot take (agents delete and show, lock create --node and --admin)
// is refused saying what in it breaks the rule, the rule, and the
// command that lists the names there are, in the answer and in the
// audit record. Before, it was an "invalid SPIFFE ID", which the
// operator never typed (walked: muster agents delete Web_1).
func TestBadNodeNameSaysWhatIsWrong(t *testing.T) {
	t.Parallel()
	b := startBench(t)
	ctx := context.WithValue(t.Context(), callerKey{}, Caller{CorrelationID: "corr-badname"})
	a := &adminService{s: b.srvs[0]}
	for _, c := range []struct {
		what, action string
		call         func() error
		want         []string
	}{
		{"agents delete", "agent.delete", func() error {
			_, err := a.DeleteAgent(ctx, &musterv1.DeleteAgentRequest{NodeId: "Web_1"})
			return err
		}, []string{`node "Web_1" is not a valid node name: it has the capital 'W'`, spiffeid.NameRule, "muster agents list"}},
		{"agents show", "agent.get", func() error {
			_, err := a.GetAgent(ctx, &musterv1.GetAgentRequest{NodeId: "web_1"})
			return err
		}, []string{`node "web_1" is not a valid node name: it has '_', which is not one of a-z 0-9 . -`, spiffeid.NameRule, "muster agents list"}},
		{"lock create --node", "lock.create", func() error {
			_, err := a.CreateLock(ctx, &musterv1.CreateLockRequest{Kind: store.LockNode, Target: "web-1-"})
			return err
		}, []string{`lock node target "web-1-" is not a valid node name: it ends with '-'`, spiffeid.NameRule, "muster agents list"}},
		{"lock create --admin", "lock.create", func() error {
			_, err := a.CreateLock(ctx, &musterv1.CreateLockRequest{Kind: store.LockAdmin, Target: "Alice"})
			return err
		}, []string{`lock admin target "Alice" is not a valid operator name: it has the capital 'A'`, spiffeid.NameRule, "muster admin list"}},
	} {
		err := c.call()
		msg := status.Convert(err).Message()
		if status.Code(err) != codes.InvalidArgument || strings.Contains(msg, "SPIFFE") {
			t.Errorf("%s: %v; want INVALID_ARGUMENT about the name, not a SPIFFE ID", c.what, err)
		}
		for _, w := range c.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: %q does not say %q", c.what, msg, w)
			}
		}
		recs, lerr := b.store.ListAudit(t.Context(), store.AuditFilter{Action: c.action})
		if lerr != nil {
			t.Fatal(lerr)
		}
		if n := len(recs); n == 0 || recs[n-1].Result != audit.ResultDenied || recs[n-1].Reason != msg {
			t.Errorf("%s: the last %s record is not the refusal with its answer %q: %+v", c.what, c.action, msg, recs)
		}
	}
}

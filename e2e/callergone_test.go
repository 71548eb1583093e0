package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestClientGoneMidJoinIsAudited: token joins whose deadline passes while
// the authority works on them (deadlines swept from 0.2 to 3.2 ms, so some
// end before the call arrives, some mid-call and some after the answer)
// are answered DEADLINE_EXCEEDED and audited with a reason that says so,
// never as an internal error of the authority; the authority serves on.
func TestClientGoneMidJoinIsAudited(t *testing.T) {
	dir, _ := initDir(t)
	e := &joinEnv{dir: dir, auth: startAuthority(t, dir, "--trusted-proxy", "127.0.0.1")}
	e.setup(t)
	tok := e.token(t, "--uses", "0")
	_, csr := csrFor(t, "")
	codesSeen := map[codes.Code]int{}
	for i := range 60 {
		// Each call from its own source (behind the trusted proxy), so
		// the rate limit is not what answers.
		c := musterv1.NewBootstrapServiceClient(e.dialFrom(t, fmt.Sprintf("192.0.2.%d", 1+i), nil))
		// The connection first, so that its handshake is not what the
		// deadline cuts short.
		if _, err := c.GetTrustBundle(context.Background(), &musterv1.GetTrustBundleRequest{TokenId: "zzzzzz"}); err != nil {
			t.Fatal(err)
		}
		deadline := 200*time.Microsecond + time.Duration(i)*50*time.Microsecond
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		_, err := c.ExchangeJoinToken(ctx, &musterv1.ExchangeJoinTokenRequest{JoinToken: tok, NodeId: fmt.Sprintf("gone-%d", i), Csr: csr})
		cancel()
		codesSeen[status.Code(err)]++
		if code := status.Code(err); code != codes.OK && code != codes.DeadlineExceeded {
			t.Errorf("join with a %v deadline: %v", deadline, err)
		}
	}
	// The server side of a call can still be finishing: wait for its record.
	time.Sleep(500 * time.Millisecond)
	var recs []struct {
		Result string `json:"result"`
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "audit", "list", "--data", dir, "--action", "agent.join", "-o", "json")), &recs); err != nil {
		t.Fatal(err)
	}
	gone := 0
	for _, r := range recs {
		switch {
		case r.Result == "ok":
		case r.Result == "error" && (strings.HasPrefix(r.Reason, "deadline_exceeded") || strings.HasPrefix(r.Reason, "canceled")):
			gone++
		default:
			t.Errorf("agent.join audited %s %q", r.Result, r.Reason)
		}
	}
	t.Logf("answers by code: %v; %d joins audited as the caller gone, %d records", codesSeen, gone, len(recs))
	if gone == 0 {
		t.Errorf("no join was cut short mid-call (answers %v): the sweep of deadlines tested nothing", codesSeen)
	}
	e.join(t, e.token(t), "after-the-deadlines")
	if !strings.Contains(mustRun(t, "audit", "verify", "--data", dir), "intact") {
		t.Error("audit verify does not say intact")
	}
}

package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestListsArePaged seeds a few thousand tokens and a few hundred nodes and
// lists them through the binary with small pages: every item comes back
// once, in order; --limit stops early; and the API refuses a bad page size
// or a page token that is not one it issued for that list, with
// INVALID_ARGUMENT and an audited refusal.
func TestListsArePaged(t *testing.T) {
	t.Parallel()
	const tokens, nodes = 3000, 300
	dir, _ := initDir(t)
	if r := muster(t, nil, "bench", "seed", "--data", dir, "--tokens", "3000", "--nodes", "300"); r.code != 0 {
		t.Fatalf("bench seed: exit %d\n%s", r.code, r.stderr)
	}
	a := startAuthority(t, dir)

	var toks []struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "token", "list", "--data", dir, "--page-size", "7", "-o", "json")), &toks); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, tok := range toks {
		if seen[tok.ID] {
			t.Errorf("token %s listed twice", tok.ID)
		}
		seen[tok.ID] = true
	}
	// init creates no token: the seeded ones are all there is.
	if len(seen) != tokens {
		t.Errorf("token list --page-size 7: %d distinct tokens, want %d", len(seen), tokens)
	}
	table := mustRun(t, "token", "list", "--data", dir)
	if got := strings.Count(table, "\n"); got != tokens+1 {
		t.Errorf("token list table: %d lines, want a header and %d tokens", got, tokens)
	}
	if got := strings.Count(mustRun(t, "token", "list", "--data", dir, "--limit", "10", "--page-size", "3"), "\n"); got != 11 {
		t.Errorf("token list --limit 10: %d lines, want a header and 10 tokens", got)
	}

	var agents []struct {
		Node string `json:"node"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "agents", "list", "--data", dir, "--page-size", "13", "-o", "json")), &agents); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(agents); i++ {
		if agents[i-1].Node >= agents[i].Node {
			t.Errorf("agents list: %s before %s, want ascending unique node IDs", agents[i-1].Node, agents[i].Node)
		}
	}
	if len(agents) != nodes {
		t.Errorf("agents list --page-size 13: %d agents, want %d", len(agents), nodes)
	}

	c := operatorAdmin(t, dir, a.addr)
	// A client that sends no page size may not page (one from before
	// paging): a list longer than one page is refused, never cut short.
	_, err := c.ListTokens(t.Context(), &musterv1.ListTokensRequest{})
	wantCode(t, err, codes.FailedPrecondition, "more than 500 tokens: the list must be read in pages")
	_, err = c.ListAgents(t.Context(), &musterv1.ListAgentsRequest{})
	if nodes > 500 {
		wantCode(t, err, codes.FailedPrecondition, "more than 500 agents")
	} else if err != nil {
		t.Fatalf("ListAgents of %d agents with no page size: %v; want the whole list", nodes, err)
	}
	first, err := c.ListTokens(t.Context(), &musterv1.ListTokensRequest{PageToken: pageOf(t, c)})
	if err != nil || len(first.GetTokens()) != 500 || first.GetNextPageToken() == "" {
		t.Fatalf("ListTokens with a page token and no page size: %d tokens, next %q, %v; want the default 500 and a next page", len(first.GetTokens()), first.GetNextPageToken(), err)
	}
	agentPage, err := c.ListAgents(t.Context(), &musterv1.ListAgentsRequest{PageSize: 2})
	if err != nil || agentPage.GetNextPageToken() == "" {
		t.Fatalf("ListAgents page of 2: %v, %v", agentPage, err)
	}
	for _, tt := range []struct {
		name string
		req  *musterv1.ListTokensRequest
		want string
	}{
		{"page size too large", &musterv1.ListTokensRequest{PageSize: 1001}, "page_size 1001 is out of range"},
		{"negative page size", &musterv1.ListTokensRequest{PageSize: -1}, "page_size -1 is out of range"},
		{"garbage page token", &musterv1.ListTokensRequest{PageToken: "not a token"}, "page token is not valid"},
		{"another list's page token", &musterv1.ListTokensRequest{PageToken: agentPage.GetNextPageToken()}, "page token is not valid"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.ListTokens(t.Context(), tt.req)
			wantCode(t, err, codes.InvalidArgument, tt.want)
		})
	}
	_, err = c.ListAgents(t.Context(), &musterv1.ListAgentsRequest{PageToken: first.GetNextPageToken()})
	wantCode(t, err, codes.InvalidArgument, "page token is not valid")
	// Refusals reach the audit chain shortly after the answer.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		out := mustRun(t, "audit", "list", "--data", dir, "--action", "token.list", "-o", "json")
		if strings.Contains(out, "page_size 1001") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the refused page size was not audited:\n%s", out)
		}
	}
	if got := mustFail(t, "token", "list", "--data", dir, "--page-size", "5000"); !strings.Contains(got, "--page-size 5000 is out of range") {
		t.Errorf("token list --page-size 5000: %q", got)
	}
}

// pageOf is the page token after the first token: a call carrying a page
// token pages, so its default page size applies.
func pageOf(t *testing.T, c musterv1.AdminServiceClient) string {
	t.Helper()
	p, err := c.ListTokens(t.Context(), &musterv1.ListTokensRequest{PageSize: 1})
	if err != nil || p.GetNextPageToken() == "" {
		t.Fatalf("ListTokens page of 1: %v, %v", p, err)
	}
	return p.GetNextPageToken()
}

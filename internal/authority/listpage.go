package authority

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/pagetoken"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// Page sizes of the list calls. The largest page of either list stays far
// below gRPC's 4 MiB message limit (a token is about 100 bytes on the
// wire, an agent a few hundred).
const (
	defaultPageSize = 500
	maxPageSize     = 1000
)

// pageSize reads a request's page_size: 0 is the default.
//
// A first call without a page_size is also what a client from before
// paging sends, and it cannot see next_page_token: answering it with the
// first page alone would show an operator a list silently cut short (a
// token missing from `token list` reads as a token that does not exist).
// So such a call gets the whole list while it fits one default page, and
// a refusal that says how to page when it does not (unpaged).
func pageSize(n int32) (int, error) {
	switch {
	case n == 0:
		return defaultPageSize, nil
	case n < 0 || n > maxPageSize:
		return 0, badRequest(fmt.Sprintf("page_size %d is out of range: pass 1 to %d, or 0 for the default (%d)", n, maxPageSize, defaultPageSize))
	}
	return int(n), nil
}

// pagedRequest is a list request that may page.
type pagedRequest interface {
	GetPageSize() int32
	GetPageToken() string
}

// unpaged says a request asked for neither a page size nor a page: a
// client that may not page (see pageSize).
func unpaged(req pagedRequest) bool { return req.GetPageSize() == 0 && req.GetPageToken() == "" }

// tooManyToList refuses an unpaged list longer than one page.
func tooManyToList(what string, size int) error {
	return refused(codes.FailedPrecondition, fmt.Sprintf(
		"more than %d %s: the list must be read in pages — pass page_size (1 to %d) and follow next_page_token; a muster CLI from before paging does not, upgrade it", size, what, maxPageSize))
}

// pageCursor decodes a request's page_token for list; the empty token
// starts at the beginning. validID checks the cursor's ID as the list's
// items are named, so a forged cursor is as constrained as a real one.
func pageCursor(list pagetoken.List, token string, validID func(string) bool) (pagetoken.Cursor, error) {
	if token == "" {
		return pagetoken.Cursor{}, nil
	}
	c, err := pagetoken.Decode(list, token)
	if err == nil && !validID(c.ID) {
		err = pagetoken.ErrInvalid
	}
	if err != nil {
		return pagetoken.Cursor{}, badRequest(err.Error())
	}
	return c, nil
}

func (a *adminService) ListTokens(ctx context.Context, req *musterv1.ListTokensRequest) (*musterv1.ListTokensResponse, error) {
	resp, err := a.listTokens(ctx, req)
	return resp, a.listRefusal(ctx, "token.list", err)
}

func (a *adminService) listTokens(ctx context.Context, req *musterv1.ListTokensRequest) (*musterv1.ListTokensResponse, error) {
	size, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	c, err := pageCursor(pagetoken.Tokens, req.GetPageToken(), validTokenName)
	if err != nil {
		return nil, err
	}
	after := store.TokenKey{ID: c.ID}
	if c.ID != "" {
		after.CreatedAt = time.UnixMicro(c.Micros)
	}
	// One more than the page tells whether another page follows.
	ts, err := a.s.store.ListTokensPage(ctx, after, size+1)
	if err != nil {
		return nil, err
	}
	resp := &musterv1.ListTokensResponse{}
	if len(ts) > size && unpaged(req) {
		return nil, tooManyToList("tokens", size)
	}
	if len(ts) > size {
		ts = ts[:size]
		last := ts[size-1]
		resp.NextPageToken = pagetoken.Encode(pagetoken.Tokens, pagetoken.Cursor{Micros: last.CreatedAt.UnixMicro(), ID: last.ID})
	}
	now := time.Now()
	for _, t := range ts {
		p := tokenToProto(t, now)
		if err := a.s.boundKeypairToProto(p, t, false); err != nil {
			return nil, err
		}
		resp.Tokens = append(resp.Tokens, p)
	}
	return resp, nil
}

func (a *adminService) ListAgents(ctx context.Context, req *musterv1.ListAgentsRequest) (*musterv1.ListAgentsResponse, error) {
	resp, err := a.listAgents(ctx, req)
	return resp, a.listRefusal(ctx, "agent.list", err)
}

func (a *adminService) listAgents(ctx context.Context, req *musterv1.ListAgentsRequest) (*musterv1.ListAgentsResponse, error) {
	size, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	c, err := pageCursor(pagetoken.Agents, req.GetPageToken(), func(id string) bool { return spiffeid.ValidNodeID(id) == nil })
	if err != nil {
		return nil, err
	}
	// One query a page (not four reads an agent), and the store clock
	// the page's streams are read by.
	nodes, err := a.s.store.ListAgentsPage(ctx, c.ID, size+1)
	if err != nil {
		return nil, err
	}
	now, err := a.s.store.Now(ctx)
	if err != nil {
		return nil, err
	}
	resp := &musterv1.ListAgentsResponse{}
	if len(nodes) > size && unpaged(req) {
		return nil, tooManyToList("agents", size)
	}
	if len(nodes) > size {
		nodes = nodes[:size]
		resp.NextPageToken = pagetoken.Encode(pagetoken.Agents, pagetoken.Cursor{ID: nodes[size-1].Node.ID})
	}
	for _, n := range nodes {
		resp.Agents = append(resp.Agents, agentToProto(n, now))
	}
	return resp, nil
}

// listRefusal maps a list call's error to its status and audits a refused
// page_size or page_token.
func (a *adminService) listRefusal(ctx context.Context, action string, err error) error {
	err = toStatus(ctx, a.s.log, err)
	if c := status.Code(err); c == codes.InvalidArgument || c == codes.FailedPrecondition {
		a.refused(ctx, action, "", err)
	}
	return err
}

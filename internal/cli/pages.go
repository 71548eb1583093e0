package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// pageFlags are a list command's paging flags. The command fetches every
// page unless --limit stops it earlier; --page-size only trades round trips
// against the size of each answer.
type pageFlags struct {
	size  int32
	limit int
}

func (p *pageFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.Int32Var(&p.size, "page-size", 0, "items per request to the authority, 1 to 1000 (0: the authority's default, 500)")
	f.IntVar(&p.limit, "limit", 0, "list at most N items (0: all)")
}

func (p *pageFlags) check() error {
	if p.size < 0 || p.size > 1000 {
		return fmt.Errorf("--page-size %d is out of range: pass 1 to 1000, or 0 for the authority's default", p.size)
	}
	if p.limit < 0 {
		return fmt.Errorf("--limit %d is negative: pass 0 for all, or the most items to list", p.limit)
	}
	return nil
}

// fetchPages calls fetch with each next page token, from none, until the
// last page or until limit items (0: no limit), and returns the items.
func fetchPages[T any](limit int, fetch func(pageToken string) ([]T, string, error)) ([]T, error) {
	var all []T
	token := ""
	for {
		items, next, err := fetch(token)
		if err != nil {
			return nil, err
		}
		all = append(all, items...)
		if limit > 0 && len(all) >= limit {
			return all[:limit], nil
		}
		if next == "" {
			return all, nil
		}
		token = next
	}
}

// listTokens fetches the tokens, page by page.
func listTokens(ctx context.Context, c *adminClient, p pageFlags) ([]*musterv1.Token, error) {
	return fetchPages(p.limit, func(token string) ([]*musterv1.Token, string, error) {
		resp, err := c.ListTokens(ctx, &musterv1.ListTokensRequest{PageSize: p.size, PageToken: token})
		return resp.GetTokens(), resp.GetNextPageToken(), err
	})
}

// listAgents fetches the agents, page by page.
func listAgents(ctx context.Context, c *adminClient, p pageFlags) ([]*musterv1.Agent, error) {
	return fetchPages(p.limit, func(token string) ([]*musterv1.Agent, string, error) {
		resp, err := c.ListAgents(ctx, &musterv1.ListAgentsRequest{PageSize: p.size, PageToken: token})
		return resp.GetAgents(), resp.GetNextPageToken(), err
	})
}

package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// defaultPageSize is the page the CLI asks for. It always names one: an
// authority answers a call without a page size only while the whole list
// fits one page (a client from before paging would not follow the rest).
const defaultPageSize = 500

// pageFlags are a list command's paging flags. The command fetches every
// page unless --limit stops it earlier; --page-size only trades round trips
// against the size of each answer.
type pageFlags struct {
	size  int32
	limit int
}

func (p *pageFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.Int32Var(&p.size, "page-size", defaultPageSize, "items per request to the authority, 1 to 1000")
	f.IntVar(&p.limit, "limit", 0, "list at most N items (0: all)")
}

func (p *pageFlags) check() error {
	if p.size < 1 || p.size > 1000 {
		return fmt.Errorf("--page-size %d is out of range: pass 1 to 1000", p.size)
	}
	if p.limit < 0 {
		return fmt.Errorf("--limit %d is negative: pass 0 for all, or the most items to list", p.limit)
	}
	return nil
}

// pager fetches the page a page token names (none: the first) and returns
// its items and the next page token (none: the last).
type pager[T any] func(pageToken string) ([]T, string, error)

// eachPage calls f with each page in turn, from the first, until the last
// or until limit items (0: no limit).
func eachPage[T any](limit int, fetch pager[T], f func([]T) error) error {
	token, n := "", 0
	for {
		items, next, err := fetch(token)
		if err != nil {
			return err
		}
		if limit > 0 && n+len(items) >= limit {
			return f(items[:limit-n])
		}
		n += len(items)
		if err := f(items); err != nil {
			return err
		}
		if next == "" {
			return nil
		}
		token = next
	}
}

// firstItems collects the first limit items of fetch's pages.
func firstItems[T any](limit int, fetch pager[T]) ([]T, error) {
	var all []T
	err := eachPage(limit, fetch, func(page []T) error {
		all = append(all, page...)
		return nil
	})
	return all, err
}

func tokenPages(ctx context.Context, c *adminClient, size int32) pager[*musterv1.Token] {
	return func(token string) ([]*musterv1.Token, string, error) {
		resp, err := c.ListTokens(ctx, &musterv1.ListTokensRequest{PageSize: size, PageToken: token})
		return resp.GetTokens(), resp.GetNextPageToken(), err
	}
}

func agentPages(ctx context.Context, c *adminClient, size int32) pager[*musterv1.Agent] {
	return func(token string) ([]*musterv1.Agent, string, error) {
		resp, err := c.ListAgents(ctx, &musterv1.ListAgentsRequest{PageSize: size, PageToken: token})
		return resp.GetAgents(), resp.GetNextPageToken(), err
	}
}

// listOut prints a list page by page as it arrives, so a client holds one
// page, not the whole list: -o json and -o yaml print exactly what
// out.write prints for the whole list; the table has one header and
// aligns each page's columns on their own.
type listOut[T any] struct {
	w     io.Writer
	out   output
	table func(w io.Writer, page []T, header bool) error
	n     int
}

func (l *listOut[T]) page(items []T) error {
	defer func() { l.n += len(items) }()
	switch {
	case len(items) == 0:
		return nil
	case l.out.format == "yaml":
		// A block sequence is the concatenation of its items' sequences.
		return writeYAML(l.w, items)
	case l.out.json():
		for i, it := range items {
			b, err := json.MarshalIndent(it, "  ", "  ")
			if err != nil {
				return err
			}
			sep := ",\n  "
			if l.n == 0 && i == 0 {
				sep = "[\n  "
			}
			if _, err := io.WriteString(l.w, sep+string(b)); err != nil {
				return err
			}
		}
		return nil
	}
	return l.table(l.w, items, l.n == 0)
}

// end closes the list: an empty one prints as out.write and the table do.
func (l *listOut[T]) end() error {
	switch {
	case l.n == 0 && l.out.json():
		return l.out.write(l.w, []T{})
	case l.n == 0:
		return l.table(l.w, nil, true)
	case l.out.format == "json":
		_, err := io.WriteString(l.w, "\n]\n")
		return err
	}
	return nil
}

package cli

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// completeTimeout bounds a completion's call: a shell waits on it at every
// TAB, so an unreachable authority must cost a moment, not --timeout.
const completeTimeout = 3 * time.Second

// lister fetches completion candidates from the authority.
type lister func(ctx context.Context, c *adminClient) ([]string, error)

// complete is a cobra completion function asking the authority, with the
// operator identity the command's admin flags locate, for the candidates
// beginning with what was typed. Any failure (no identity, no authority,
// a refusal) completes nothing: a shell prompt is no place for an error.
func (a *adminFlags) complete(env *Env, list lister) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(cmd *cobra.Command, _ []string, typed string) ([]string, cobra.ShellCompDirective) {
		a.quiet = true
		c, err := a.dial(env)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(cmd.Context(), min(a.timeout, completeTimeout))
		defer cancel()
		all, err := list(ctx, c)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []string
		for _, s := range all {
			if s != "" && strings.HasPrefix(s, typed) {
				out = append(out, s)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// completeArg completes a command's one positional argument and nothing
// after it.
func (a *adminFlags) completeArg(env *Env, list lister) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	f := a.complete(env, list)
	return func(cmd *cobra.Command, args []string, typed string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return f(cmd, args, typed)
	}
}

// completionLimit is how many IDs a completion offers: one page, so a TAB
// on a fleet of 100,000 is one call, not two hundred.
const completionLimit = defaultPageSize

func listNodeIDs(ctx context.Context, c *adminClient) ([]string, error) {
	agents, err := firstItems(completionLimit, agentPages(ctx, c, defaultPageSize))
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, a := range agents {
		ids = append(ids, a.GetNodeId())
	}
	return ids, nil
}

// listTokenIDs lists token IDs; a bound-keypair token's ID is its name.
func listTokenIDs(ctx context.Context, c *adminClient) ([]string, error) {
	tokens, err := firstItems(completionLimit, tokenPages(ctx, c, defaultPageSize))
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, t := range tokens {
		ids = append(ids, t.GetId())
	}
	return ids, nil
}

func listLockIDs(ctx context.Context, c *adminClient) ([]string, error) {
	resp, err := c.ListLocks(ctx, &musterv1.ListLocksRequest{})
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, l := range resp.GetLocks() {
		ids = append(ids, l.GetId())
	}
	return ids, nil
}

// completeFlag registers list as the completion of cmd's flag name;
// registering an unknown flag is a programming error.
func (a *adminFlags) completeFlag(env *Env, cmd *cobra.Command, name string, list lister) {
	if err := cmd.RegisterFlagCompletionFunc(name, a.complete(env, list)); err != nil {
		panic(err)
	}
}

package cli

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/muster-dev/muster/internal/jointoken"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

func newTokenCmd(env *Env) *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Create, list and delete join tokens"}
	cmd.AddCommand(newTokenCreateCmd(env), newTokenListCmd(env), newTokenGetCmd(env), newTokenDeleteCmd(env), newTokenApplyCmd(env))
	return cmd
}

type tokenJSON struct {
	ID          string            `json:"id"`
	JoinMethod  string            `json:"join_method"`
	State       string            `json:"state"`
	UsesAllowed int64             `json:"uses_allowed"`
	UsesCount   int64             `json:"uses_count"`
	ExpiresAt   *time.Time        `json:"expires_at"`
	NodeID      string            `json:"node,omitempty"`
	Description string            `json:"description,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	CreatedBy   string            `json:"created_by"`
	CreatedAt   time.Time         `json:"created_at"`
	LastUsedAt  *time.Time        `json:"last_used_at,omitempty"`
	// BoundKeypair is a bound-keypair token's spec and status.
	BoundKeypair *boundKeypairJSON `json:"bound_keypair,omitempty"`
	// SVIDUsage is "client,server" for a token whose agents may serve
	// TLS; absent for client only (the default).
	SVIDUsage string `json:"svid_usage,omitempty"`
}

func tokenOf(t *musterv1.Token) tokenJSON {
	j := tokenJSON{ID: t.GetId(), JoinMethod: t.GetJoinMethod(), State: t.GetState(), UsesAllowed: t.GetUsesAllowed(),
		UsesCount: t.GetUsesCount(), NodeID: t.GetNodeId(), Description: t.GetDescription(), Labels: t.GetLabels(),
		CreatedBy: t.GetCreatedBy(), CreatedAt: t.GetCreatedAt().AsTime(), BoundKeypair: boundKeypairOf(t)}
	if u := t.GetSvidUsage(); u != "" && u != "client" {
		j.SVIDUsage = u
	}
	if t.GetExpiresAt() != nil {
		e := t.GetExpiresAt().AsTime()
		j.ExpiresAt = &e
	}
	if t.GetLastUsedAt() != nil {
		u := t.GetLastUsedAt().AsTime()
		j.LastUsedAt = &u
	}
	return j
}

func (t tokenJSON) usesLeft() string {
	if t.UsesAllowed == 0 {
		return "unlimited"
	}
	return fmt.Sprint(t.UsesAllowed - t.UsesCount)
}

func (t tokenJSON) expiry() string {
	if t.ExpiresAt == nil {
		return "never"
	}
	return t.ExpiresAt.UTC().Format(time.RFC3339)
}

func (t tokenJSON) labels() string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(t.Labels)) {
		parts = append(parts, k+"="+t.Labels[k])
	}
	return strings.Join(parts, ",")
}

func newTokenCreateCmd(env *Env) *cobra.Command {
	var (
		af              adminFlags
		out             output
		ttl             time.Duration
		uses            int64
		node, desc      string
		labels          []string
		unsafeUnlimited bool
		svidUsage       string
	)
	cmd := &cobra.Command{
		Use: "create",
		Example: `  muster token create --data ./muster-data --ttl 1h
  muster token create --node web-1 --description "rebuild of web-1"
  muster token create --uses 50 --ttl 24h --label team=infra -o json
  muster token create --node db-1 --svid-usage client,server`,
		Short: "Create a join token and print it with its joining URI",
		Long: `Create a join token. The token (ID.SECRET) is printed once: the authority
keeps only an encrypted copy and never shows the secret again.

--uses 0 makes the token usable until it expires; --ttl 0 makes it never
expire; both together admit anyone who ever sees the token and need
--unsafe-unlimited.

--svid-usage client,server lets the certificates of the token's joins serve
TLS too (server authentication), so the machine's services can take mTLS
connections with its identity (docs/workload-api.md); renewals keep the
usage the join gave.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			req := &musterv1.CreateTokenRequest{Ttl: durationpb.New(ttl), Uses: &uses, NodeId: node,
				Description: desc, Labels: map[string]string{}, UnsafeUnlimited: unsafeUnlimited, SvidUsage: svidUsage}
			for _, l := range labels {
				k, v, ok := strings.Cut(l, "=")
				if !ok || k == "" {
					return fmt.Errorf("token create: --label %q: want KEY=VALUE", l)
				}
				req.Labels[k] = v
			}
			if ttl == 0 && uses == 0 && unsafeUnlimited {
				fmt.Fprintln(env.Stderr, "warning: this token never expires and has unlimited uses: anyone who ever sees it can join; delete it when done")
			}
			return af.call(cmd, env, "token create", func(ctx context.Context, c *adminClient) error {
				resp, err := c.CreateToken(ctx, req)
				if err != nil {
					return err
				}
				t := tokenOf(resp.GetInfo())
				if out.json() {
					return out.write(env.Stdout, struct {
						Token string `json:"token"`
						URI   string `json:"uri"`
						tokenJSON
					}{resp.GetToken(), resp.GetUri(), t})
				}
				fmt.Fprintf(env.Stdout, "Token:       %s\nJoining URI: %s\nUses:        %s\nExpires:     %s\n",
					resp.GetToken(), resp.GetUri(), t.usesLeft(), t.expiry())
				if t.NodeID != "" {
					fmt.Fprintf(env.Stdout, "Bound to:    node %s (re-joining it supersedes the node's current instance)\n", t.NodeID)
				}
				if t.SVIDUsage != "" {
					fmt.Fprintf(env.Stdout, "SVID usage:  %s (its machines' certificates may serve TLS)\n", t.SVIDUsage)
				}
				node := "--node NODE "
				if t.NodeID != "" {
					node = "" // the URI names the node
				}
				fmt.Fprintf(env.Stdout, "\nThe secret is shown only now. Join a machine with:\n  muster agent join --data ADIR %s%q\n", node, resp.GetUri())
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.DurationVar(&ttl, "ttl", 24*time.Hour, "lifetime; 0 = never expires")
	f.Int64Var(&uses, "uses", 1, "number of joins allowed; 0 = unlimited until expiry")
	f.StringVar(&node, "node", "", "bind the token to this node ID")
	f.StringVar(&desc, "description", "", "free text shown in token list")
	f.StringArrayVar(&labels, "label", nil, "KEY=VALUE label (repeatable)")
	f.BoolVar(&unsafeUnlimited, "unsafe-unlimited", false, "allow --ttl 0 together with --uses 0 (unsafe)")
	f.StringVar(&svidUsage, "svid-usage", "client", "what the joined machine's certificates may do: client, or client,server to serve TLS too")
	af.register(cmd)
	out.register(cmd)
	return cmd
}

func newTokenListCmd(env *Env) *cobra.Command {
	var (
		af  adminFlags
		out output
		pf  pageFlags
	)
	cmd := &cobra.Command{
		Use: "list",
		Example: `  muster token list --data ./muster-data
  muster token list -o yaml
  muster token list --limit 20 --page-size 100`,
		Short: "List join tokens (never their secrets), fetching every page",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			if err := pf.check(); err != nil {
				return err
			}
			return af.call(cmd, env, "token list", func(ctx context.Context, c *adminClient) error {
				lo := &listOut[tokenJSON]{w: env.Stdout, out: out, table: tokenTable}
				err := eachPage(pf.limit, tokenPages(ctx, c, pf.size), func(page []*musterv1.Token) error {
					list := make([]tokenJSON, 0, len(page))
					for _, t := range page {
						list = append(list, tokenOf(t))
					}
					return lo.page(list)
				})
				if err != nil {
					return err
				}
				return lo.end()
			})
		},
	}
	af.register(cmd)
	out.register(cmd)
	pf.register(cmd)
	return cmd
}

// tokenTable prints rows of token list's table, with its header or not: a
// list printed page by page aligns each page's columns on their own.
func tokenTable(w io.Writer, list []tokenJSON, header bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if header {
		fmt.Fprintln(tw, "ID\tSTATE\tUSES LEFT\tEXPIRES\tNODE\tDESCRIPTION\tLABELS")
	}
	for _, t := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.State, t.usesLeft(), t.expiry(), t.NodeID, t.Description, t.labels())
	}
	return tw.Flush()
}

func newTokenGetCmd(env *Env) *cobra.Command {
	var (
		af  adminFlags
		out output
	)
	cmd := &cobra.Command{
		Use: "get ID",
		Example: `  muster token get 7f3k2a
  muster token get 7f3k2a -o json
  muster token get build-runner-01 -o yaml > token.yaml   # a bound-keypair token: the resource token apply takes`,
		Short:             "Show one token (never a join token's secret; a bound-keypair token's registration secret in -o json/yaml until it is used)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: af.completeArg(env, listTokenIDs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.check(); err != nil {
				return err
			}
			return af.call(cmd, env, "token get", func(ctx context.Context, c *adminClient) error {
				resp, err := c.GetToken(ctx, &musterv1.GetTokenRequest{Id: tokenIDArg(args[0])})
				if err != nil {
					return af.notFoundHint(err, unknownTokenHint)
				}
				if r := resourceOf(resp.GetToken()); r != nil && out.format == "yaml" {
					// The resource token apply takes back.
					return out.write(env.Stdout, r)
				}
				t := tokenOf(resp.GetToken())
				if out.json() {
					return out.write(env.Stdout, t)
				}
				fmt.Fprintf(env.Stdout, "ID:          %s\nState:       %s\nUses:        %d of %s used\nExpires:     %s\nNode:        %s\nDescription: %s\nLabels:      %s\nCreated:     %s by %s\n",
					t.ID, t.State, t.UsesCount, map[bool]string{true: "unlimited", false: fmt.Sprint(t.UsesAllowed)}[t.UsesAllowed == 0],
					t.expiry(), t.NodeID, t.Description, t.labels(), t.CreatedAt.UTC().Format(time.RFC3339), t.CreatedBy)
				if t.SVIDUsage != "" {
					fmt.Fprintf(env.Stdout, "SVID usage:  %s\n", t.SVIDUsage)
				}
				if t.BoundKeypair != nil {
					t.BoundKeypair.write(env.Stdout)
				}
				return nil
			})
		},
	}
	af.register(cmd)
	out.register(cmd)
	return cmd
}

// tokenIDArg accepts a whole token where an ID is wanted and keeps only the
// ID, so a pasted token does not send its secret to a listing command.
// A bound-keypair token's name, which may hold dots, is kept whole.
func tokenIDArg(s string) string {
	if tok, err := jointoken.Parse(s); err == nil {
		return tok.ID
	}
	return s
}

func newTokenDeleteCmd(env *Env) *cobra.Command {
	var (
		af  adminFlags
		out output
		// The bulk deletion after a restore (tokendeleteoffline.go).
		bulk bulkTokenDelete
	)
	cmd := &cobra.Command{
		Use: "delete (ID | --with-uses-left --created-before TIME --offline [--apply])",
		Example: `  muster token delete 7f3k2a
  muster token delete 7f3k2a -o json
  muster token delete --with-uses-left --created-before 2026-11-27T02:00:00Z --offline --data /var/lib/muster/authority
  muster token delete --with-uses-left --created-before 2026-11-27T02:00:00Z --offline --data /var/lib/muster/authority --apply`,
		Short: "Delete a join token; nodes it admitted keep their identities",
		Long: `delete ID deletes one join token through the authority.

With --with-uses-left --created-before TIME --offline, for a store restored
from a backup when the store it replaced is lost (muster store reapply
cannot read what was done since): every join token (not bound-keypair)
created before TIME that has uses left and has not expired is deleted,
each with its own token.delete record, as the restored store cannot tell a
token spent since the backup from one never used. Without --apply it lists
them and changes nothing. Make new tokens for the joins still to come.`,
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: af.completeArg(env, listTokenIDs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.check(); err != nil {
				return err
			}
			if bulk.withUsesLeft {
				if len(args) > 0 {
					return fmt.Errorf("token delete: give a token ID or --with-uses-left, not both")
				}
				return bulk.run(cmd, env, &af, out)
			}
			if err := bulk.refuseAlone(cmd); err != nil {
				return err
			}
			if len(args) == 0 {
				return fmt.Errorf("token delete: give the ID of the token to delete (muster token list prints them)")
			}
			id := tokenIDArg(args[0])
			return af.call(cmd, env, "token delete", func(ctx context.Context, c *adminClient) error {
				if _, err := c.DeleteToken(ctx, &musterv1.DeleteTokenRequest{Id: id}); err != nil {
					return af.notFoundHint(err, unknownTokenHint)
				}
				if out.json() {
					return out.write(env.Stdout, deleted{ID: id, Deleted: true})
				}
				fmt.Fprintf(env.Stdout, "Token %s deleted\n", id)
				// A lock names the token's ID, not one token's life: a
				// bound-keypair token re-created under the name would be
				// refused by it, so say which remain (a failed listing
				// changes nothing of the deletion).
				if resp, err := c.ListLocks(ctx, &musterv1.ListLocksRequest{}); err == nil {
					for _, l := range resp.GetLocks() {
						if l.GetKind() == "token" && l.GetTarget() == id {
							fmt.Fprintf(env.Stdout, "Lock %s on token %s remains: it refuses a token made again under this name (muster bot add %s); muster lock delete %s lifts it\n",
								l.GetId(), id, id, l.GetId())
						}
					}
				}
				return nil
			})
		},
	}
	af.register(cmd)
	out.register(cmd)
	bulk.register(cmd)
	return cmd
}

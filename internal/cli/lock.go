package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

func newLockCmd(env *Env) *cobra.Command {
	cmd := &cobra.Command{Use: "lock", Short: "Deny a node, instance, token, public key or operator"}
	cmd.AddCommand(newLockCreateCmd(env), newLockListCmd(env), newLockDeleteCmd(env))
	return cmd
}

type lockJSON struct {
	ID        string     `json:"id"`
	Kind      string     `json:"kind"`
	Target    string     `json:"target"`
	Reason    string     `json:"reason,omitempty"`
	CreatedBy string     `json:"created_by"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

func lockOf(l *musterv1.Lock) lockJSON {
	j := lockJSON{ID: l.GetId(), Kind: l.GetKind(), Target: l.GetTarget(), Reason: l.GetReason(),
		CreatedBy: l.GetCreatedBy(), CreatedAt: l.GetCreatedAt().AsTime()}
	if l.GetExpiresAt() != nil {
		t := l.GetExpiresAt().AsTime()
		j.ExpiresAt = &t
	}
	return j
}

func newLockCreateCmd(env *Env) *cobra.Command {
	var (
		af                                      adminFlags
		out                                     output
		node, instance, token, publicKey, admin string
		ttl                                     time.Duration
		reason                                  string
	)
	cmd := &cobra.Command{
		Use: "create (--node|--instance|--token|--public-key|--admin) VALUE",
		Example: `  muster lock create --node web-1 --reason "disk stolen"
  muster lock create --token 7f3k2a --ttl 24h -o json`,
		Short: "Create a lock; it is enforced at once",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			var kind, target string
			n := 0
			for _, k := range []struct{ kind, v string }{{"node", node}, {"instance", instance}, {"token", token}, {"public_key", publicKey}, {"admin", admin}} {
				if k.v != "" {
					kind, target = k.kind, k.v
					n++
				}
			}
			if n != 1 {
				return fmt.Errorf("lock create: give exactly one of --node, --instance, --token, --public-key, --admin")
			}
			req := &musterv1.CreateLockRequest{Kind: kind, Target: target, Reason: reason}
			if ttl != 0 {
				req.Ttl = durationpb.New(ttl)
			}
			resp, err := callAdmin(cmd, env, &af, "lock create", func(ctx context.Context, c *adminClient) (*musterv1.CreateLockResponse, error) {
				return c.CreateLock(ctx, req)
			})
			if err != nil {
				return err
			}
			if out.json() {
				return out.write(env.Stdout, lockOf(resp.GetLock()))
			}
			fmt.Fprintf(env.Stdout, "Lock %s created on %s %s\n", resp.GetLock().GetId(), kind, target)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&node, "node", "", "lock a node ID")
	f.StringVar(&instance, "instance", "", "lock one instance (later instances of the node are not affected)")
	f.StringVar(&token, "token", "", "lock a token ID")
	f.StringVar(&publicKey, "public-key", "", "lock a public key")
	f.StringVar(&admin, "admin", "", "lock an operator identity by name")
	f.DurationVar(&ttl, "ttl", 0, "lock lifetime (default: until deleted)")
	f.StringVar(&reason, "reason", "", "why, for the audit log and lock list")
	af.register(cmd)
	out.register(cmd)
	af.completeFlag(env, cmd, "node", listNodeIDs)
	af.completeFlag(env, cmd, "token", listTokenIDs)
	return cmd
}

func newLockListCmd(env *Env) *cobra.Command {
	var (
		af  adminFlags
		out output
	)
	cmd := &cobra.Command{
		Use: "list",
		Example: `  muster lock list --data ./muster-data
  muster lock list -o yaml`,
		Short: "List the locks in force",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			resp, err := callAdmin(cmd, env, &af, "lock list", func(ctx context.Context, c *adminClient) (*musterv1.ListLocksResponse, error) {
				return c.ListLocks(ctx, &musterv1.ListLocksRequest{})
			})
			if err != nil {
				return err
			}
			if out.json() {
				list := []lockJSON{}
				for _, l := range resp.GetLocks() {
					list = append(list, lockOf(l))
				}
				return out.write(env.Stdout, list)
			}
			return printLocks(env.Stdout, resp.GetLocks())
		},
	}
	af.register(cmd)
	out.register(cmd)
	return cmd
}

// printLocks is lock list's table.
func printLocks(w io.Writer, locks []*musterv1.Lock) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tTARGET\tEXPIRES\tREASON")
	for _, l := range locks {
		exp := "never"
		if l.GetExpiresAt() != nil {
			exp = l.GetExpiresAt().AsTime().UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", l.GetId(), l.GetKind(), l.GetTarget(), exp, l.GetReason())
	}
	return tw.Flush()
}

func newLockDeleteCmd(env *Env) *cobra.Command {
	var (
		af  adminFlags
		out output
	)
	cmd := &cobra.Command{
		Use: "delete ID",
		Example: `  muster lock delete 01J8Z3…
  muster lock delete 01J8Z3… -o json`,
		Short:             "Delete a lock",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: af.completeArg(env, listLockIDs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.check(); err != nil {
				return err
			}
			return af.call(cmd, env, "lock delete", func(ctx context.Context, c *adminClient) error {
				if _, err := c.DeleteLock(ctx, &musterv1.DeleteLockRequest{Id: args[0]}); err != nil {
					return af.unknownLockHint(err)
				}
				if out.json() {
					return out.write(env.Stdout, deleted{ID: args[0], Deleted: true})
				}
				fmt.Fprintf(env.Stdout, "Lock %s deleted\n", args[0])
				return nil
			})
		},
	}
	af.register(cmd)
	out.register(cmd)
	return cmd
}

// unknownLockHint adds to the authority's NOT_FOUND for a lock ID (a typo,
// or a lock deleted already) the command that lists the locks and their
// IDs: the authority's bare "no lock" left the operator to guess.
func (a *adminFlags) unknownLockHint(err error) error {
	return a.notFoundHint(err, "the locks in force and their IDs: muster lock list")
}

package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

func newTaskCmd(env *Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "task",
		Short: "Send signed tasks to agents",
	}
	cmd.AddCommand(newTaskSendCmd(env))
	return cmd
}

// parsePairs reads k=v flags into a map.
func parsePairs(flag string, pairs []string) (map[string]string, error) {
	m := map[string]string{}
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--%s %q: want key=value", flag, p)
		}
		if _, dup := m[k]; dup {
			return nil, fmt.Errorf("--%s: %s given twice", flag, k)
		}
		m[k] = v
	}
	return m, nil
}

func newTaskSendCmd(env *Env) *cobra.Command {
	var (
		af                   adminFlags
		out                  output
		typ                  string
		nodes, labels, param []string
		all                  bool
		expires              time.Duration
	)
	cmd := &cobra.Command{
		Use:   "send --type T (--node N ... | --label k=v ... | --all) [--param k=v ...] [--expires 10m]",
		Short: "Sign a task with the active signer and queue it for agents",
		Example: `  muster task send --type node.renew_now --node web-1
  muster task send --type node.report --label pool=gpu --expires 30m
  muster task send --type site.restart-nginx --all --param grace=10s -o json`,
		Long: `Sign a task with the active signer and queue it for the target agents; each
gets it on its stream, now or when it next connects, until the task expires.
Built-in types: node.renew_now (renew the certificate now) and node.report
(answer with the agent's status). Any other type runs only on agents whose
task-handlers.yaml maps it to an executable (docs/task-handlers.md).
--label selects the nodes whose join token carries every label given. A
selection (or a --node list) of more nodes than one signed task may name
(1,024, fewer when node IDs are long) is sent as one task per page of nodes,
each signed with its own list: an agent checks that a task names it. A node
named twice is queued once. A --node list travels in the request, which the
authority takes up to 64 KiB (about 2,900 IDs of 20 characters): for more,
select by --label.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			n := 0
			for _, set := range []bool{len(nodes) > 0, len(labels) > 0, all} {
				if set {
					n++
				}
			}
			if n != 1 {
				return fmt.Errorf("task send: give exactly one of --node, --label or --all")
			}
			lm, err := parsePairs("label", labels)
			if err != nil {
				return fmt.Errorf("task send: %w", err)
			}
			pm, err := parsePairs("param", param)
			if err != nil {
				return fmt.Errorf("task send: %w", err)
			}
			resp, err := callAdmin(cmd, env, &af, "task send", func(ctx context.Context, c *adminClient) (*musterv1.SendTaskResponse, error) {
				// The answer lists the first 1,000 nodes queued; an
				// authority from before node_count lists every one, and
				// 100,000 long IDs pass gRPC's default 4 MiB after the
				// tasks are queued.
				return c.SendTask(ctx, &musterv1.SendTaskRequest{TaskType: typ, NodeIds: nodes, Labels: lm, All: all, Params: pm,
					Expires: durationpb.New(expires)}, grpc.MaxCallRecvMsgSize(maxSendTaskAnswer))
			})
			if err != nil {
				return err
			}
			queued := queuedNodes(resp)
			if out.json() {
				return out.write(env.Stdout, struct {
					TaskID          string    `json:"task_id"`
					TaskIDs         []string  `json:"task_ids"`
					NodeIDs         []string  `json:"node_ids"`
					NodeCount       int       `json:"node_count"`
					MoreNodes       int       `json:"more_nodes"`
					SignerVersionID string    `json:"signer_version_id"`
					ExpiresAt       time.Time `json:"expires_at"`
				}{resp.GetTaskId(), taskIDs(resp), resp.GetNodeIds(), queued, queued - len(resp.GetNodeIds()), resp.GetSignerVersionId(),
					resp.GetExpiresAt().AsTime().UTC()})
			}
			printSent(env.Stdout, resp, typ)
			fmt.Fprintln(env.Stdout, "Results: muster audit list --action task.result")
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&typ, "type", "", "task type (node.renew_now, node.report, or a custom type)")
	f.StringSliceVar(&nodes, "node", nil, "a target node ID (repeatable)")
	f.StringArrayVar(&labels, "label", nil, "a label k=v the target nodes' join tokens carry (repeatable)")
	f.BoolVar(&all, "all", false, "every enrolled node")
	f.StringArrayVar(&param, "param", nil, "a parameter k=v (repeatable)")
	f.DurationVar(&expires, "expires", 10*time.Minute, "how long the task may be delivered and run (at most 24h)")
	cmd.MarkFlagRequired("type")
	af.register(cmd)
	out.register(cmd)
	af.completeFlag(env, cmd, "node", listNodeIDs)
	return cmd
}

// maxSendTaskAnswer bounds the answer of task send from an authority from
// before node_count, which listed every node: about a million node IDs
// of 63 characters. A current authority's answer lists 1,000 at most.
const maxSendTaskAnswer = 64 << 20

// taskIDs is every task of a send; an authority from before pages sends
// task_id alone.
func taskIDs(resp *musterv1.SendTaskResponse) []string {
	if ids := resp.GetTaskIds(); len(ids) > 0 {
		return ids
	}
	return []string{resp.GetTaskId()}
}

// printSent says what a send queued, for people.
func printSent(w io.Writer, resp *musterv1.SendTaskResponse, typ string) {
	until := resp.GetExpiresAt().AsTime().UTC().Format(time.RFC3339)
	nodes := countOf(queuedNodes(resp), "node", "nodes")
	if ids := taskIDs(resp); len(ids) > 1 {
		fmt.Fprintf(w, "%d tasks (%s), one per page of nodes, signed by %s, queued for %s until %s:\n", len(ids), typ,
			resp.GetSignerVersionId(), nodes, until)
		for _, id := range ids {
			fmt.Fprintf(w, "  %s\n", id)
		}
		return
	}
	fmt.Fprintf(w, "Task %s (%s), signed by %s, queued for %s until %s.\n", resp.GetTaskId(), typ,
		resp.GetSignerVersionId(), nodes, until)
}

// countOf is "1 node", "2 nodes": n with the noun it takes.
func countOf(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// queuedNodes is how many nodes a send was queued for: node_count, or, from
// an authority from before it, the node IDs it listed (all of them).
func queuedNodes(resp *musterv1.SendTaskResponse) int {
	if n := resp.GetNodeCount(); n > 0 {
		return int(n)
	}
	return len(resp.GetNodeIds())
}

package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/agent"
	"github.com/muster-dev/muster/internal/spiffeid"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

func newAgentsCmd(env *Env) *cobra.Command {
	cmd := &cobra.Command{Use: "agents", Short: "List, show and delete admitted nodes"}
	cmd.AddCommand(newAgentsListCmd(env), newAgentsShowCmd(env), newAgentsDeleteCmd(env))
	return cmd
}

func timeOf(ts *timestamppb.Timestamp) *time.Time {
	if ts == nil {
		return nil
	}
	t := ts.AsTime().UTC()
	return &t
}

func fmtTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Format(time.RFC3339)
}

type agentJSON struct {
	NodeID       string      `json:"node"`
	JoinMethod   string      `json:"join_method"`
	TokenID      string      `json:"token_id,omitempty"`
	InstanceID   string      `json:"instance_id"`
	Generation   int64       `json:"generation"`
	CreatedAt    *time.Time  `json:"created_at"`
	UpdatedAt    *time.Time  `json:"updated_at"`
	NotAfter     *time.Time  `json:"not_after"`
	LastIssuedAt *time.Time  `json:"last_issued_at"`
	Locked       string      `json:"locked,omitempty"`
	Stream       *streamJSON `json:"stream,omitempty"`
	// BoundKeypair is set for a node a bound-keypair token admitted.
	BoundKeypair *agentBoundJSON `json:"bound_keypair,omitempty"`
}

// agentBoundJSON is what agents list and show print of a bound-keypair
// node's token: the key that proves it and the budget left.
type agentBoundJSON struct {
	BoundKeyFingerprint string `json:"bound_key_fingerprint"`
	// RecoveriesRemaining is -1 when the token's mode does not count.
	RecoveriesRemaining int64      `json:"recoveries_remaining"`
	RecoverySequence    int64      `json:"recovery_sequence"`
	LastRotatedAt       *time.Time `json:"last_rotated_at,omitempty"`
}

// recoveries is the RECOVERIES LEFT column: the budget left (not the
// recoveries used, which token get counts as "N of M used"), "-" for a
// node without a counted budget.
func (a agentJSON) recoveries() string {
	if a.BoundKeypair == nil || a.BoundKeypair.RecoveriesRemaining < 0 {
		return "-"
	}
	return fmt.Sprint(a.BoundKeypair.RecoveriesRemaining)
}

func agentOf(a *musterv1.Agent) agentJSON {
	return agentJSON{NodeID: a.GetNodeId(), JoinMethod: a.GetJoinMethod(), TokenID: a.GetTokenId(), InstanceID: a.GetInstanceId(),
		Generation: a.GetGeneration(), CreatedAt: timeOf(a.GetCreatedAt()), UpdatedAt: timeOf(a.GetUpdatedAt()),
		NotAfter: timeOf(a.GetNotAfter()), LastIssuedAt: timeOf(a.GetLastIssuedAt()), Locked: a.GetLocked(), Stream: streamOf(a.GetStream()),
		BoundKeypair: agentBoundOf(a.GetBoundKeypair())}
}

func agentBoundOf(b *musterv1.BoundKeypairStatus) *agentBoundJSON {
	if b == nil {
		return nil
	}
	return &agentBoundJSON{BoundKeyFingerprint: b.GetBoundKeyFingerprint(), RecoveriesRemaining: b.GetRecoveriesRemaining(),
		RecoverySequence: b.GetRecoverySequence(), LastRotatedAt: timeOf(b.GetLastRotatedAt())}
}

func newAgentsListCmd(env *Env) *cobra.Command {
	var (
		af  adminFlags
		out output
		pf  pageFlags
	)
	cmd := &cobra.Command{
		Use: "list",
		Example: `  muster agents list --data ./muster-data
  muster agents list -o json
  muster agents list --limit 50`,
		Short: "List admitted nodes with their current instance, fetching every page",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			if err := pf.check(); err != nil {
				return err
			}
			return af.call(cmd, env, "agents list", func(ctx context.Context, c *adminClient) error {
				lo := &listOut[agentJSON]{w: env.Stdout, out: out, table: agentTable}
				stale := 0
				err := eachPage(pf.limit, agentPages(ctx, c, pf.size), func(page []*musterv1.Agent) error {
					list := make([]agentJSON, 0, len(page))
					for _, a := range page {
						list = append(list, agentOf(a))
						if a.GetStream().GetStale() {
							stale++
						}
					}
					return lo.page(list)
				})
				if err != nil {
					return err
				}
				if err := lo.end(); err != nil {
					return err
				}
				if out.format == "text" {
					// -o json and yaml carry "stale": true instead.
					fmt.Fprint(env.Stderr, staleNote(stale))
				}
				return nil
			})
		},
	}
	af.register(cmd)
	out.register(cmd)
	pf.register(cmd)
	return cmd
}

// agentTable prints rows of agents list's table, with its header or not.
func agentTable(w io.Writer, list []agentJSON, header bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if header {
		fmt.Fprintln(tw, "NODE\tMETHOD\tINSTANCE\tGENERATION\tEXPIRES\tRECOVERIES LEFT\tSTREAM\tLOCKED")
	}
	for _, a := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", a.NodeID, a.JoinMethod, a.InstanceID, a.Generation, fmtTime(a.NotAfter),
			a.recoveries(), streamColumn(a.Stream), a.Locked)
	}
	return tw.Flush()
}

type instanceJSON struct {
	ID         string     `json:"id"`
	State      string     `json:"state"`
	JoinMethod string     `json:"join_method"`
	TokenID    string     `json:"token_id,omitempty"`
	PreviousID string     `json:"previous_id,omitempty"`
	Generation int64      `json:"generation"`
	CreatedAt  *time.Time `json:"created_at"`
}

type certificateJSON struct {
	Serial     string     `json:"serial"`
	InstanceID string     `json:"instance_id"`
	Generation int64      `json:"generation"`
	JoinMethod string     `json:"join_method"`
	TokenID    string     `json:"token_id,omitempty"`
	PublicKey  string     `json:"public_key_sha256"`
	NotBefore  *time.Time `json:"not_before"`
	NotAfter   *time.Time `json:"not_after"`
	IssuedAt   *time.Time `json:"issued_at"`
}

func newAgentsShowCmd(env *Env) *cobra.Command {
	var (
		af  adminFlags
		out output
	)
	cmd := &cobra.Command{
		Use: "show NODE",
		Example: `  muster agents show web-1 --data ./muster-data
  muster agents show web-1 -o yaml`,
		Short:             "Show what a node holds, since when, and how it got it",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: af.completeArg(env, listNodeIDs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.check(); err != nil {
				return err
			}
			return af.call(cmd, env, "agents show", func(ctx context.Context, c *adminClient) error {
				resp, err := c.GetAgent(ctx, &musterv1.GetAgentRequest{NodeId: args[0]})
				if err != nil {
					return af.notFoundHint(err, unknownNodeHint)
				}
				var doc struct {
					Agent        *agentJSON        `json:"agent"`
					Instances    []instanceJSON    `json:"instances"`
					Certificates []certificateJSON `json:"certificates"`
				}
				if resp.GetAgent() != nil {
					a := agentOf(resp.GetAgent())
					doc.Agent = &a
				}
				for _, i := range resp.GetInstances() {
					doc.Instances = append(doc.Instances, instanceJSON{ID: i.GetId(), State: i.GetState(), JoinMethod: i.GetJoinMethod(),
						TokenID: i.GetTokenId(), PreviousID: i.GetPreviousId(), Generation: i.GetGeneration(), CreatedAt: timeOf(i.GetCreatedAt())})
				}
				for _, ce := range resp.GetCertificates() {
					doc.Certificates = append(doc.Certificates, certificateJSON{Serial: ce.GetSerial(), InstanceID: ce.GetInstanceId(),
						Generation: ce.GetGeneration(), JoinMethod: ce.GetJoinMethod(), TokenID: ce.GetTokenId(), PublicKey: ce.GetPublicKeySha256(),
						NotBefore: timeOf(ce.GetNotBefore()), NotAfter: timeOf(ce.GetNotAfter()), IssuedAt: timeOf(ce.GetIssuedAt())})
				}
				if out.json() {
					return out.write(env.Stdout, doc)
				}
				if a := doc.Agent; a != nil {
					fmt.Fprintf(env.Stdout, "Node %s: instance %s, generation %d, joined by %s (token %s), expires %s\n",
						a.NodeID, a.InstanceID, a.Generation, a.JoinMethod, a.TokenID, fmtTime(a.NotAfter))
					if a.Locked != "" {
						fmt.Fprintf(env.Stdout, "Locked: %s\n", a.Locked)
					}
					if b := a.BoundKeypair; b != nil {
						fmt.Fprintf(env.Stdout, "Bound key: %s (last rotated %s)\nRecoveries remaining: %s (recovery sequence %d)\n",
							b.BoundKeyFingerprint, fmtTime(b.LastRotatedAt), a.recoveries(), b.RecoverySequence)
					}
					printStream(env.Stdout, a.NodeID, a.Stream)
				} else {
					fmt.Fprintf(env.Stdout, "Node %s was deleted; its history:\n", args[0])
				}
				tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "\nINSTANCE\tSTATE\tMETHOD\tTOKEN\tGENERATION\tCREATED\tPREVIOUS")
				for _, i := range doc.Instances {
					prev := i.PreviousID
					if prev == "" {
						prev = "-"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", i.ID, i.State, i.JoinMethod, i.TokenID, i.Generation, fmtTime(i.CreatedAt), prev)
				}
				fmt.Fprintln(tw, "\nSERIAL\tINSTANCE\tGENERATION\tISSUED\tNOT AFTER")
				for _, ce := range doc.Certificates {
					fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", ce.Serial, ce.InstanceID, ce.Generation, fmtTime(ce.IssuedAt), fmtTime(ce.NotAfter))
				}
				return tw.Flush()
			})
		},
	}
	af.register(cmd)
	out.register(cmd)
	return cmd
}

func newAgentsDeleteCmd(env *Env) *cobra.Command {
	var (
		af  adminFlags
		out output
	)
	cmd := &cobra.Command{
		Use: "delete NODE",
		Example: `  muster agents delete web-1 --data ./muster-data
  muster agents delete web-1 -o json`,
		Short:             "Delete a node: it can no longer renew, and its ID is free for a new join",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: af.completeArg(env, listNodeIDs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.check(); err != nil {
				return err
			}
			return af.call(cmd, env, "agents delete", func(ctx context.Context, c *adminClient) error {
				// A bound-keypair node's token is bound to it: its agent
				// proves its key again at its next refresh and is
				// admitted as a recovery, so deleting the node alone does
				// not stop it. Read before the deletion, which removes it;
				// not for a name the authority refuses as no node name,
				// whose read it would audit as a refused agent.get beside
				// the deletion's own refusal.
				var boundToken string
				if spiffeid.ValidNodeID(args[0]) == nil {
					if resp, err := c.GetAgent(ctx, &musterv1.GetAgentRequest{NodeId: args[0]}); err == nil &&
						resp.GetAgent().GetJoinMethod() == agent.JoinMethodBoundKeypair {
						boundToken = resp.GetAgent().GetTokenId()
					}
				}
				if _, err := c.DeleteAgent(ctx, &musterv1.DeleteAgentRequest{NodeId: args[0]}); err != nil {
					return af.notFoundHint(err, unknownNodeHint)
				}
				if out.json() {
					return out.write(env.Stdout, deleted{NodeID: args[0], Deleted: true})
				}
				if boundToken != "" {
					fmt.Fprintf(env.Stdout, "Node %s deleted, but its bound-keypair token %s still admits it: its agent recovers with its bound key at its next refresh (one of the token's budget). To stop it for good: muster token delete %s\n",
						args[0], boundToken, boundToken)
					return nil
				}
				fmt.Fprintf(env.Stdout, "Node %s deleted: it can no longer renew, and comes back only by joining again\n", args[0])
				return nil
			})
		},
	}
	af.register(cmd)
	out.register(cmd)
	return cmd
}

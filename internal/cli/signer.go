package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/muster-dev/muster/internal/authority"
	"github.com/muster-dev/muster/internal/signer"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

func newSignerCmd(env *Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "signer",
		Short: "List and rotate the task signers",
		Long: `The authority signs every task and verifier set with its active Ed25519
signer. A rotation stages a new signer, which agents are told about ahead
of time; at its effective time it becomes active and the previous signer
stays accepted until the end of its grace, then retires. Activation and
retirement happen at their times by themselves; activate and retire force
them now. rollback undoes a rotation (before the effective time, or within
the grace); revoke distrusts a signer at once. See docs/signer-lifecycle.md.`,
	}
	cmd.AddCommand(newSignerListCmd(env), newSignerStageCmd(env),
		newSignerSeenCmd(env, "activate [VERSION]", "Make the staged signer (VERSION, as muster signer list showed it) active now",
			"  muster signer activate\n  muster signer activate v3-8b0e4a17 --verifier-set-version 12 -o json",
			[]signer.State{signer.Staged},
			func(ctx context.Context, c *adminClient, seen signer.Seen) (*musterv1.SignerChangeResponse, error) {
				return c.ActivateSigner(ctx, &musterv1.ActivateSignerRequest{VersionId: seen.VersionID, VerifierSetVersion: seen.SetVersion})
			}),
		newSignerSeenCmd(env, "retire [VERSION]", "Retire the signer in grace (VERSION, as muster signer list showed it) now",
			"  muster signer retire\n  muster signer retire v2-3fa9c2d1 --verifier-set-version 12 -o json",
			[]signer.State{signer.Grace},
			func(ctx context.Context, c *adminClient, seen signer.Seen) (*musterv1.SignerChangeResponse, error) {
				return c.RetireSigner(ctx, &musterv1.RetireSignerRequest{VersionId: seen.VersionID, VerifierSetVersion: seen.SetVersion})
			}),
		// Revoking the active signer activates the staged one: the set
		// version says which staged one the operator saw.
		newSignerSeenCmd(env, "revoke VERSION", "Distrust a signer at once (the active one only while a staged signer can replace it)",
			"  muster signer revoke v2-3fa9c2d1\n  muster signer revoke v2-3fa9c2d1 --verifier-set-version 12 -o json",
			nil,
			func(ctx context.Context, c *adminClient, seen signer.Seen) (*musterv1.SignerChangeResponse, error) {
				return c.RevokeSigner(ctx, &musterv1.RevokeSignerRequest{VersionId: seen.VersionID, VerifierSetVersion: seen.SetVersion})
			}),
		// A rollback moves the staged signer (discarding it), else the
		// active one (back to staged), as PlanRollback picks it.
		newSignerSeenCmd(env, "rollback [VERSION]", "Undo the rotation in progress (to VERSION, as muster signer list showed it)",
			"  muster signer rollback\n  muster signer rollback v3-8b0e4a17 --verifier-set-version 12 -o json",
			[]signer.State{signer.Staged, signer.Active},
			func(ctx context.Context, c *adminClient, seen signer.Seen) (*musterv1.SignerChangeResponse, error) {
				return c.RollbackSigner(ctx, &musterv1.RollbackSignerRequest{VersionId: seen.VersionID, VerifierSetVersion: seen.SetVersion})
			}),
	)
	return cmd
}

// newSignerSeenCmd is muster signer activate, retire, rollback or revoke. Each
// says which signer it means and on which verifier set version, as the
// operator read them (or as a script names them, from muster signer list
// -o json), so that a step racing another (a second operator, a retry
// through another replica, the automatic activation or retirement
// followed by a new stage) is refused instead of moving a signer the
// operator did not see. Unnamed, both are read just before from the
// listing: the signer the step moves is the first found in one of states.
// A step with no states (revoke) must name its signer.
func newSignerSeenCmd(env *Env, use, short, example string, states []signer.State, call func(context.Context, *adminClient, signer.Seen) (*musterv1.SignerChangeResponse, error)) *cobra.Command {
	var setVersion int64
	verb := strings.Fields(use)[0]
	args := cobra.MaximumNArgs(1)
	if len(states) == 0 {
		args = cobra.ExactArgs(1)
	}
	cmd := newSignerStepCmd(env, use, short, example, args,
		func(ctx context.Context, c *adminClient, args []string) (*musterv1.SignerChangeResponse, error) {
			seen := signer.Seen{SetVersion: setVersion}
			if len(args) == 1 {
				seen.VersionID = args[0]
			}
			if seen.VersionID == "" || seen.SetVersion == 0 {
				list, err := c.ListSigners(ctx, &musterv1.ListSignersRequest{})
				if err != nil {
					return nil, err
				}
				if seen.SetVersion == 0 {
					seen.SetVersion = list.GetVerifierSetVersion()
				}
				if seen.VersionID == "" {
					seen.VersionID = signerIn(list.GetSigners(), states)
				}
			}
			return call(ctx, c, seen)
		})
	cmd.Flags().Int64Var(&setVersion, "verifier-set-version", 0,
		verb+" only if the verifier set is still at this version (muster signer list shows it; -o json: verifier_set_version); default: the version read when the command runs, which guards only against a step taken between that read and this one, not since you read the listing")
	return cmd
}

// signerIn is the first signer in one of states, tried in order ("" when
// none: the authority then refuses with its own reason).
func signerIn(ss []*musterv1.Signer, states []signer.State) string {
	for _, want := range states {
		for _, s := range ss {
			if s.GetState() == string(want) {
				return s.GetVersionId()
			}
		}
	}
	return ""
}

// signerJSON is one signer as -o json prints it.
type signerJSON struct {
	VersionID   string     `json:"version_id"`
	PublicKey   string     `json:"public_key"`
	State       string     `json:"state"`
	PublishedAt *time.Time `json:"published_at,omitempty"`
	EffectiveAt *time.Time `json:"effective_at,omitempty"`
	GraceUntil  *time.Time `json:"grace_until,omitempty"`
	RetiresAt   *time.Time `json:"retires_at,omitempty"`
	EndedAt     *time.Time `json:"ended_at,omitempty"`
	Previous    string     `json:"previous,omitempty"`
	// KeyCustody is where the private key lives: "sealed" or the pkcs11:
	// URI of its token object; "destroyed" once a retired or revoked
	// signer's key is gone ("" from an authority that does not say).
	KeyCustody string `json:"key_custody,omitempty"`
}

func signersOf(ss []*musterv1.Signer) []signerJSON {
	out := []signerJSON{}
	for _, s := range ss {
		out = append(out, signerJSON{
			VersionID: s.GetVersionId(), PublicKey: s.GetPublicKey(), State: s.GetState(),
			PublishedAt: timeOf(s.GetPublishedAt()), EffectiveAt: timeOf(s.GetEffectiveAt()), GraceUntil: timeOf(s.GetGraceUntil()),
			RetiresAt: timeOf(s.GetRetiresAt()), EndedAt: timeOf(s.GetEndedAt()), Previous: s.GetPrevious(),
			KeyCustody: s.GetKeyCustody(),
		})
	}
	return out
}

// printSigners prints signers as a table.
func printSigners(w io.Writer, ss []signerJSON) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tSTATE\tPUBLISHED\tEFFECTIVE\tGRACE UNTIL\tRETIRES\tENDED\tPREVIOUS\tPUBLIC KEY\tKEY CUSTODY")
	for _, s := range ss {
		prev := s.Previous
		if prev == "" {
			prev = "-"
		}
		where := s.KeyCustody
		switch {
		case where == "":
			where = "-"
		case (s.State == "retired" || s.State == "revoked") && strings.HasPrefix(where, "pkcs11:"):
			// The leader destroys it at its next pass the token answers.
			where = "destroy pending: " + where
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.VersionID, s.State, fmtTime(s.PublishedAt), fmtTime(s.EffectiveAt),
			fmtTime(s.GraceUntil), fmtTime(s.RetiresAt), fmtTime(s.EndedAt), prev, s.PublicKey, where)
	}
	tw.Flush()
}

func newSignerListCmd(env *Env) *cobra.Command {
	var (
		af  adminFlags
		out output
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the task signers and the verifier set version",
		Example: `  muster signer list
  muster signer list -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			resp, err := callAdmin(cmd, env, &af, "signer list", func(ctx context.Context, c *adminClient) (*musterv1.ListSignersResponse, error) {
				return c.ListSigners(ctx, &musterv1.ListSignersRequest{})
			})
			if err != nil {
				return err
			}
			ss := signersOf(resp.GetSigners())
			if out.json() {
				return out.write(env.Stdout, struct {
					Signers            []signerJSON `json:"signers"`
					VerifierSetVersion int64        `json:"verifier_set_version"`
					MinLeadTime        string       `json:"min_lead_time"`
				}{ss, resp.GetVerifierSetVersion(), resp.GetMinLeadTime().AsDuration().String()})
			}
			printSigners(env.Stdout, ss)
			fmt.Fprintf(env.Stdout, "\nVerifier set version %d; minimum lead time %s.\n", resp.GetVerifierSetVersion(), resp.GetMinLeadTime().AsDuration())
			return nil
		},
	}
	af.register(cmd)
	out.register(cmd)
	return cmd
}

// printChange prints the outcome of a lifecycle step.
func printChange(env *Env, out output, resp *musterv1.SignerChangeResponse) error {
	ss := signersOf(resp.GetChanged())
	if out.json() {
		return out.write(env.Stdout, struct {
			Changed            []signerJSON `json:"changed"`
			VerifierSetVersion int64        `json:"verifier_set_version"`
		}{ss, resp.GetVerifierSetVersion()})
	}
	printSigners(env.Stdout, ss)
	fmt.Fprintf(env.Stdout, "\nVerifier set version %d.\n", resp.GetVerifierSetVersion())
	return nil
}

func newSignerStageCmd(env *Env) *cobra.Command {
	var (
		af                 adminFlags
		out                output
		effectiveIn, grace time.Duration
	)
	cmd := &cobra.Command{
		Use:   "stage",
		Short: "Make a new signer, to become active later",
		Example: `  muster signer stage
  muster signer stage --effective-in 2h --grace 48h -o json`,
		Long: `Make a new signer, staged: it appears in the verifier set at once and
becomes active --effective-in from now (default 1h, at least
signer.min_lead_time). The current signer stays accepted for --grace after
that (default 24h, at least 1s), then retires.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			// Refused here too, so that nothing is asked of the authority.
			if grace < signer.MinGrace {
				return fmt.Errorf("signer stage: --grace %s: %s", grace, signer.GraceTooShort(grace, "--grace 24h"))
			}
			resp, err := callAdmin(cmd, env, &af, "signer stage", func(ctx context.Context, c *adminClient) (*musterv1.SignerChangeResponse, error) {
				return c.StageSigner(ctx, &musterv1.StageSignerRequest{EffectiveIn: durationpb.New(effectiveIn), Grace: durationpb.New(grace)})
			})
			if err != nil {
				return err
			}
			return printChange(env, out, resp)
		},
	}
	cmd.Flags().DurationVar(&effectiveIn, "effective-in", time.Hour, "when the new signer becomes active, from now")
	cmd.Flags().DurationVar(&grace, "grace", 24*time.Hour, "how long after that the current signer stays accepted (at least 1s)")
	af.register(cmd)
	out.register(cmd)
	return cmd
}

// newSignerStepCmd is one lifecycle step that takes no flags of its own.
func newSignerStepCmd(env *Env, use, short, example string, args cobra.PositionalArgs, call func(context.Context, *adminClient, []string) (*musterv1.SignerChangeResponse, error)) *cobra.Command {
	var (
		af  adminFlags
		out output
	)
	cmd := &cobra.Command{
		Use:     use,
		Short:   short,
		Example: example,
		Args:    args,
		RunE: func(cmd *cobra.Command, a []string) error {
			if err := out.check(); err != nil {
				return err
			}
			resp, err := callAdmin(cmd, env, &af, "signer "+cmd.Name(), func(ctx context.Context, c *adminClient) (*musterv1.SignerChangeResponse, error) {
				return call(ctx, c, a)
			})
			if err != nil {
				return err
			}
			return printChange(env, out, resp)
		},
	}
	af.register(cmd)
	out.register(cmd)
	return cmd
}

// signerMinLeadTime reads signer.min_lead_time; "" is the default.
func signerMinLeadTime(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	return authority.ParseSharedSetting(authority.SettingSignerMinLeadTime, s)
}

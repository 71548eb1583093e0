package cli

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/muster-dev/muster/internal/agent"
)

func newAgentTrustCmd(env *Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "trust",
		Short: "The task verifiers the agent trusts",
	}
	cmd.AddCommand(newAgentTrustRefreshCmd(env))
	return cmd
}

func newAgentTrustRefreshCmd(env *Env) *cobra.Command {
	var (
		data string
		out  output
	)
	cmd := &cobra.Command{
		Use:     "refresh --data ADIR",
		Short:   "Fetch the authority's current verifier set and trust bundle now (a repair path)",
		Example: `  muster agent trust refresh --data /var/lib/muster-agent`,
		Long: `Ask the authority, over mTLS with the agent's certificate, for its current
verifier set of task signers, and take it if it is newer than the one held
and signed by a signer the agent trusts as active; and its trust bundle,
taken as a renewal takes it (a new root only through a cross-certificate
signed by a root the agent trusts): certs/ca.crt and certs/bundle.pem.
Joins, renewals and the agent's stream deliver both anyway; this is for an
agent that missed a rotation.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			dir, err := agentDir(env, data)
			if err != nil {
				return fmt.Errorf("agent trust refresh: %w", err)
			}
			a := agent.New(agent.Options{Dir: dir, Authority: env.Getenv(agent.EnvAuthority),
				StaticVerifiers: env.Getenv(agent.StaticVerifiersEnv)})
			got, err := a.RefreshTrust(cmd.Context())
			if errors.Is(err, agent.ErrNoIdentity) {
				return fmt.Errorf("agent trust refresh: %w", noIdentity(err))
			} else if err != nil {
				return fmt.Errorf("agent trust refresh: %w", err)
			}
			if out.json() {
				return out.write(env.Stdout, struct {
					VerifierSetVersion int64  `json:"verifier_set_version"`
					TrustBundle        string `json:"trust_bundle"`
					Roots              int    `json:"roots"`
				}{got.VerifierSetVersion, got.TrustBundle, got.Roots})
			}
			fmt.Fprintf(env.Stdout, "Verifier set version %d.\nTrust bundle %s (%d trusted roots in certs/ca.crt).\n", got.VerifierSetVersion, got.TrustBundle, got.Roots)
			return nil
		},
	}
	cmd.Flags().StringVar(&data, "data", "", "agent data directory (env MUSTER_AGENT_DATA)")
	out.register(cmd)
	return cmd
}

// printTaskTrust adds the task verifiers to muster agent status.
func printTaskTrust(w io.Writer, s *agent.Status) {
	states := map[string]string{}
	for id, st := range s.AcceptedSigners {
		states[id] = string(st)
	}
	accepted := signerStates(states)
	fmt.Fprintf(w, "Task signers:  verifier set version %d; accepted: %s\n", s.VerifierSetVersion, accepted)
	if s.TrustBundle != "" {
		fmt.Fprintf(w, "Trust bundle:  %s (certs/ca.crt, certs/bundle.pem)\n", s.TrustBundle)
	}
	if s.StaticVerifiers > 0 {
		fmt.Fprintf(w, "Static list:   %d keys from %s (a transition setting: remove it once the verifier set is delivered)\n",
			s.StaticVerifiers, agent.StaticVerifiersEnv)
	}
}

// signerStates prints accepted signers as "v1 (grace), v2 (active)", or
// "none".
func signerStates(m map[string]string) string {
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	parts := make([]string, 0, len(ids))
	for _, id := range ids {
		parts = append(parts, fmt.Sprintf("%s (%s)", id, m[id]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

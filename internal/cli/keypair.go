package cli

import (
	"crypto/ed25519"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/muster-dev/muster/internal/agent"
	"github.com/muster-dev/muster/internal/boundkeypair"
)

func newKeypairCmd(env *Env) *cobra.Command {
	cmd := &cobra.Command{Use: "keypair", Short: "Manage an agent's bound keypair"}
	cmd.AddCommand(newKeypairCreateCmd(env))
	return cmd
}

func newKeypairCreateCmd(env *Env) *cobra.Command {
	var (
		data string
		out  output
	)
	cmd := &cobra.Command{
		Use:     "create",
		Short:   "Make the agent's bound Ed25519 key and print its public key",
		Example: `  muster keypair create --data /var/lib/muster-agent > runner.pub`,
		Long: `Make the Ed25519 key a bound-keypair agent proves itself with, in
ADIR/keys/bound.key (0600), and print the public key in authorized_keys form
for the token's spec.bound_keypair.onboarding.initial_public_key (static
binding: no registration secret is needed). An existing key is never
replaced.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			dir, err := agentDir(env, data)
			if err != nil {
				return err
			}
			pub, err := agent.CreateBoundKey(dir)
			if errors.Is(err, agent.ErrBoundKeyExists) {
				// The public half printed at the first create may be lost;
				// nothing else prints it (ssh-keygen does not read PKCS#8).
				if priv, lerr := agent.LoadBoundKey(dir); lerr == nil {
					if have, perr := boundkeypair.NewPublicKey(priv.Public().(ed25519.PublicKey)); perr == nil {
						return fmt.Errorf("%w, kept; its public key (for muster bot add NAME --public-key FILE): %s (%s)", err, have.String(), have.Fingerprint())
					}
				}
			}
			if err != nil {
				return err
			}
			if out.json() {
				return out.write(env.Stdout, struct {
					PublicKey   string `json:"public_key"`
					Fingerprint string `json:"fingerprint"`
					KeyFile     string `json:"key_file"`
				}{pub.String(), pub.Fingerprint(), dir.BoundKeyFile()})
			}
			fmt.Fprintln(env.Stdout, pub.String())
			fmt.Fprintf(env.Stderr, "wrote %s (%s)\n", dir.BoundKeyFile(), pub.Fingerprint())
			return nil
		},
	}
	cmd.Flags().StringVar(&data, "data", "", "agent data directory (env MUSTER_AGENT_DATA)")
	out.register(cmd)
	return cmd
}

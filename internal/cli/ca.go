package cli

import "github.com/spf13/cobra"

func newCACmd(env *Env) *cobra.Command {
	cmd := &cobra.Command{Use: "ca", Short: "The authority's CA intermediates (docs/ca-lifecycle.md)"}
	cmd.AddCommand(newCARotateCmd(env))
	return cmd
}

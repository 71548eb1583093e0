package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/muster-dev/muster/internal/discoveryd"
)

// newDiscoveryAuditCmd reads and verifies discovery's own audit chain,
// directly in its store, whether or not discovery runs: muster audit goes
// through an authority's admin API, which discovery does not have.
func newDiscoveryAuditCmd(env *Env) *cobra.Command {
	cmd := &cobra.Command{Use: "audit", Short: "Read and verify discovery's audit log"}
	cmd.AddCommand(newDiscoveryAuditListCmd(env), newDiscoveryAuditVerifyCmd(env))
	return cmd
}

func newDiscoveryAuditListCmd(env *Env) *cobra.Command {
	var (
		sf  discoveryStoreFlags
		out output
		lf  auditListFlags
	)
	cmd := &cobra.Command{
		Use: "list --data DIR",
		Example: `  muster discovery audit list --data /var/lib/muster-discovery
  muster discovery audit list --data ./discovery-data -o json`,
		Short: "List discovery's audit records, oldest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			f, err := lf.filter(time.Now())
			if err != nil {
				return fmt.Errorf("discovery audit list: %w", err)
			}
			d, st, err := sf.open(cmd.Context(), env)
			if err != nil {
				return fmt.Errorf("discovery audit list: %w", err)
			}
			defer st.Close()
			// The logger is not needed to read, but opening it checks the
			// directory's keys and that the store is discovery's own.
			if _, err := discoveryd.AuditLog(cmd.Context(), string(d), st); err != nil {
				return fmt.Errorf("discovery audit list: %w", err)
			}
			recs, err := listStoredAudit(cmd.Context(), st, &lf, f)
			if err != nil {
				return fmt.Errorf("discovery audit list: %w", err)
			}
			return writeAuditList(env.Stdout, out, recs)
		},
	}
	sf.register(cmd)
	out.register(cmd)
	lf.register(cmd)
	return cmd
}

func newDiscoveryAuditVerifyCmd(env *Env) *cobra.Command {
	var (
		sf  discoveryStoreFlags
		out output
	)
	cmd := &cobra.Command{
		Use:     "verify --data DIR",
		Example: `  muster discovery audit verify --data /var/lib/muster-discovery`,
		Short:   "Check discovery's audit chain and its signed checkpoints; exits non-zero on tampering",
		Long: `verify walks discovery's whole audit chain in its store: every record's
keyed hash, the links between records, and the signed checkpoints kept in
the store and in the data directory. It names the first record that was
edited, removed or inserted, even when the whole chain was rewritten in the
database, and exits non-zero. It only reads, whether or not discovery runs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			d, st, err := sf.open(cmd.Context(), env)
			if err != nil {
				return fmt.Errorf("discovery audit verify: %w", err)
			}
			defer st.Close()
			l, err := discoveryd.AuditLog(cmd.Context(), string(d), st)
			if err != nil {
				return fmt.Errorf("discovery audit verify: %w", err)
			}
			rep, err := l.Verify(cmd.Context())
			if err != nil {
				return fmt.Errorf("discovery audit verify: %w", err)
			}
			return writeAuditVerify(env.Stdout, out, "discovery audit verify", auditVerifyOf(rep))
		},
	}
	sf.register(cmd)
	out.register(cmd)
	return cmd
}

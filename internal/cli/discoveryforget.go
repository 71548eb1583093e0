package cli

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/muster-dev/muster/internal/discoveryd"
	"github.com/muster-dev/muster/internal/store"
)

type forgetJSON struct {
	AuthorityID   string    `json:"authority_id"`
	CAFingerprint string    `json:"ca_fingerprint"`
	Version       int64     `json:"version"`
	RegisteredAt  time.Time `json:"registered_at"`
	UpdatedAt     time.Time `json:"updated_at"`
}

func newDiscoveryForgetCmd(env *Env) *cobra.Command {
	var (
		sf  discoveryStoreFlags
		out output
	)
	cmd := &cobra.Command{
		Use:     "forget AUTHORITY_ID --data DIR",
		Example: `  muster discovery forget prod-a3f2e1 --data /var/lib/muster-discovery`,
		Short:   "Delete an authority's registration, freeing its ID",
		Long: `forget deletes an authority's registration through the store, whether or
not discovery is running (running servers stop serving it at once), and
records it in discovery's audit chain. The authority ID is free again: the
next registration discovery allows locks it to its root anew.

Use it when an ID is registered under a root that is not its authority's
(registered before the allow-list, or under --open-registration), when the
allow-list entry of an authority changed, or for an authority that is
gone. An authority still running and still allowed registers again within
30 seconds. Join reports already counted for the ID are kept until
they expire (48 hours), and count toward its daily quota.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.check(); err != nil {
				return err
			}
			d, st, err := sf.open(cmd.Context(), env)
			if err != nil {
				return fmt.Errorf("discovery forget: %w", err)
			}
			defer st.Close()
			reg, err := discoveryd.Forget(cmd.Context(), string(d), st, args[0])
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("discovery forget: authority %s is not registered with this discovery", args[0])
			}
			if err != nil {
				return fmt.Errorf("discovery forget: %w", err)
			}
			res := forgetJSON{AuthorityID: reg.AuthorityID, CAFingerprint: reg.RootFingerprint, Version: reg.Version,
				RegisteredAt: reg.RegisteredAt, UpdatedAt: reg.UpdatedAt}
			if out.json() {
				return out.write(env.Stdout, res)
			}
			printForget(env.Stdout, res)
			return nil
		},
	}
	sf.register(cmd)
	out.register(cmd)
	return cmd
}

func printForget(w io.Writer, res forgetJSON) {
	fmt.Fprintf(w, "Forgot authority %s\n", res.AuthorityID)
	fmt.Fprintf(w, "  CA:          %s\n", res.CAFingerprint)
	fmt.Fprintf(w, "  Version:     %d\n", res.Version)
	fmt.Fprintf(w, "  Registered:  %s\n", pskTime(res.RegisteredAt))
	fmt.Fprintf(w, "  Updated:     %s\n", pskTime(res.UpdatedAt))
	fmt.Fprintf(w, "\nThe ID is free: the next registration this discovery allows locks it to its root.\n")
}

package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/muster-dev/muster/internal/authority"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

func newSettingsCmd(env *Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "settings",
		Short: "List and change the shared settings every replica takes from the store",
		Long: `The shared settings govern state every authority replica on a store acts
on: ` + strings.Join(authority.SharedSettingKeys(), ", ") + `. The store keeps
their values once and every replica uses the store's;
"muster settings set KEY VALUE" changes one for every replica at once
(docs/high-availability.md, "Settings kept in the store").`,
	}
	cmd.AddCommand(newSettingsListCmd(env), newSettingsSetCmd(env))
	return cmd
}

// settingJSON is one line of settings list -o json, and settings set's.
type settingJSON struct {
	Key   string `json:"key"`
	Value string `json:"value"`
	// Version is 0 while the store holds no value (an authority records
	// its own at start).
	Version   int64      `json:"version"`
	UpdatedAt *time.Time `json:"updated_at,omitempty"`
	UpdatedBy string     `json:"updated_by,omitempty"`
}

func settingOf(s *musterv1.Setting) settingJSON {
	j := settingJSON{Key: s.GetKey(), Value: s.GetValue(), Version: s.GetVersion(), UpdatedBy: s.GetUpdatedBy()}
	if s.GetUpdatedAt() != nil {
		t := s.GetUpdatedAt().AsTime().UTC()
		j.UpdatedAt = &t
	}
	return j
}

func newSettingsListCmd(env *Env) *cobra.Command {
	var (
		af  adminFlags
		out output
	)
	cmd := &cobra.Command{
		Use: "list",
		Example: `  muster settings list --data ./muster-data
  muster settings list -o json`,
		Short: "List the shared settings in force on every replica",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			resp, err := callAdmin(cmd, env, &af, "settings list", func(ctx context.Context, c *adminClient) (*musterv1.ListSettingsResponse, error) {
				return c.ListSettings(ctx, &musterv1.ListSettingsRequest{})
			})
			if err != nil {
				return err
			}
			list := []settingJSON{}
			for _, s := range resp.GetSettings() {
				list = append(list, settingOf(s))
			}
			if out.json() {
				return out.write(env.Stdout, list)
			}
			return printSettings(env.Stdout, list)
		},
	}
	af.register(cmd)
	out.register(cmd)
	return cmd
}

// printSettings is settings list's table.
func printSettings(w io.Writer, list []settingJSON) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tVALUE\tVERSION\tUPDATED\tBY")
	for _, s := range list {
		at, by := "-", s.UpdatedBy
		if s.UpdatedAt != nil {
			at = s.UpdatedAt.Format(time.RFC3339)
		}
		if s.Version == 0 {
			by = "(not in the store yet: the answering replica's)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", s.Key, s.Value, s.Version, at, by)
	}
	return tw.Flush()
}

func newSettingsSetCmd(env *Env) *cobra.Command {
	var (
		af  adminFlags
		out output
	)
	cmd := &cobra.Command{
		Use: "set KEY VALUE",
		Example: `  muster settings set signer.min_lead_time 30m
  muster settings set ca.intermediate_ttl 4380h --data ./muster-data`,
		Short: "Change a shared setting for every replica",
		Long: `set changes a shared setting in the store; every replica uses the new
value within moments, without a restart, and the change is audited as
setting.set. VALUE is read as the key's value in authority.yaml is, with
the same bounds.

A replica whose authority.yaml (or flag, or MUSTER_* variable) gives the
key another value refuses to start until that value is changed or left
out, so edit those files too.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.check(); err != nil {
				return err
			}
			key, value := args[0], args[1]
			// Checked here too, so a typo is named before a connection.
			if _, err := authority.ParseSharedSetting(key, value); err != nil {
				return fmt.Errorf("settings set: %w", err)
			}
			resp, err := callAdmin(cmd, env, &af, "settings set", func(ctx context.Context, c *adminClient) (*musterv1.Setting, error) {
				return c.SetSetting(ctx, &musterv1.SetSettingRequest{Key: key, Value: value})
			})
			if err != nil {
				return err
			}
			j := settingOf(resp)
			if out.json() {
				return out.write(env.Stdout, j)
			}
			fmt.Fprintf(env.Stdout, "%s is %s for every replica (version %d); give it this value, or leave it out, in every replica's authority.yaml\n",
				j.Key, j.Value, j.Version)
			return nil
		},
	}
	af.register(cmd)
	out.register(cmd)
	return cmd
}

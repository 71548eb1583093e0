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
"muster settings set KEY VALUE" changes one for every replica at once.
With no authority running (or every one refusing to start), --offline
--data DIR lists and changes them in the store itself
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
		of  settingsOfflineFlags
		out output
	)
	cmd := &cobra.Command{
		Use: "list",
		Example: `  muster settings list --data ./muster-data
  muster settings list -o json
  muster settings list --offline --data /var/lib/muster/authority   # no authority running`,
		Short: "List the shared settings in force on every replica",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			if err := of.check(cmd, "settings list"); err != nil {
				return err
			}
			list := []settingJSON{}
			unheld := "(not in the store yet: the answering replica's)"
			if of.offline {
				var err error
				if list, err = listSettingsOffline(cmd.Context(), env, af.data, of); err != nil {
					return fmt.Errorf("settings list --offline: %w", err)
				}
				unheld = "(not in the store yet: authority.yaml's or the default)"
			} else {
				resp, err := callAdmin(cmd, env, &af, "settings list", func(ctx context.Context, c *adminClient) (*musterv1.ListSettingsResponse, error) {
					return c.ListSettings(ctx, &musterv1.ListSettingsRequest{})
				})
				if err != nil {
					return err
				}
				for _, s := range resp.GetSettings() {
					list = append(list, settingOf(s))
				}
			}
			if out.json() {
				return out.write(env.Stdout, list)
			}
			return printSettings(env.Stdout, list, unheld)
		},
	}
	af.register(cmd)
	registerSettingsOffline(cmd, &of, "read them")
	out.register(cmd)
	return cmd
}

// printSettings is settings list's table; unheld says whose value a key
// the store holds none of shows.
func printSettings(w io.Writer, list []settingJSON, unheld string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tVALUE\tVERSION\tUPDATED\tBY")
	for _, s := range list {
		at, by := "-", s.UpdatedBy
		if s.UpdatedAt != nil {
			at = s.UpdatedAt.Format(time.RFC3339)
		}
		if s.Version == 0 {
			by = unheld
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", s.Key, s.Value, s.Version, at, by)
	}
	return tw.Flush()
}

func newSettingsSetCmd(env *Env) *cobra.Command {
	var (
		af  adminFlags
		of  settingsOfflineFlags
		out output
	)
	cmd := &cobra.Command{
		Use: "set KEY VALUE [--offline --data DIR]",
		Example: `  muster settings set signer.min_lead_time 30m
  muster settings set ca.intermediate_ttl 4380h --data ./muster-data
  muster settings set signer.min_lead_time 30m --offline --data /var/lib/muster/authority   # no replica running`,
		Short: "Change a shared setting for every replica",
		Long: `set changes a shared setting in the store; every replica uses the new
value within moments, without a restart, and the change is audited as
setting.set. VALUE is read as the key's value in authority.yaml is, with
the same bounds.

A replica on PostgreSQL whose authority.yaml (or flag, or MUSTER_*
variable) gives the key another value refuses to start until that value
is changed or left out, so edit those files too. On SQLite, where one
authority uses the store, the authority's own value replaces the
store's when it starts: there, editing authority.yaml and restarting is
the usual way to change a setting.

--offline changes the setting in the store itself, from the data
directory (--data, with --store if the store is not the one it names),
when no authority runs to take the request, or every replica refuses to
start. It may run beside a running authority too, which uses the new
value within seconds. The change is audited as setting.set by "` + settingsOfflineActor + `".`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.check(); err != nil {
				return err
			}
			if err := of.check(cmd, "settings set"); err != nil {
				return err
			}
			key, value := args[0], args[1]
			// Checked here too, so a typo is named before a connection.
			if _, err := authority.ParseSharedSetting(key, value); err != nil {
				return fmt.Errorf("settings set: %w", err)
			}
			if of.offline {
				r, err := setSettingOffline(cmd.Context(), env, af.data, of, key, value)
				if err != nil {
					return fmt.Errorf("settings set --offline: %w", err)
				}
				if out.json() {
					return out.write(env.Stdout, r.row)
				}
				printOfflineSet(env.Stdout, r)
				return nil
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
	registerSettingsOffline(cmd, &of, "change it")
	out.register(cmd)
	return cmd
}

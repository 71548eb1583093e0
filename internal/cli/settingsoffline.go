package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/authority"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/store"
)

// settingsOfflineActor is the audit actor of muster settings set
// --offline: no operator certificate vouches for it, the storage key
// does.
const settingsOfflineActor = "muster settings set --offline"

// settingsOfflineFlags are settings list's and set's --offline, --store
// and --config.
type settingsOfflineFlags struct {
	auditOfflineFlags
}

// registerSettingsOffline registers settings list's and set's --offline,
// --store and --config into o.
func registerSettingsOffline(cmd *cobra.Command, o *settingsOfflineFlags, what string) {
	cmd.Flags().BoolVar(&o.offline, "offline", false, what+" in the store itself, from the data directory (--data), without an authority: for when none runs, or every one refuses to start")
	cmd.Flags().StringVar(&o.storeURL, "store", "", "with --offline: the authority's store URL (env MUSTER_STORE; default: the store: of the settings file, else "+storeDefaultHelp+")")
	cmd.Flags().StringVar(&o.configFile, "config", "", configHelp("with --offline: "))
}

// fileShared is, by key, the text authority.yaml gives each shared
// setting ("" where it leaves it to its default).
func fileShared(cfg authorityConfig) map[string]string {
	return map[string]string{
		authority.SettingSignerMinLeadTime:    cfg.Signer.MinLeadTime,
		authority.SettingCAIntermediateTTL:    cfg.CA.IntermediateTTL,
		authority.SettingCADraftTTL:           cfg.CA.DraftTTL,
		authority.SettingJWTKeyRotationPeriod: cfg.JWTSVID.KeyRotationPeriod,
	}
}

// fileSharedValue is key's value as authority.yaml gives it, or its
// default where the file leaves it out.
func fileSharedValue(cfg authorityConfig, key string) (string, error) {
	text := fileShared(cfg)[key]
	if text == "" {
		return authority.SharedSettings{}.Get(key).String(), nil
	}
	v, err := authority.ParseSharedSetting(key, text)
	if err != nil {
		return "", err
	}
	return v.String(), nil
}

// listSettingsOffline is settings list --offline: the store's values,
// and for a key it holds none of, the data directory's authority.yaml's
// (or the default), version 0, as the authority records at its start.
func listSettingsOffline(ctx context.Context, env *Env, data string, o settingsOfflineFlags) ([]settingJSON, error) {
	st, _, od, err := openOffline(ctx, env, data, o.configFile, o.storeURL)
	if err != nil {
		return nil, err
	}
	cfg, cfgPath := od.cfg, od.configPath
	defer st.Close()
	held, err := st.ListSettings(ctx)
	if err != nil {
		return nil, err
	}
	byKey := map[string]store.Setting{}
	for _, h := range held {
		byKey[h.Key] = h
	}
	list := []settingJSON{}
	for _, key := range authority.SharedSettingKeys() {
		h, ok := byKey[key]
		if !ok {
			v, err := fileSharedValue(cfg, key)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", cfgPath, err)
			}
			list = append(list, settingJSON{Key: key, Value: v})
			continue
		}
		at := h.UpdatedAt.UTC()
		list = append(list, settingJSON{Key: h.Key, Value: h.Value, Version: h.Version, UpdatedAt: &at, UpdatedBy: h.UpdatedBy})
	}
	return list, nil
}

// offlineSet is what settings set --offline wrote, and what the data
// directory says of it.
type offlineSet struct {
	row settingJSON
	// was is the value before: the store's, or the data directory's
	// where the store held none.
	was string
	// file is what the data directory's authority.yaml gives the key ("":
	// nothing), and config that file.
	file, config string
	// replicated: the store is one several replicas share (PostgreSQL).
	replicated bool
	dir        datadir.Dir
}

// setSettingOffline is settings set --offline: the shared setting key
// changed in the store itself, from the data directory, with no
// authority running (or beside one: the write is the store's own
// conditional write, from the version read, as through the admin API),
// and audited as setting.set in the chain, keyed by the storage key as
// the authority's own records are. value has been checked.
func setSettingOffline(ctx context.Context, env *Env, data string, o settingsOfflineFlags, key, value string) (offlineSet, error) {
	st, logger, od, err := openOffline(ctx, env, data, o.configFile, o.storeURL)
	if err != nil {
		return offlineSet{}, err
	}
	defer st.Close()
	// A chain cut short is refused here as at the authority's start:
	// appending would reuse the removed records' numbers.
	if err := logger.CheckHead(ctx); err != nil {
		return offlineSet{}, err
	}
	v, err := authority.ParseSharedSetting(key, value)
	if err != nil {
		return offlineSet{}, err
	}
	cfg, dir := od.cfg, od.dir
	res := offlineSet{file: fileShared(cfg)[key], config: od.configPath, replicated: st.Replicated(), dir: dir}
	h, ok, err := heldSetting(ctx, st, key)
	if err != nil {
		return offlineSet{}, err
	}
	var from store.Setting
	if ok {
		from, res.was = h, h.Value
	} else if res.was, err = fileSharedValue(cfg, key); err != nil {
		res.was = authority.SharedSettings{}.Get(key).String()
	}
	row, err := putAudited(ctx, st, logger, store.Setting{Key: key, Value: v.String(), UpdatedBy: settingsOfflineActor}, from,
		audit.Event{Actor: settingsOfflineActor, Action: "setting.set", Target: key, Result: audit.ResultOK,
			Reason: fmt.Sprintf("%s was %s, now %s for every replica (offline, from the data directory %s)", key, res.was, v, dir)})
	if errors.Is(err, store.ErrConflict) {
		return offlineSet{}, fmt.Errorf("%s was changed by another write at the same time: see `muster settings list --offline --data %s%s`, "+
			"and run this again if it is still wanted", key, od.quoted(), od.configArg())
	}
	if err != nil {
		return offlineSet{}, fmt.Errorf("%s not changed: it is written with its audit record or not at all, and the write failed: %w", key, err)
	}
	at := row.UpdatedAt.UTC()
	res.row = settingJSON{Key: row.Key, Value: row.Value, Version: row.Version, UpdatedAt: &at, UpdatedBy: row.UpdatedBy}
	return res, nil
}

// printOfflineSet is settings set --offline's report: the value now, who
// uses it when, and what the data directory's authority.yaml must say.
func printOfflineSet(w io.Writer, r offlineSet) {
	fmt.Fprintf(w, "%s is %s in the store (version %d), written offline; ", r.row.Key, r.row.Value, r.row.Version)
	if r.replicated {
		fmt.Fprintln(w, "every running replica uses it within moments, and every replica that starts uses it.")
	} else {
		fmt.Fprintf(w, "a running authority uses it within %s, a stopped one when it starts.\n", 2*authority.SettingsRefresh)
	}
	switch {
	case r.file == "":
	case fileAgrees(r.row.Key, r.file, r.row.Value):
		return
	case r.replicated:
		fmt.Fprintf(w, "%s gives %s %s: a replica started from it refuses to start; make it %s there or leave it out, and likewise in every other replica's authority.yaml.\n",
			r.config, r.row.Key, r.file, r.row.Value)
		return
	default:
		fmt.Fprintf(w, "%s gives %s %s, which the authority's next start puts back in the store: make it %s there or leave it out.\n",
			r.config, r.row.Key, r.file, r.row.Value)
		return
	}
	if r.replicated {
		fmt.Fprintln(w, "Give it this value, or leave it out, in every replica's authority.yaml.")
	}
}

// fileAgrees: authority.yaml's text for key means value.
func fileAgrees(key, text, value string) bool {
	v, err := authority.ParseSharedSetting(key, text)
	return err == nil && v.String() == value
}

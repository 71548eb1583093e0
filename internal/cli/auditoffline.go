package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/store"
)

// auditOfflineFlags are audit list's and audit verify's --offline and
// --store: the chain read in the store itself, from the data directory,
// when no authority answers. An authority that refuses to start records
// why in the chain (authority.start, denied) where the store is reachable,
// and reading it through the admin API needs the authority that refused.
type auditOfflineFlags struct {
	offline  bool
	storeURL string
	// configFile is --config: the settings file the authority is started
	// with (muster authority --config), where its store URL may be.
	configFile string
}

func (o *auditOfflineFlags) register(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&o.offline, "offline", false, "read the chain in the store, from the data directory, without the authority (it need not run)")
	cmd.Flags().StringVar(&o.storeURL, "store", "", "with --offline: the authority's store URL (env MUSTER_STORE; default: "+storeDefaultHelp+")")
	cmd.Flags().StringVar(&o.configFile, "config", "", configHelp("with --offline: "))
}

// check refuses flags that go with --offline given without it, and the
// admin API's flags given with it: they would be silently ignored.
func (o *auditOfflineFlags) check(cmd *cobra.Command, name string) error {
	if !o.offline {
		for _, f := range []string{"store", "config"} {
			if cmd.Flags().Changed(f) {
				return fmt.Errorf("%s: --%s goes with --offline", name, f)
			}
		}
		return nil
	}
	return refuseAdminAPIFlags(cmd, name)
}

// open opens the store of the data directory and the audit logger over
// it, as the authority's start does (openOffline).
func (o *auditOfflineFlags) open(ctx context.Context, env *Env, af *adminFlags) (store.Store, *audit.Logger, error) {
	st, logger, _, err := openOffline(ctx, env, af.data, o.configFile, o.storeURL)
	return st, logger, err
}

// openOffline opens the store of the data directory data (--data,
// MUSTER_DATA, or ./muster-data) and the audit logger over it, as the
// authority's start does, without the directory's lock, so it may run
// beside a running authority (SQLite's readers do not block its writer,
// and its writes, each the store's own conditional write, queue behind
// the authority's). A SQLite store that does not exist is an error, not
// a new empty database. It returns the directory and the settings read
// too: configFile (--config), as muster authority --config reads it,
// else the directory's authority.yaml, where the store URL may be.
func openOffline(ctx context.Context, env *Env, data, configFile, storeURL string) (store.Store, *audit.Logger, offlineDir, error) {
	st, d, od, err := openOfflineDirStore(ctx, env, data, configFile, storeURL)
	if err != nil {
		return nil, nil, od, err
	}
	logger, err := newAuditLogger(st, d.sk, od.dir, od.configPath, nil)
	if err != nil {
		st.Close()
		return nil, nil, od, err
	}
	return st, logger, od, nil
}

// openOfflineDirStore reads the data directory data and its settings
// (loadOfflineDir) and opens its store (openOfflineStore): storeURL
// (--store), else MUSTER_STORE, else the settings file's, else the one
// authority.json records.
func openOfflineDirStore(ctx context.Context, env *Env, data, configFile, storeURL string) (store.Store, dataDir, offlineDir, error) {
	od, err := loadOfflineDir(env, data, configFile)
	if err != nil {
		return nil, dataDir{}, od, err
	}
	st, d, err := openOfflineStore(ctx, od, od.storeURL(env, storeURL))
	return st, d, od, err
}

// refuseAdminAPIFlags refuses --authority and --identity given to name's
// --offline: they would be silently ignored.
func refuseAdminAPIFlags(cmd *cobra.Command, name string) error {
	for _, f := range []string{"authority", "identity"} {
		if cmd.Flags().Changed(f) {
			return fmt.Errorf("%s: --%s names the authority's admin API, which --offline does not use", name, f)
		}
	}
	return nil
}

// openOfflineStore opens and checks the store storeURL ("": the one
// od's authority.json records) of od's data directory, without its lock.
// A SQLite store that does not exist is an error naming --store and
// --config, not a new empty database.
func openOfflineStore(ctx context.Context, od offlineDir, storeURL string) (store.Store, dataDir, error) {
	d, err := loadDataDir(od.dir, storeURL)
	if err != nil {
		return nil, d, err
	}
	d.migrating = refuseOfflineMigration
	st, err := openLoadedOfflineStore(ctx, od, d)
	return st, d, err
}

// openLoadedOfflineStore opens and checks the store of d, loaded from
// od's data directory, migrating it as d.migrating says.
func openLoadedOfflineStore(ctx context.Context, od offlineDir, d dataDir) (store.Store, error) {
	if path, ok := strings.CutPrefix(d.url, "sqlite://"); ok {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("no store at %s: give the store the authority uses with --store, or the settings file it is started with with --config", path)
		}
	}
	st, err := d.openStore(ctx)
	if err != nil {
		return nil, err
	}
	if err := datadir.CheckStore(ctx, st, od.dir, d.info, storeURLWithoutPassword(d.url)); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

// refuseOfflineMigration is an offline command's migrating: the store is
// shared with authorities that may run beside the command, or be started
// after it, of the version that last migrated it: moving the schema on
// here would make every one of them refuse to start. The authority of the
// new version migrates at its start.
func refuseOfflineMigration(from, to int) error {
	if from == 0 {
		return nil // no schema yet: CheckStore says what is wrong
	}
	return fmt.Errorf("the store is at schema version %d; this muster knows version %d and would migrate it, "+
		"after which every muster that knows only version %d (the authority using it, until upgraded) refuses to start: "+
		"run this command with the muster of the authority's version (`muster version` shows the schema a binary knows), "+
		"or upgrade the authority first, which migrates the store at its start (docs/install.md, \"Upgrades\")", from, to, from)
}

// auditReader is the part of a store (the authority's or discovery's)
// listStoredAudit reads.
type auditReader interface {
	ListAudit(ctx context.Context, f store.AuditFilter) ([]store.AuditRecord, error)
}

// listStoredAudit pages the records of st's chain that f selects, up to
// --limit, as audit list prints them.
func listStoredAudit(ctx context.Context, st auditReader, lf *auditListFlags, f store.AuditFilter) ([]auditJSON, error) {
	return lf.page(func(afterSeq int64, n int) ([]auditJSON, int64, error) {
		if n <= 0 {
			return nil, 0, nil
		}
		f.AfterSeq, f.Limit = afterSeq, n
		rs, err := st.ListAudit(ctx, f)
		if err != nil {
			return nil, 0, err
		}
		page := make([]auditJSON, 0, len(rs))
		for _, r := range rs {
			page = append(page, auditRecordJSON(r))
		}
		next := int64(0)
		if len(rs) == n {
			next = rs[n-1].Seq
		}
		return page, next, nil
	})
}

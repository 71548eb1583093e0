package cli

import (
	"fmt"
	"strings"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/shellword"
)

// configHelp is --config's help on a command that opens the authority's
// store itself, from its data directory; with is what it goes with
// ("with --offline: ", or "" where the command is always offline).
func configHelp(with string) string {
	return with + "the settings file the authority is started with, as muster authority --config FILE reads it, where its store URL may be (env MUSTER_CONFIG; default: DIR/authority.yaml)"
}

// readAuthorityConfig reads the settings an authority of dir started with
// --config configFile reads ("": dir's authority.yaml), and returns them
// and that file's path: the one reading muster authority and every
// command that opens its store from the data directory share, so an
// offline command given the unit's --config opens the store the running
// authority uses.
func readAuthorityConfig(dir datadir.Dir, configFile string) (authorityConfig, string, error) {
	path, err := authorityConfigPath(dir, configFile)
	if err != nil {
		return authorityConfig{}, "", err
	}
	cfg, err := loadAuthorityConfig(path, dir)
	return cfg, path, err
}

// offlineDir is the data directory a command that opens the authority's
// store itself acts on, and the settings file the authority reads with
// it.
type offlineDir struct {
	dir datadir.Dir
	cfg authorityConfig
	// configPath is the settings file cfg was read from.
	configPath string
	// token is the module and PIN file the authority's token is opened
	// with (readTokenAccess).
	token tokenAccess
}

// loadOfflineDir reads the data directory data (--data, MUSTER_DATA, or
// ./muster-data) and its settings, from configFile (--config, else
// MUSTER_CONFIG) if given, as muster authority reads them: a shell or
// container that starts the authority with MUSTER_CONFIG (it reads
// MUSTER_DATA and MUSTER_STORE as these commands do) names the same file
// to them, not DIR/authority.yaml and so perhaps another store. The
// token's module and PIN file are the authority's variables too
// (readTokenAccess).
func loadOfflineDir(env *Env, data, configFile string) (offlineDir, error) {
	dir := datadir.Dir(firstOf(data, env.Getenv("MUSTER_DATA"), "muster-data"))
	cfg, path, err := readAuthorityConfig(dir, firstOf(configFile, env.Getenv("MUSTER_CONFIG")))
	return offlineDir{dir: dir, cfg: cfg, configPath: path, token: readTokenAccess(env, "", "")}, err
}

// storeURL is the store an offline command opens: given (--store),
// else MUSTER_STORE, else the settings file's; "" leaves it to the
// directory's authority.json.
func (o offlineDir) storeURL(env *Env, given string) string {
	return firstOf(given, env.Getenv("MUSTER_STORE"), o.cfg.Store)
}

// configArg is what a command printed for the operator to paste adds
// after --data DIR: --config FILE where the settings file is not
// DIR/authority.yaml.
func (o offlineDir) configArg() string {
	return o.dir.ConfigArg(o.configPath)
}

// quoted is the data directory, quoted for a command to paste.
func (o offlineDir) quoted() string {
	return shellword.Quote(string(o.dir))
}

// newAuditLogger is datadir.NewAuditLogger for the authority of dir
// started with the settings file configPath: a damaged head file's
// refusal names the offline audit verify that walks its chain, with
// --config where configPath is not DIR/authority.yaml.
func newAuditLogger(st audit.Store, sk seal.StorageKey, dir datadir.Dir, configPath string, onAppend func(audit.Event)) (*audit.Logger, error) {
	l, err := datadir.NewAuditLogger(st, sk, dir.CheckpointFile(), onAppend)
	if err != nil {
		return nil, err
	}
	l.SetVerifyCommand(fmt.Sprintf("muster audit verify --offline --data %s%s", shellword.Quote(string(dir)), dir.ConfigArg(configPath)))
	l.SetRestoreDoc(restoreDoc(dir, configPath, dataDir{}))
	return l, nil
}

// restoreDoc is what a refusal of a restored store says the restore
// undid, and the command that re-applies it once the audit files are
// moved aside: with d's SQLite store, from the file the operator guide
// says to move it to (muster.db.before-restore); else from STORE, the
// database the restore replaced, which only the operator knows. A store
// not the one authority.json records (given with --store, MUSTER_STORE
// or the settings file) is named with --store, without its password.
func restoreDoc(dir datadir.Dir, configPath string, d dataDir) string {
	from, store := "STORE", ""
	if path, ok := strings.CutPrefix(d.url, "sqlite://"); ok {
		path, _, _ = strings.Cut(path, "?")
		from = shellword.Quote("sqlite://" + path + ".before-restore")
	}
	if d.url != "" && !d.urlFromInfo {
		store = " --store " + shellword.Quote(storeURLWithoutPassword(d.url))
	}
	return fmt.Sprintf(`it undid the locks, node deletions, token uses and rotations made since the backup: once these files are moved aside, `+
		`muster store reapply --offline --data %s%s%s --from %s prints what it re-applies from the store the restore replaced, and writes it with --apply; `+
		`docs/operator-guide.md, "Backing up and restoring the SQLite store"`, shellword.Quote(string(dir)), dir.ConfigArg(configPath), store, from)
}

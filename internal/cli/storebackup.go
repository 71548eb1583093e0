package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

// backupActor is the audit actor of a backup: no operator certificate
// vouches for it, the storage key does (as for store reapply).
const backupActor = "muster store backup"

func newStoreBackupCmd(env *Env) *cobra.Command {
	var (
		data, out, storeURL, configFile string
		force                           bool
	)
	cmd := &cobra.Command{
		Use: "backup --data DIR --out FILE [--force]",
		Example: `  muster store backup --data /var/lib/muster/authority --out /backup/muster-$(date +%F).db
  muster store backup --data /var/lib/muster/authority --config /etc/muster/authority.yaml --out /backup/muster.db --force`,
		Short: "Write a consistent snapshot of the SQLite store, while the authority runs",
		Long: `backup copies the authority's SQLite store into FILE as one consistent
snapshot (SQLite's VACUUM INTO), while the authority serves: it blocks no
writer. FILE is made 0600 from the start, written beside it under a
temporary name and renamed only once the copy passed SQLite's integrity
check, so a partial backup never looks complete; an existing FILE is
refused unless --force. The backup is recorded in the audit chain as a
store.backup record.

The backup holds every secret the store keeps, sealed with the data
directory's storage.key, which is not in it: without DIR/storage.key (and
DIR/authority.json and DIR/ca/, which the store is checked against) the
backup cannot be used. Back the data directory up too, keep both readable
by root alone. To restore one, see docs/operator-guide.md, "Backing up and
restoring the SQLite store".

A PostgreSQL store is backed up with pg_dump (docs/high-availability.md,
"Backup and restore").`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return errors.New("store backup: --out FILE is required: the file to write the backup to, such as /backup/muster.db")
			}
			res, err := backupStore(cmd.Context(), env, data, configFile, storeURL, out, force)
			if err != nil {
				return fmt.Errorf("store backup: %w", err)
			}
			res.print(env.Stdout)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&data, "data", "", "authority data directory (env MUSTER_DATA, default ./muster-data)")
	f.StringVar(&out, "out", "", "the file to write the backup to (required; made 0600; refused if it exists, unless --force)")
	f.BoolVar(&force, "force", false, "replace --out if it exists")
	f.StringVar(&storeURL, "store", "", "the authority's store URL (env MUSTER_STORE; default: "+storeDefaultHelp+")")
	f.StringVar(&configFile, "config", "", configHelp(""))
	return cmd
}

// backupResult is what store backup did.
type backupResult struct {
	Out        string
	Bytes      int64
	Schema     int
	AuditSeq   int64
	Dir        string
	storageKey string
}

func (r *backupResult) print(w io.Writer) {
	fmt.Fprintf(w, "Backup written: %s (%d bytes, schema version %d, integrity check ok, 0600), audit record %d (store.backup).\n",
		r.Out, r.Bytes, r.Schema, r.AuditSeq)
	fmt.Fprintf(w, "It is useless without the data directory it was taken from: keep a copy of %s (the storage key every secret in the backup is sealed with), %s and %s with it.\n",
		r.storageKey, filepath.Join(r.Dir, "authority.json"), filepath.Join(r.Dir, "ca")+string(filepath.Separator))
	fmt.Fprintln(w, "The backup and these files are secrets: keep them readable by root alone, the storage key apart from the backups.")
	fmt.Fprintln(w, "To restore it: docs/operator-guide.md, \"Backing up and restoring the SQLite store\".")
}

// backupStore writes the backup of the SQLite store of the data
// directory data to out and appends its store.backup record.
func backupStore(ctx context.Context, env *Env, data, configFile, storeURL, out string, force bool) (*backupResult, error) {
	od, err := loadOfflineDir(env, data, configFile)
	if err != nil {
		return nil, err
	}
	d, err := loadDataDir(od.dir, od.storeURL(env, storeURL))
	if err != nil {
		return nil, err
	}
	src, ok := strings.CutPrefix(d.url, "sqlite://")
	if !ok {
		return nil, fmt.Errorf("the store is PostgreSQL (%s): back it up with pg_dump, which reads one consistent snapshot while the replicas run, "+
			"as docs/high-availability.md \"Backup and restore\" says: pg_dump -Fc -d %s -f muster.dump",
			storeURLWithoutPassword(d.url), shellword.Quote(storeURLWithoutPassword(d.url)))
	}
	out, err = filepath.Abs(out)
	if err != nil {
		return nil, err
	}
	if abs, err := filepath.Abs(src); err == nil && (abs == out || strings.HasPrefix(out, abs+"-")) {
		return nil, fmt.Errorf("--out %s is the store itself or one of its files: give a file elsewhere, such as /backup/muster.db", out)
	}
	if _, err := os.Lstat(out); err == nil && !force {
		return nil, fmt.Errorf("%s exists: give another --out, or add --force to replace it", out)
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	// The store opened as the offline commands open it: checked against
	// the data directory (its storage key opens the store's), never
	// migrated, its audit chain's head checked before anything is
	// appended to it. An authority running on it is left alone.
	st, d, err := openOfflineStore(ctx, od, d.url)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	logger, err := newAuditLogger(st, d.sk, od.dir, od.configPath, nil)
	if err != nil {
		return nil, err
	}
	if err := logger.CheckHead(ctx); err != nil {
		return nil, err
	}

	size, schema, err := writeBackup(ctx, src, out, force)
	if err != nil {
		return nil, err
	}
	rec, err := logger.Record(ctx, audit.Event{Actor: backupActor, Action: "store.backup", Target: out, Result: audit.ResultOK,
		Reason: fmt.Sprintf("snapshot of %s (%d bytes, schema version %d), sealed with the storage key of %s", src, size, schema, od.dir)})
	if err != nil {
		return nil, fmt.Errorf("the backup %s is written and checked, but its audit record is not: %w", out, err)
	}
	// The files to keep named as a path that works from anywhere.
	dir, err := filepath.Abs(string(od.dir))
	if err != nil {
		dir = string(od.dir)
	}
	return &backupResult{Out: out, Bytes: size, Schema: schema, AuditSeq: rec.Seq, Dir: dir,
		storageKey: datadir.Dir(dir).StorageKeyFile()}, nil
}

// writeBackup writes the snapshot of the store at src into a new 0600
// file beside out, checks it, and only then puts it at out: a backup cut
// short (a full disk, a crash, a failed check) is left under no name
// that looks complete, and is removed when it can be.
func writeBackup(ctx context.Context, src, out string, force bool) (size int64, schema int, err error) {
	// os.CreateTemp makes the file 0600 before anything is in it.
	tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".partial-*")
	if err != nil {
		return 0, 0, fmt.Errorf("making the backup file beside %s: %w", out, err)
	}
	name := tmp.Name()
	done := false
	defer func() {
		if !done {
			os.Remove(name)
		}
	}()
	if err := tmp.Close(); err != nil {
		return 0, 0, err
	}
	if err := sqlite.BackupInto(ctx, src, name); err != nil {
		return 0, 0, err
	}
	if err := syncFile(name); err != nil {
		return 0, 0, err
	}
	if schema, err = sqlite.CheckBackup(ctx, name); err != nil {
		return 0, 0, fmt.Errorf("the backup written fails its check, and is removed: %w", err)
	}
	fi, err := os.Stat(name)
	if err != nil {
		return 0, 0, err
	}
	if force {
		err = os.Rename(name, out)
	} else {
		// A link fails where out appeared since it was looked for: an
		// existing file is never replaced without --force.
		if err = os.Link(name, out); err == nil {
			err = os.Remove(name)
		} else if errors.Is(err, fs.ErrExist) {
			err = fmt.Errorf("%s exists: give another --out, or add --force to replace it", out)
		}
	}
	if err != nil {
		return 0, 0, err
	}
	done = true
	if err := syncFile(filepath.Dir(out)); err != nil {
		return 0, 0, err
	}
	return fi.Size(), schema, nil
}

// syncFile makes path (a file, or a directory's entries) durable.
func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return nil
}

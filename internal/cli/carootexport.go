package cli

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/muster-dev/muster/internal/atomicfile"
	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/store"
)

// exportKeyActor is the audit actor of muster ca root export-key: it runs
// where the storage key is, without an operator certificate, as admin add
// --offline does.
const exportKeyActor = "muster ca root export-key"

func newCARootExportKeyCmd(env *Env) *cobra.Command {
	var (
		data, storeURL, path string
		configFile           string
		out                  output
	)
	cmd := &cobra.Command{
		Use: "export-key --out FILE",
		Example: `  muster ca root export-key --data /var/lib/muster --out /media/usb/root.key
  muster ca root export-key --data /var/lib/muster --config /etc/muster/authority.yaml --out /media/usb/root.key   # the packaged unit's settings file`,
		Short: "Take the root key a root rotation made offline: write it to FILE and remove it from the authority",
		Long: `After a root rotation (phase standby) the new root's key is sealed in the
store, so intermediates rotate by themselves. export-key takes it offline,
as moving DIR/ca/root.key away does for the root muster init made: on the
machine that holds the authority's data directory (its storage key), it
writes the key to FILE (PKCS#8 PEM, mode 0600, never overwritten) and
removes it from the store in one conditional write, audited
(ca.root_export_key). From then on the authority warns before each
intermediate's successor is due, and muster ca rotate ROLE --root-key FILE
prepares it (docs/ca-lifecycle.md). A key in a PKCS#11 token cannot be
exported. It opens the store the authority uses: --store, else store: in
the settings file the authority is started with (--config FILE, read as
muster authority --config FILE reads it; default DIR/authority.yaml), else
the one DIR/authority.json records.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			if path == "" {
				return errors.New("ca root export-key: --out FILE is required")
			}
			od, err := loadOfflineDir(env, data, configFile)
			if err != nil {
				return fmt.Errorf("ca root export-key: %w", err)
			}
			fp, err := exportRootKey(cmd.Context(), od, od.storeURL(env, storeURL), path)
			if err != nil {
				return fmt.Errorf("ca root export-key: %w", err)
			}
			if out.json() {
				return out.write(env.Stdout, map[string]any{"root_fingerprint": fp, "key_file": path})
			}
			fmt.Fprintf(env.Stdout, "The key of the root %s is in %s (mode 0600) and no longer held by the authority.\nKeep it offline; prepare intermediates with `muster ca rotate ROLE --root-key %s` when the authority warns.\n", fp, path, shellword.Quote(path))
			return nil
		},
	}
	cmd.Flags().StringVar(&data, "data", "", "the authority's data directory (env MUSTER_DATA; default ./muster-data)")
	cmd.Flags().StringVar(&storeURL, "store", "", "the authority's store URL (env MUSTER_STORE; default: "+storeDefaultHelp+")")
	cmd.Flags().StringVar(&configFile, "config", "", configHelp(""))
	cmd.Flags().StringVar(&path, "out", "", "the file to write the root key to (0600; never overwritten)")
	out.register(cmd)
	return cmd
}

// exportRootKey writes the key of the root a finished root rotation made
// to path and clears it from the store's rotation record, conditional on
// the record's version: of two exports (or an export and a rotation step)
// one wins; the loser removes its file. It returns the root's
// fingerprint. Every outcome past opening the store is audited.
func exportRootKey(ctx context.Context, od offlineDir, storeURL, path string) (_ string, err error) {
	if _, err := os.Lstat(path); err == nil {
		return "", fmt.Errorf("%s already exists; give another --out", path)
	}
	dir := od.dir
	st, d, err := openOfflineStore(ctx, od, storeURL)
	if err != nil {
		return "", err
	}
	defer st.Close()
	logger, err := newAuditLogger(st, d.sk, dir, od.configPath, nil)
	if err != nil {
		return "", err
	}
	if err := logger.CheckHead(ctx); err != nil {
		return "", err
	}
	target := "root"
	recorded := false
	// A failure no refusal below names (a file that cannot be written, the
	// store failing) is audited too, as an error.
	defer func() {
		if err != nil && !recorded {
			err = recordFailure(ctx, logger, audit.Event{Actor: exportKeyActor, Action: "ca.root_export_key",
				Target: target, Result: audit.ResultError, Reason: err.Error()}, err)
		}
	}()
	record := func(err error, why string) error {
		recorded = true
		e := audit.Event{Actor: exportKeyActor, Action: "ca.root_export_key", Target: target, Result: audit.ResultOK, Reason: why}
		if err != nil {
			e.Result, e.Reason = audit.ResultDenied, err.Error()
		}
		if _, aerr := logger.Record(context.WithoutCancel(ctx), e); aerr != nil && err == nil {
			return fmt.Errorf("the key is in %s and gone from the store, but its audit record could not be written: %w", path, aerr)
		}
		return err
	}
	rot, err := st.GetRootRotation(ctx)
	if err != nil {
		return "", fmt.Errorf("reading the root rotation from the store: %w", err)
	}
	if rot.Phase != store.RootPhaseStandby || rot.NewCertDER == nil {
		return "", record(fmt.Errorf("no finished root rotation (phase %s): the root muster init made is in DIR/ca/root.key, take that file offline instead; a rotation's new root can be exported once it is in standby (muster ca root next-phase)", rot.Phase), "")
	}
	root, err := x509.ParseCertificate(rot.NewCertDER)
	if err != nil {
		return "", fmt.Errorf("the store's new root: %w", err)
	}
	fp := ca.Fingerprint(root)
	target = fp
	switch {
	case rot.NewKeyRef == nil:
		return "", record(errors.New("the authority no longer holds the key of the root "+fp+": it was exported before (muster audit list --action ca.root_export_key)"), "")
	case custody.IsPKCS11Ref(rot.NewKeyRef):
		return "", record(errors.New("the key of the root "+fp+" is in a PKCS#11 token and cannot be exported (generated never extractable)"), "")
	}
	c, err := custody.NewSealedCA(d.sk)
	if err != nil {
		return "", err
	}
	key, err := c.Signer(ctx, "root/"+root.SerialNumber.Text(16), custody.Key{Public: root.PublicKey, Ref: rot.NewKeyRef})
	if err != nil {
		return "", record(fmt.Errorf("the sealed key of the root %s does not open with the storage key of %s: %w", fp, dir, err), "")
	}
	pemKey, err := ca.EncodeKeyPEM(key)
	if err != nil {
		return "", err
	}
	defer clear(pemKey)
	if err := atomicfile.Create(path, pemKey, 0o600); err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	if err := atomicfile.SyncDir(filepath.Dir(path)); err != nil {
		return "", fmt.Errorf("syncing the directory of %s: %w", path, err)
	}
	next := rot
	next.NewKeyRef = nil
	// The key leaves the store with its record, or not at all.
	link, err := logger.Builder(audit.Event{Actor: exportKeyActor, Action: "ca.root_export_key", Target: target, Result: audit.ResultOK,
		Reason: "the root key written to " + path + " and removed from the authority's custody (offline root)"})
	if err != nil {
		return "", err
	}
	if err := st.PutRootRotation(ctx, rot, next, false, link.Build); err != nil {
		if errors.Is(err, store.ErrConflict) {
			os.Remove(path)
			return "", record(errors.New("the root rotation changed meanwhile (another export or a rotation step): run muster ca root status and try again"), "")
		}
		return "", fmt.Errorf("the key is in %s, but removing it from the store failed (it may still be held there; run the command again with another --out to find out): %w", path, err)
	}
	logger.Appended(link)
	recorded = true
	return fp, nil
}

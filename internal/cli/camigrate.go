package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/authority"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/store"
)

// migrateActor is the audit actor of muster ca migrate-custody: no
// operator certificate vouches for it, the storage key does.
const migrateActor = "muster ca migrate-custody"

// newCAMigrateCustodyCmd is muster ca migrate-custody (docs/hsm.md,
// "Moving an existing authority into an HSM").
func newCAMigrateCustodyCmd(env *Env) *cobra.Command {
	var (
		data, storeURL, configFile string
		uri, module, pinFile       string
		interTTL                   string
		effectiveIn, grace         time.Duration
		rollback                   bool
		out                        output
	)
	cmd := &cobra.Command{
		Use: "migrate-custody",
		Example: `  muster-pkcs11 ca migrate-custody --data /var/lib/muster/authority \
    --custody 'pkcs11:token=muster' --pkcs11-module /usr/lib/softhsm/libsofthsm2.so \
    --pkcs11-pin-file /etc/muster/pkcs11-pin
  muster-pkcs11 ca migrate-custody --data /var/lib/muster --config /etc/muster/authority.yaml \
    --custody 'pkcs11:token=muster' --pkcs11-module /usr/lib/softhsm/libsofthsm2.so \
    --pkcs11-pin-file /etc/muster/pkcs11-pin   # the packaged unit's settings file`,
		Short: "Move an authority's keys (sealed) into a PKCS#11 token",
		Long: `migrate-custody moves an authority made with the default sealed custody into a
PKCS#11 token, on the machine that holds its data directory (the storage key),
with the pkcs11 build (muster-pkcs11). A token makes its keys inside and takes
none from outside, so new keys are made in it through the rotation machinery:

  - the token is tested (a key made, used and destroyed); nothing changes if
    that fails;
  - the token (URI and module, never the PIN) is recorded in the store and in
    DIR/authority.json: from then on every replica needs the pkcs11 build and
    --pkcs11-module to start;
  - each intermediate role gets a successor prepared with its key in the token
    (published at once; activated by the leader at its normal time, or by
    muster ca rotate ROLE --activate);
  - a task signer is staged with its key in the token (muster signer activate);
  - the join-state key is made in the token by the first bound-keypair join
    after the restart.

With --rollback (the token lost or wrong, before any key in it is activated)
it discards what the migration made in the token and removes the token's
record, without opening it; the sealed keys sign on.

The root key stays where it is: muster ca root rotate makes the new root in the
token. Run it again at any time: it does what is left and says what is done.

It opens the store the authority uses: --store, else store: in the settings
file the authority is started with (--config FILE, read as muster authority
--config FILE reads it; default DIR/authority.yaml), else the one
DIR/authority.json records.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			od, err := loadOfflineDir(env, data, configFile)
			if err != nil {
				return fmt.Errorf("ca migrate-custody: %w", err)
			}
			cfg := od.cfg
			storeURL = od.storeURL(env, storeURL)
			ttlText := firstOf(interTTL, cfg.CA.IntermediateTTL)
			ttl := ca.IntermediateTTL
			if ttlText != "" {
				if ttl, err = parseCAIntermediateTTL(ttlText); err != nil {
					return fmt.Errorf("ca migrate-custody: %w", err)
				}
			}
			minLead, err := signerMinLeadTime(cfg.Signer.MinLeadTime)
			if err != nil {
				return fmt.Errorf("ca migrate-custody: %w", err)
			}
			// Before anything is written: the signer is staged last.
			if !rollback && grace < signer.MinGrace {
				return fmt.Errorf("ca migrate-custody: --signer-grace %s: %s", grace, signer.GraceTooShort(grace, "--signer-grace 24h"))
			}
			if rollback && (module != "" || pinFile != "") {
				return fmt.Errorf("ca migrate-custody: --rollback opens no token (it may be lost): drop --pkcs11-module and --pkcs11-pin-file")
			}
			if !rollback {
				// MUSTER_PKCS11_MODULE and MUSTER_PKCS11_PIN_FILE, as
				// the authority reads them; a rollback, which opens no
				// token, leaves them be (the unit's environment may
				// hold them).
				ta := readTokenAccess(env, module, pinFile)
				module, pinFile = ta.module, ta.pinFile
			}
			ttlFlag := ""
			if interTTL != "" {
				ttlFlag = "--ca-intermediate-ttl"
			}
			shared := []offlineShared{{authority.SettingCAIntermediateTTL, ttl, ttlText != "", ttlFlag},
				{authority.SettingSignerMinLeadTime, cmp.Or(minLead, signer.DefaultMinLeadTime), minLead != 0, ""}}
			res, infoNamedToken, err := migrateCustody(cmd, od, storeURL, uri, module, pinFile, rollback, shared, authority.CustodyMigration{
				SignerEffectiveIn: effectiveIn, SignerGrace: grace,
			})
			if err != nil {
				return fmt.Errorf("ca migrate-custody: %w", err)
			}
			if out.json() {
				return out.write(env.Stdout, res)
			}
			if rollback {
				printRollback(env.Stdout, res, infoNamedToken)
				return nil
			}
			printMigration(env.Stdout, res, string(od.dir), od.configPath)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&data, "data", "", "authority data directory (env MUSTER_DATA, default ./muster-data)")
	f.StringVar(&storeURL, "store", "", "the authority's store URL (env MUSTER_STORE; default: "+storeDefaultHelp+")")
	f.StringVar(&configFile, "config", "", configHelp(""))
	f.StringVar(&uri, "custody", "", "the token's RFC 7512 URI, pkcs11:token=LABEL (no PIN in it)")
	f.StringVar(&module, "pkcs11-module", "", "the token's PKCS#11 library, e.g. /usr/lib/softhsm/libsofthsm2.so (env MUSTER_PKCS11_MODULE)")
	f.StringVar(&pinFile, "pkcs11-pin-file", "", "the file holding the token's user PIN, mode 0600 (env MUSTER_PKCS11_PIN_FILE; default: env MUSTER_PKCS11_PIN)")
	f.StringVar(&interTTL, "ca-intermediate-ttl", "", "lifetime of the successors prepared in the token (default: ca.intermediate_ttl in DIR/authority.yaml, else 1 year)")
	f.DurationVar(&effectiveIn, "signer-effective-in", time.Hour, "when the staged signer activates by itself (at least signer.min_lead_time)")
	f.DurationVar(&grace, "signer-grace", 24*time.Hour, "how long the signer it replaces is still accepted after that (at least 1s)")
	f.BoolVar(&rollback, "rollback", false, "undo a migration to the --custody token (lost, or the wrong one) while none of its keys is in use yet: the successors and signer made in it are discarded and the store forgets it")
	out.register(cmd)
	_ = cmd.MarkFlagRequired("custody")
	return cmd
}

// migrateCustody opens what the migration needs and runs it: the data
// directory, the store, the token; m carries the settings. The bool
// says a rollback removed the token from authority.json.
func migrateCustody(cmd *cobra.Command, od offlineDir, storeURL, uri, module, pinFile string, rollback bool, shared []offlineShared, m authority.CustodyMigration) (authority.CustodyMigrationResult, bool, error) {
	ctx := cmd.Context()
	dir := od.dir
	st, d, err := openOfflineStore(ctx, od, storeURL)
	if err != nil {
		return authority.CustodyMigrationResult{}, false, err
	}
	defer st.Close()
	logger, err := newAuditLogger(st, d.sk, dir, od.configPath, nil)
	if err != nil {
		return authority.CustodyMigrationResult{}, false, err
	}
	if err := logger.CheckHead(ctx); err != nil {
		return authority.CustodyMigrationResult{}, false, err
	}
	// The shared settings are the store's, as the authority would use.
	if m.IntermediateTTL, err = shared[0].fromStore(ctx, st, od.configPath, string(dir)); err != nil {
		return authority.CustodyMigrationResult{}, false, err
	}
	if m.SignerMinLead, err = shared[1].fromStore(ctx, st, od.configPath, string(dir)); err != nil {
		return authority.CustodyMigrationResult{}, false, err
	}
	m.Store, m.CA, m.StorageKey, m.Audit = st, d.ca, d.sk, logger
	m.URI, m.AuthorityID, m.Actor, m.DataDir = uri, d.info.AuthorityID, migrateActor, string(dir)
	// The URI, module and PIN file are checked, and the token opened, as
	// muster init does it; a refusal is audited like the migration.
	// The audit record names the token as parsed: a URI refused for
	// carrying a PIN (pin-value) must not put it in the log.
	target := "a pkcs11 URI that does not parse"
	if u, err := custody.ParsePKCS11URI(uri); err == nil {
		target = u.String()
	}
	refuse := func(err error) (authority.CustodyMigrationResult, bool, error) {
		return authority.CustodyMigrationResult{}, false, recordFailure(ctx, logger, audit.Event{Actor: migrateActor, Action: "ca.migrate_custody",
			Target: target, Result: audit.ResultError, Reason: "nothing changed: " + err.Error()}, err)
	}
	if uri == "" || uri == "sealed" {
		return refuse(fmt.Errorf("--custody pkcs11:token=LABEL names the token to move the keys into"))
	}
	if rollback {
		// The token is not opened: it may be lost.
		u, err := custody.ParsePKCS11URI(uri)
		if err != nil {
			return refuse(err)
		}
		u.ModulePath, u.PINSource = "", ""
		m.URI = u.String()
		res, err := authority.RollbackCustodyMigration(ctx, m)
		if err != nil {
			return res, false, err
		}
		if d.info.Custody != nil && d.info.Custody.URI == m.URI {
			info := d.info
			info.Custody = nil
			if err := dir.WriteInfo(info); err != nil {
				return res, false, fmt.Errorf("rolled back in the store, but %s still names the token (remove its custody): %w", dir.InfoFile(), err)
			}
			return res, true, nil
		}
		return res, false, nil
	}
	// The token the authority is bound to is checked before this one is
	// opened: logging in to a token the migration refuses anyway spends
	// one of its PIN tries (an HSM locks the PIN after a few wrong ones)
	// and makes test keys in it.
	if u, err := custody.ParsePKCS11URI(uri); err == nil {
		u.ModulePath, u.PINSource = "", ""
		if err := boundToken(ctx, st, od, d.info.Custody, u.String()); err != nil {
			return refuse(err)
		}
	}
	var o datadir.InitOptions
	token, err := initCustody(&o, uri, module, pinFile)
	if err != nil {
		return refuse(err)
	}
	defer token.Close()
	rec := o.Custody
	m.Token, m.URI, m.Module = token, rec.URI, rec.Module
	res, err := authority.MigrateCustody(ctx, m)
	if err != nil {
		return res, false, err
	}
	// authority.json after the store: the store's record is what every
	// replica obeys; this directory's copy lets its authority start
	// without repeating the flags.
	if d.info.Custody == nil || *d.info.Custody != *rec {
		info := d.info
		info.Custody = rec
		if err := dir.WriteInfo(info); err != nil {
			return res, false, fmt.Errorf("the store records the token, but %s could not be written (start the authority with --pkcs11-module): %w", dir.InfoFile(), err)
		}
	}
	return res, false, nil
}

// boundToken refuses a migration into uri when the store or
// authority.json already binds the authority's keys to another token, with
// the way out.
func boundToken(ctx context.Context, st custodyRecords, od offlineDir, local *datadir.Custody, uri string) error {
	dir := od.dir
	rec, err := st.GetKeyCustody(ctx)
	switch {
	case err == nil && rec.URI != uri:
		return fmt.Errorf("the store records that this authority's keys were moved into the PKCS#11 token %s, not %s (the keys go into one token); "+
			"nothing changed, no token was opened: run it again with --custody '%s', or, while none of that token's keys is in use, undo that migration first: "+
			"`muster ca migrate-custody --data %s%s --custody '%s' --rollback` (docs/hsm.md)", rec.URI, uri, rec.URI, od.quoted(), od.configArg(), rec.URI)
	case err != nil && !errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("reading the key custody the store records: %w", err)
	}
	if local != nil && local.URI != uri {
		return fmt.Errorf("%s records the token %s, not %s; nothing changed, no token was opened: run it again with --custody '%s' (docs/hsm.md)",
			dir.InfoFile(), local.URI, uri, local.URI)
	}
	return nil
}

// printMigration prints what the migration did and the steps left, each
// a command that works pasted: with this run's data directory (dir, as
// --data named it) and with the root step that fits the root rotation's
// phase (none may start while one is under way). The commands that read
// the authority's settings name configPath, the settings file read, with
// --config where it is not dir's authority.yaml.
func printMigration(w io.Writer, res authority.CustodyMigrationResult, dir, configPath string) {
	if res.AlreadyRecorded {
		fmt.Fprintf(w, "Token %s was already recorded in the store (an earlier run).\n", res.URI)
	} else {
		fmt.Fprintf(w, "Token %s recorded in the store and in authority.json (module %s).\n", res.URI, res.Module)
	}
	for _, s := range res.Steps {
		id := s.Serial + s.Version
		if id != "" {
			id = " " + id
		}
		fmt.Fprintf(w, "  %-14s %s%s", s.Key, s.Done, id)
		if s.Where != "" {
			fmt.Fprintf(w, " (%s)", s.Where)
		}
		fmt.Fprintf(w, ": %s\n", s.Next)
	}
	d := shellword.Quote(dir)
	c := datadir.Dir(dir).ConfigArg(configPath)
	// A signer step skipped (a sealed signer was staged already) leaves
	// that sealed signer staged: "activate the staged signer" would
	// activate it and keep the signer out of the token.
	signerStep := fmt.Sprintf(`  3. Activate the staged signer (or let it activate at its time):
       muster signer activate --data %s
`, d)
	skipped := false
	for _, s := range res.Steps {
		if s.Done != "skipped" {
			continue
		}
		skipped = true
		if s.Key == "signer" {
			signerStep = fmt.Sprintf(`  3. The staged signer is sealed (skipped above): activate it
       muster signer activate --data %s
     or roll it back
       muster signer rollback --data %s
     then run this command again: it stages a signer in the token.
`, d, d)
		}
	}
	if skipped {
		fmt.Fprintln(w, "A key marked skipped is not in the token yet: do what its line says, then run this command again.")
	}
	fmt.Fprintf(w, `Next:
  1. Restart every replica with the pkcs11 build and the token (this
     data directory's authority.json names it; another replica's needs
     --pkcs11-module %s --pkcs11-pin-file FILE):
       muster-pkcs11 authority --data %s%s
     (a replica started without them refuses to start; one still running
     without them reports not ready until restarted).
  2. Once the successors are published, activate them (or let the leader):
       for role in bootstrap server agent admin; do muster ca rotate $role --activate --data %s; done
%s  4. Should the token be lost or wrong before any key in it is activated,
     undo the migration (the token is not opened; the sealed keys sign on):
       muster ca migrate-custody --data %s%s --custody '%s' --rollback

`, shellword.Quote(res.Module), d, c, d, signerStep, d, c, res.URI)
	fmt.Fprint(w, rootStep(res, d))
	fmt.Fprintf(w, "The sealed keys are destroyed as rotation retires them; docs/hsm.md.\n")
}

// rootStep says what moves the root key into the token: a new root
// rotation when none is under way, else finishing the one that is (its
// new root's key is where that rotation made it; a rotation cannot start
// before the one under way reaches standby).
func rootStep(res authority.CustodyMigrationResult, d string) string {
	inToken := strings.HasPrefix(res.RootKey, "pkcs11:")
	switch {
	case res.RootRotation == "":
		return fmt.Sprintf(`The root key stays where it is; to move it into the token too:
       muster ca root rotate --data %s    # its new root is made in the token
`, d)
	case res.RootRotation == store.RootPhaseStandby && inToken:
		return "The root key is in the token already (the last root rotation made it there).\n"
	case res.RootRotation == store.RootPhaseStandby:
		return fmt.Sprintf(`The root key (%s, from the last root rotation) stays where it is; to move it into the token too:
       muster ca root rotate --data %s    # its new root is made in the token
`, res.RootKey, d)
	case inToken:
		return fmt.Sprintf(`A root rotation is under way (phase %s); its new root's key is in the token already.
Finish it, phase by phase (docs/ca-lifecycle.md):
       muster ca root next-phase --data %s
`, res.RootRotation, d)
	}
	return fmt.Sprintf(`A root rotation is under way (phase %s) and its new root's key is %s, not in the token.
No other can start before it reaches standby: finish it phase by phase
(docs/ca-lifecycle.md), then make a root in the token:
       muster ca root next-phase --data %s    # until standby
       muster ca root rotate --data %s        # its new root is made in the token
`, res.RootRotation, res.RootKey, d, d)
}

func printRollback(w io.Writer, res authority.CustodyMigrationResult, forgot bool) {
	if !res.AlreadyRecorded {
		fmt.Fprintf(w, "The store records no token: nothing to roll back.\n")
		if forgot {
			// A store restored from before the migration under an
			// authority.json from after it (docs/hsm.md).
			fmt.Fprintf(w, "Token %s removed from authority.json, which named it (the store holds no key in it); the authority starts sealed, without --pkcs11-module.\n", res.URI)
		}
		return
	}
	fmt.Fprintf(w, "Token %s removed from the store and authority.json; the sealed keys sign on.\n", res.URI)
	for _, s := range res.Steps {
		fmt.Fprintf(w, "  %-14s %s %s%s (%s): %s\n", s.Key, s.Done, s.Serial, s.Version, s.Where, s.Next)
	}
	fmt.Fprintf(w, "Restart every replica as before (muster authority, without --pkcs11-module).\n")
}

package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/muster-dev/muster/internal/authority"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/store"
)

// tokenAccess is the PKCS#11 module and PIN file a command opens the
// authority's token with in place of the ones recorded (authority.json,
// the store's record); "" keeps the recorded one.
type tokenAccess struct{ module, pinFile string }

// readTokenAccess is how every command that opens the authority's token
// reads its module and PIN file: the flags (--pkcs11-module,
// --pkcs11-pin-file) where given, else MUSTER_PKCS11_MODULE and
// MUSTER_PKCS11_PIN_FILE, the variables muster authority reads (its
// unit's authority.env): an offline command run with that environment
// opens the token the authority opens, as it does the store.
func readTokenAccess(env *Env, module, pinFile string) tokenAccess {
	return tokenAccess{
		module:  firstOf(module, env.Getenv(EnvName("pkcs11-module"))),
		pinFile: firstOf(pinFile, env.Getenv(EnvName("pkcs11-pin-file"))),
	}
}

// openToken opens the PKCS#11 token an authority's keys are generated in
// (authority.json custody), the module and PIN file given on the command
// line taking the place of the recorded ones. It returns nil for an
// authority with sealed custody.
func openToken(c *datadir.Custody, module, pinFile string) (*custody.Token, error) {
	if c == nil {
		if module != "" || pinFile != "" {
			return nil, fmt.Errorf("--pkcs11-module and --pkcs11-pin-file (MUSTER_PKCS11_MODULE, MUSTER_PKCS11_PIN_FILE) apply to an authority initialised with --custody pkcs11:…; this one keeps its keys sealed in the store")
		}
		return nil, nil
	}
	cfg := custody.PKCS11Config{URI: c.URI, Module: c.Module, PINFile: c.PINFile}
	if module != "" {
		cfg.Module = module
	}
	if pinFile != "" {
		cfg.PINFile = pinFile
	}
	return custody.OpenPKCS11(cfg)
}

// initCustody is what muster init needs for --custody: the token opened,
// what authority.json records, and how keys are made.
func initCustody(o *datadir.InitOptions, uri, module, pinFile string) (*custody.Token, error) {
	if uri == "" || uri == "sealed" {
		if module != "" || pinFile != "" {
			// They may come from the environment (readTokenAccess), which
			// the operator did not type: name it, and how to clear it.
			return nil, fmt.Errorf("--pkcs11-module and --pkcs11-pin-file (or MUSTER_PKCS11_MODULE and MUSTER_PKCS11_PIN_FILE in the environment) need --custody pkcs11:…; for keys sealed in the store give neither: unset MUSTER_PKCS11_MODULE MUSTER_PKCS11_PIN_FILE")
		}
		return nil, nil
	}
	u, err := custody.ParsePKCS11URI(uri)
	if err != nil {
		return nil, err
	}
	if module == "" {
		module = u.ModulePath
	}
	if module == "" {
		return nil, fmt.Errorf("--custody %s needs --pkcs11-module PATH (the token's PKCS#11 library)", uri)
	}
	if pinFile == "" {
		pinFile = u.PINSource
	}
	// authority.json keeps the token's name, not the module or PIN
	// source, which are recorded beside it.
	u.ModulePath, u.PINSource = "", ""
	rec := &datadir.Custody{URI: u.String(), Module: module, PINFile: pinFile}
	t, err := openToken(rec, "", "")
	if err != nil {
		return nil, err
	}
	o.Token, o.Custody = t, rec
	o.CACustody = authority.CACustody
	o.SignerCustody = func(sk seal.StorageKey, t *custody.Token) (signer.Custody, error) {
		return authority.SignerCustody(sk, t)
	}
	return t, nil
}

// custodyRecords is what storeCustody reads from the store: the token it
// records and the keys in use.
type custodyRecords interface {
	GetKeyCustody(ctx context.Context) (store.KeyCustody, error)
	ListCACerts(ctx context.Context) ([]store.CACert, error)
	ListSigners(ctx context.Context) ([]store.Signer, store.SignerSetID, error)
}

// storeCustody is the token the authority in dir must open: the one the
// store records (muster ca migrate-custody: every replica obeys it,
// whatever its own authority.json says), else the one authority.json
// records (muster init --custody), else none. A replica whose
// authority.json does not name the store's token starts only when given
// its module (--pkcs11-module), so that none runs on without the keys it
// must sign with. An authority.json that names a token the store does not
// record, while the store signs with sealed keys, is the two halves of a
// migration out of step (docs/hsm.md "Restoring across a migration"): a
// store restored from before muster ca migrate-custody, or one rolled back
// from another data directory. The authority does not start then: opening
// the token would make its next keys there while the store records
// nothing of it (so replicas would start without it), and the operator
// would not learn that the migration is undone. The refusal names the two
// ways out, run from dir.
// tokenWayOut adds to a failure to open the token which module and PIN
// source were used (never the PIN) and how to start once it is fixed.
func tokenWayOut(err error, dir datadir.Dir, c *datadir.Custody, module, pinFile string) error {
	if module == "" {
		module = c.Module
	}
	if pinFile == "" {
		pinFile = c.PINFile
	}
	pin := "the PIN file " + pinFile
	switch {
	case pinFile == "" && strings.Contains(c.URI, "pin-source="):
		pin = "the PIN file the URI's pin-source names"
	case pinFile == "":
		pin = "the PIN from " + custody.PINEnv
	}
	return fmt.Errorf("%w (token %s, module %s, %s): once that is fixed, start it again: `muster-pkcs11 authority --data %s`, "+
		"with --pkcs11-module PATH and --pkcs11-pin-file FILE where this machine's module or PIN file are not the ones %s records (docs/hsm.md)",
		err, c.URI, module, pin, shellword.Quote(string(dir)), dir.InfoFile())
}

func storeCustody(ctx context.Context, st custodyRecords, od offlineDir, local *datadir.Custody, module string) (*datadir.Custody, error) {
	dir := od.dir
	rec, err := st.GetKeyCustody(ctx)
	if errors.Is(err, store.ErrNotFound) {
		if local == nil {
			return nil, nil
		}
		sealed, err := sealedKeyInUse(ctx, st)
		if err != nil {
			return nil, err
		}
		if sealed != "" {
			return nil, fmt.Errorf("%w: %s names the PKCS#11 token %s, but the store records no token and signs with sealed keys (%s): "+
				"it is from before muster ca migrate-custody (restored from a backup), or the migration was rolled back from another data directory; nothing was opened. "+
				"To move into the token again, run `muster-pkcs11 ca migrate-custody --data %s%s --custody '%s' --pkcs11-module %s --pkcs11-pin-file FILE` "+
				"(new keys are made in the token; the objects an earlier run made there are left: list them with `%s` and delete each that no muster ca status or muster signer list row names, as docs/hsm.md \"Restoring across a migration\" says); "+
				"to stay sealed, run `muster ca migrate-custody --data %s%s --custody '%s' --rollback` (it removes the token from authority.json) (docs/hsm.md)",
				errCustodyOutOfStep, dir.InfoFile(), local.URI, sealed, od.quoted(), od.configArg(), local.URI, shellword.Quote(local.Module),
				custody.ListCommand(local.Module, local.URI), od.quoted(), od.configArg(), local.URI)
		}
		return local, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the key custody the store records: %w", err)
	}
	recorded := fmt.Sprintf("the store records that this authority's keys are in the PKCS#11 token %s (muster ca migrate-custody, %s)",
		rec.URI, rec.RecordedAt.UTC().Format(time.RFC3339))
	// The way to make this directory's authority.json name the token
	// again (one restored from before the migration, a replica's own
	// copy): the migration run again finds its steps done.
	record := fmt.Sprintf("or record the token in %s: `muster-pkcs11 ca migrate-custody --data %s%s --custody '%s' --pkcs11-module PATH --pkcs11-pin-file FILE` (it finds the migration done) (docs/hsm.md)",
		dir.InfoFile(), od.quoted(), od.configArg(), rec.URI)
	switch {
	case local != nil && local.URI == rec.URI:
		return local, nil
	case local != nil:
		return nil, fmt.Errorf("%w: %s, but %s names %s: correct custody.pkcs11_uri in authority.json, or start with the data directory of this store",
			errCustodyOutOfStep, recorded, dir.InfoFile(), local.URI)
	case !custody.PKCS11Build:
		return nil, fmt.Errorf("%s: start it with the pkcs11 build of muster (muster-pkcs11; PKCS11=1 scripts/build-binary) and --pkcs11-module PATH (%s where it was recorded) and --pkcs11-pin-file FILE or MUSTER_PKCS11_PIN, %s",
			recorded, rec.Module, record)
	case module == "":
		return nil, fmt.Errorf("%s: start it with --pkcs11-module PATH (%s where it was recorded) and --pkcs11-pin-file FILE or MUSTER_PKCS11_PIN, %s",
			recorded, rec.Module, record)
	}
	return &datadir.Custody{URI: rec.URI, Module: module}, nil
}

// errCustodyOutOfStep: authority.json and the store disagree on the token.
var errCustodyOutOfStep = errors.New("the key custody of authority.json and of the store are out of step")

// sealedKeyInUse names a key the store signs with that is sealed (not a
// token object): an active intermediate or the active task signer; "" when
// there is none.
func sealedKeyInUse(ctx context.Context, st custodyRecords) (string, error) {
	rows, err := st.ListCACerts(ctx)
	if err != nil {
		return "", fmt.Errorf("reading the store's intermediates: %w", err)
	}
	for _, r := range rows {
		if r.State == store.CAActive && !custody.IsPKCS11Ref(r.KeyRef) {
			return "the active " + r.Role + " intermediate " + r.Serial, nil
		}
	}
	signers, _, err := st.ListSigners(ctx)
	if err != nil {
		return "", fmt.Errorf("reading the store's task signers: %w", err)
	}
	for _, s := range signers {
		if s.State == store.SignerActive && !custody.IsPKCS11Ref(s.KeyRef) {
			return "the active task signer " + s.VersionID, nil
		}
	}
	return "", nil
}

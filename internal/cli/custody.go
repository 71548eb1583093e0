package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/authority"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/store"
)

// openToken opens the PKCS#11 token an authority's keys are generated in
// (authority.json custody), the module and PIN file given on the command
// line taking the place of the recorded ones. It returns nil for an
// authority with sealed custody.
func openToken(c *datadir.Custody, module, pinFile string) (*custody.Token, error) {
	if c == nil {
		if module != "" || pinFile != "" {
			return nil, fmt.Errorf("--pkcs11-module and --pkcs11-pin-file apply to an authority initialised with --custody pkcs11:…; this one keeps its keys sealed in the store")
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
			return nil, fmt.Errorf("--pkcs11-module and --pkcs11-pin-file need --custody pkcs11:…")
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

// storeCustody is the token the authority must open: the one the store
// records (muster ca migrate-custody: every replica obeys it, whatever
// its own authority.json says), else the one authority.json records
// (muster init --custody), else none. A replica whose authority.json does
// not name the store's token starts only when given its module
// (--pkcs11-module), so that none runs on without the keys it must sign
// with.
func storeCustody(ctx context.Context, st store.CustodyStore, local *datadir.Custody, module string) (*datadir.Custody, error) {
	rec, err := st.GetKeyCustody(ctx)
	if errors.Is(err, store.ErrNotFound) {
		return local, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the key custody the store records: %w", err)
	}
	switch {
	case local != nil && local.URI == rec.URI:
		return local, nil
	case local != nil:
		return nil, fmt.Errorf("the store records that this authority's keys are in the PKCS#11 token %s (muster ca migrate-custody, %s), but authority.json names %s: correct custody.pkcs11_uri in authority.json, or start with the data directory of this store",
			rec.URI, rec.RecordedAt.UTC().Format(time.RFC3339), local.URI)
	case !custody.PKCS11Build:
		return nil, fmt.Errorf("the store records that this authority's keys are in the PKCS#11 token %s (muster ca migrate-custody, %s): start it with the pkcs11 build of muster (muster-pkcs11; PKCS11=1 scripts/build-binary) and --pkcs11-module PATH (%s where it was recorded) and --pkcs11-pin-file FILE or MUSTER_PKCS11_PIN (docs/hsm.md)",
			rec.URI, rec.RecordedAt.UTC().Format(time.RFC3339), rec.Module)
	case module == "":
		return nil, fmt.Errorf("the store records that this authority's keys are in the PKCS#11 token %s (muster ca migrate-custody, %s): start it with --pkcs11-module PATH (%s where it was recorded) and --pkcs11-pin-file FILE or MUSTER_PKCS11_PIN (docs/hsm.md)",
			rec.URI, rec.RecordedAt.UTC().Format(time.RFC3339), rec.Module)
	}
	return &datadir.Custody{URI: rec.URI, Module: module}, nil
}

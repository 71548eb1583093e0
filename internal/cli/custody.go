package cli

import (
	"fmt"

	"github.com/muster-dev/muster/internal/authority"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/signer"
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

//go:build !(pkcs11 && cgo)

package custody

import (
	"context"
	"crypto"
)

// PKCS11Build reports whether this binary can open a PKCS#11 token: this
// one (the static default build) cannot.
const PKCS11Build = false

// Token stands for an open PKCS#11 token; this build has none.
type Token struct{}

// OpenPKCS11 fails: PKCS#11 modules are loaded with dlopen, which needs
// the cgo build (docs/hsm.md).
func OpenPKCS11(PKCS11Config) (*Token, error) { return nil, ErrNoPKCS11Build }

// Ready is never nil: there is no token.
func (*Token) Ready() error { return ErrNoPKCS11Build }

// Module is empty: there is no token.
func (*Token) Module() string { return "" }

// NameDataDir does nothing: there is no token.
func (*Token) NameDataDir(string) {}

// Close does nothing.
func (*Token) Close() error { return nil }

// For returns a custody that refuses everything.
func (*Token) For(string) *PKCS11 { return &PKCS11{} }

// PKCS11 is custody in a PKCS#11 token; in this build every call fails.
type PKCS11 struct{}

var _ Custody = (*PKCS11)(nil)

// Create fails: no PKCS#11 in this build.
func (*PKCS11) Create(context.Context, string, Algorithm) (Key, error) {
	return Key{}, ErrNoPKCS11Build
}

// Signer fails: no PKCS#11 in this build.
func (*PKCS11) Signer(context.Context, string, Key) (crypto.Signer, error) {
	return nil, ErrNoPKCS11Build
}

// Destroy fails: no PKCS#11 in this build.
func (*PKCS11) Destroy(context.Context, string, Key) error { return ErrNoPKCS11Build }

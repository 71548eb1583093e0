// Package datadir is the authority's data directory: where each file lives,
// the authority.json that marks a directory as initialised, and Init, which
// creates the whole directory at once (`muster init`).
//
// Layout (directories 0700, key files 0600):
//
//	DIR/authority.json         authority ID, name, trust domain, root fingerprint
//	DIR/authority.yaml         optional configuration, written by the operator
//	DIR/storage.key            the 32-byte storage key every at-rest key derives from
//	DIR/ca/                    root and intermediate certificates and keys
//	DIR/operator.pem           the first operator identity
//	DIR/muster.db              the embedded SQLite store
//	DIR/authority.addr         the address the running authority advertises
//	DIR/audit-checkpoint.json  the latest signed audit checkpoint
//	DIR/audit-head             the newest audit record appended (seq and hash)
//	DIR/audit.lock             flock(2)ed around each write of the two audit files
//	DIR/authority.lock         flock(2)ed by the running authority (or store reapply); holds its pid and command
//	DIR/muster.db-authority.lock  flock(2)ed by the running authority on SQLite (beside the store's file)
package datadir

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/shellword"
)

// FormatVersion is the layout version Init writes into authority.json.
const FormatVersion = 1

// ErrNotInitialised reports a directory without authority.json.
var ErrNotInitialised = errors.New("datadir: not an initialised muster data directory")

// Dir is an authority data directory.
type Dir string

func (d Dir) path(name string) string { return filepath.Join(string(d), name) }

func (d Dir) InfoFile() string        { return d.path("authority.json") }
func (d Dir) ConfigFile() string      { return d.path("authority.yaml") }
func (d Dir) StorageKeyFile() string  { return d.path("storage.key") }
func (d Dir) CADir() string           { return d.path("ca") }
func (d Dir) OperatorFile() string    { return d.path("operator.pem") }
func (d Dir) DatabaseFile() string    { return d.path("muster.db") }
func (d Dir) AddressFile() string     { return d.path("authority.addr") }
func (d Dir) CheckpointFile() string  { return d.path("audit-checkpoint.json") }
func (d Dir) DefaultStoreURL() string { return "sqlite://" + d.DatabaseFile() }

// Info is authority.json.
type Info struct {
	FormatVersion int       `json:"format_version"`
	AuthorityID   string    `json:"authority_id"`
	Name          string    `json:"name"`
	TrustDomain   string    `json:"trust_domain"`
	CAFingerprint string    `json:"ca_fingerprint"`
	CreatedAt     time.Time `json:"created_at"`
	// Store is the external store muster init wrote to, its password
	// removed; "" for the embedded muster.db (and in data directories
	// made before it was recorded).
	Store string `json:"store,omitempty"`
	// Custody, if set, is the PKCS#11 token muster init generated the
	// keys in (docs/hsm.md); the authority opens it at start.
	Custody *Custody `json:"custody,omitempty"`
}

// Custody is where the authority's keys are generated: a PKCS#11 token.
type Custody struct {
	// URI is the token's RFC 7512 pkcs11: URI.
	URI string `json:"pkcs11_uri"`
	// Module is the PKCS#11 library.
	Module string `json:"pkcs11_module"`
	// PINFile, if set, holds the PIN (else MUSTER_PKCS11_PIN does).
	PINFile string `json:"pkcs11_pin_file,omitempty"`
}

// ReadInfo reads authority.json, telling a missing directory, a directory
// that was never initialised and a corrupt file apart.
func (d Dir) ReadInfo() (Info, error) {
	if _, err := os.Stat(string(d)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			// Most often a mistyped or forgotten --data of an existing
			// authority: muster init first would make another authority.
			return Info{}, fmt.Errorf("datadir: %s does not exist: give the authority's data directory with --data DIR (or MUSTER_DATA), or create an authority there with muster init --data %s", d, shellword.Quote(string(d)))
		}
		return Info{}, fmt.Errorf("datadir: %w", err)
	}
	data, err := os.ReadFile(d.InfoFile())
	if errors.Is(err, fs.ErrNotExist) {
		return Info{}, fmt.Errorf("%w: %s has no authority.json (run muster init --data %s)", ErrNotInitialised, d, shellword.Quote(string(d)))
	}
	if err != nil {
		return Info{}, fmt.Errorf("datadir: %w", err)
	}
	var info Info
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&info); err != nil {
		if field, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			// Not damage: a newer muster records more (as custody was
			// added), and this binary must not run on what it cannot read.
			return Info{}, fmt.Errorf("datadir: %s has the field %s, which this binary does not know: "+
				"a newer muster wrote it; run a muster of that version or later (`muster version` shows the layout a binary knows), "+
				"or restore the directory from the copy taken before the upgrade (docs/install.md, \"Upgrades\")", d.InfoFile(), field)
		}
		return Info{}, fmt.Errorf("datadir: %s is corrupt: %v", d.InfoFile(), err)
	}
	if info.FormatVersion > FormatVersion {
		return Info{}, fmt.Errorf("datadir: %s has layout version %d, newer than this binary knows (%d): "+
			"a newer muster wrote it; run a muster that knows data directory layout %d or later (`muster version` shows the layout a binary knows), "+
			"or restore the directory from the copy taken before the upgrade (docs/install.md, \"Upgrades\")",
			d, info.FormatVersion, FormatVersion, info.FormatVersion)
	}
	if info.AuthorityID == "" || info.TrustDomain == "" || info.CAFingerprint == "" {
		return Info{}, fmt.Errorf("datadir: %s is corrupt: missing fields", d.InfoFile())
	}
	return info, nil
}

// Address is authority.addr: where admin commands reach the authority.
type Address struct {
	Address     string `json:"address"`
	AuthorityID string `json:"authority_id"`
	PID         int    `json:"pid"`
}

// WriteAddress records the advertised address for admin commands.
func (d Dir) WriteAddress(a Address) error {
	data, err := json.MarshalIndent(a, "", "  ")
	if err != nil {
		return err
	}
	return identity.WriteFileAtomic(d.AddressFile(), append(data, '\n'), 0o600)
}

// ReadAddress reads authority.addr.
func (d Dir) ReadAddress() (Address, error) {
	data, err := os.ReadFile(d.AddressFile())
	if errors.Is(err, fs.ErrNotExist) {
		return Address{}, fmt.Errorf("datadir: no authority has recorded its address in %s: start muster authority --data %s, or pass --authority", d, shellword.Quote(string(d)))
	}
	if err != nil {
		return Address{}, fmt.Errorf("datadir: %w", err)
	}
	var a Address
	if err := json.Unmarshal(data, &a); err != nil || a.Address == "" {
		return Address{}, fmt.Errorf("datadir: %s is corrupt", d.AddressFile())
	}
	return a, nil
}

// WriteInfo replaces authority.json (muster ca migrate-custody records the
// token the keys moved into).
func (d Dir) WriteInfo(info Info) error { return writeJSON(d.InfoFile(), info) }

// ConfigArg is what an offline command (one that opens the store from
// the data directory) printed for an operator to paste adds after
// --data DIR: " --config FILE" where configPath, the settings file the
// authority was started with (muster authority --config FILE), is not
// DIR/authority.yaml, else nothing. The store URL may be only in that
// file, as under the packaged unit's /etc/muster/authority.yaml.
func (d Dir) ConfigArg(configPath string) string {
	if configPath == "" || filepath.Clean(configPath) == filepath.Clean(d.ConfigFile()) {
		return ""
	}
	return " --config " + shellword.Quote(configPath)
}

package discoveryd

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/muster-dev/muster/internal/atomicfile"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/oserr"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/shellword"
)

// Dir is a discovery data directory. Layout (directories 0700, key files
// 0600):
//
//	DIR/storage.key            the 32-byte key the ticket keys are sealed under
//	DIR/tls/ca.crt, ca.key     discovery's own CA: its fingerprint is the pin
//	DIR/discovery.db           the embedded SQLite store (unless --store)
//	DIR/discovery.addr         where the running discovery listens, its issuer and its store
//	DIR/discovery.yaml         settings (optional): the authorities allowed to register
//	DIR/audit-checkpoint.json  the latest signed audit checkpoint
type Dir string

func (d Dir) path(name ...string) string {
	return filepath.Join(append([]string{string(d)}, name...)...)
}

func (d Dir) StorageKeyFile() string  { return d.path("storage.key") }
func (d Dir) TLSDir() string          { return d.path("tls") }
func (d Dir) CACertFile() string      { return d.path("tls", "ca.crt") }
func (d Dir) CAKeyFile() string       { return d.path("tls", "ca.key") }
func (d Dir) DatabaseFile() string    { return d.path("discovery.db") }
func (d Dir) AddressFile() string     { return d.path("discovery.addr") }
func (d Dir) ConfigFile() string      { return d.path("discovery.yaml") }
func (d Dir) CheckpointFile() string  { return d.path("audit-checkpoint.json") }
func (d Dir) DefaultStoreURL() string { return "sqlite://" + d.DatabaseFile() }

// ErrNotInitialised reports a directory no discovery has started in.
var ErrNotInitialised = errors.New("discoveryd: not a discovery data directory")

// Lifetimes of discovery's TLS identity.
const (
	CATTL         = 10 * 365 * 24 * time.Hour
	ServerCertTTL = 365 * 24 * time.Hour
)

// caCommonName names discovery's CA.
const caCommonName = "muster discovery CA"

// Identity is what a discovery data directory holds: the storage key and
// the CA whose fingerprint authorities and agents pin.
type Identity struct {
	Dir        Dir
	StorageKey seal.StorageKey
	CA         *x509.Certificate
	CAKey      crypto.Signer
}

// Fingerprint is the pin of discovery's TLS identity ("sha256:…").
func (id *Identity) Fingerprint() string { return ca.Fingerprint(id.CA) }

// Init opens the discovery data directory dir, creating what it lacks
// first: the directory (0700), the storage key (random, 0600) and the CA
// (ECDSA P-256, self-signed, 10 years, key 0600). It never replaces what
// exists, and two processes initialising one directory at once end up with
// the same files. The store is not its business.
func Init(dir string) (*Identity, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	d := Dir(abs)
	if _, err := os.Stat(filepath.Join(abs, "authority.json")); err == nil {
		return nil, fmt.Errorf("discoveryd: %s holds an authority; give discovery a directory of its own", abs)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("discoveryd: cannot create %s: %w", abs, oserr.Reason(err))
	}
	if err := os.Chmod(abs, 0o700); err != nil {
		return nil, fmt.Errorf("discoveryd: %w", err)
	}
	if _, err := os.Stat(d.StorageKeyFile()); errors.Is(err, fs.ErrNotExist) {
		var k seal.StorageKey
		if _, err := rand.Read(k[:]); err != nil {
			return nil, err
		}
		// Exclusive: if another process wrote one meanwhile, theirs
		// stays and is read below.
		if err := k.WriteFile(d.StorageKeyFile()); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("discoveryd: writing %s: %w", d.StorageKeyFile(), oserr.Reason(err))
		}
	}
	if _, err := os.Stat(d.CACertFile()); errors.Is(err, fs.ErrNotExist) {
		if err := createCA(d, time.Now()); err != nil {
			return nil, err
		}
	}
	return Load(abs)
}

// createCA writes a new CA into a staging directory and renames it into
// place as DIR/tls, so a reader never sees a certificate without its key.
// Losing the rename to another process is not an error: its CA is used.
func createCA(d Dir, now time.Time) error {
	cert, key, err := newCA(now)
	if err != nil {
		return err
	}
	keyPEM, err := ca.EncodeKeyPEM(key)
	if err != nil {
		return err
	}
	staging, err := os.MkdirTemp(string(d), ".tls-*")
	if err != nil {
		return fmt.Errorf("discoveryd: %w", err)
	}
	defer os.RemoveAll(staging)
	if err := os.Chmod(staging, 0o700); err != nil {
		return err
	}
	if err := atomicfile.Create(filepath.Join(staging, "ca.key"), keyPEM, 0o600); err != nil {
		return err
	}
	if err := atomicfile.Create(filepath.Join(staging, "ca.crt"), ca.EncodeCertPEM(cert), 0o644); err != nil {
		return err
	}
	if err := os.Rename(staging, d.TLSDir()); err != nil {
		if _, serr := os.Stat(d.CACertFile()); serr == nil {
			return nil
		}
		return fmt.Errorf("discoveryd: cannot create %s: %w", d.TLSDir(), oserr.Reason(err))
	}
	return atomicfile.SyncDir(string(d))
}

// newCA makes discovery's self-signed CA. It signs only discovery's own
// server certificates, directly: no intermediate below it.
func newCA(now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial.Add(serial, big.NewInt(1)),
		Subject:               pkix.Name{Organization: []string{"muster"}, CommonName: caCommonName},
		NotBefore:             now.Add(-ca.Backdate),
		NotAfter:              now.Add(CATTL),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("discoveryd: creating the CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

// Load reads an initialised discovery data directory: the storage key and
// the CA with its key, refusing key files other users can read.
func Load(dir string) (*Identity, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	d := Dir(abs)
	cert, err := ReadCA(abs)
	if err != nil {
		return nil, err
	}
	sk, err := seal.LoadStorageKey(d.StorageKeyFile())
	if err != nil {
		return nil, fmt.Errorf("discoveryd: %w", err)
	}
	key, err := readKey(d.CAKeyFile())
	if err != nil {
		return nil, err
	}
	type equaler interface{ Equal(crypto.PublicKey) bool }
	if pub, ok := key.Public().(equaler); !ok || !pub.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("discoveryd: %s does not match %s", d.CAKeyFile(), d.CACertFile())
	}
	return &Identity{Dir: d, StorageKey: sk, CA: cert, CAKey: key}, nil
}

// ReadCA reads discovery's CA certificate alone: enough to print its
// fingerprint, without the keys.
func ReadCA(dir string) (*x509.Certificate, error) {
	d := Dir(dir)
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("%w: %s does not exist (muster discovery --data %s creates it)", ErrNotInitialised, dir, shellword.Quote(dir))
	}
	data, err := os.ReadFile(d.CACertFile())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s has no %s (muster discovery --data %s creates it)", ErrNotInitialised, dir, filepath.Join("tls", "ca.crt"), shellword.Quote(dir))
	}
	if err != nil {
		return nil, fmt.Errorf("discoveryd: %w", err)
	}
	certs, err := ca.ParseCertsPEM(data)
	if err != nil {
		return nil, fmt.Errorf("discoveryd: %s: %w", d.CACertFile(), err)
	}
	c := certs[0]
	if !c.IsCA || c.CheckSignatureFrom(c) != nil {
		return nil, fmt.Errorf("discoveryd: %s is not a self-signed CA certificate", d.CACertFile())
	}
	return c, nil
}

func readKey(path string) (crypto.Signer, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("discoveryd: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("discoveryd: key %s is accessible by other users (mode %04o); run chmod 600 on it", path, fi.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("discoveryd: %w", err)
	}
	key, err := ca.ParseKeyPEM(data)
	if err != nil {
		return nil, fmt.Errorf("discoveryd: %s: %w", path, err)
	}
	return key, nil
}

// Address is DIR/discovery.addr: where the running (or last) discovery
// listened, the issuer of its tickets, and its store.
type Address struct {
	Listen    string `json:"listen"`
	Advertise string `json:"advertise"`
	Issuer    string `json:"issuer"`
	PID       int    `json:"pid"`
	// Store is the URL of the store discovery opened, when it was not
	// DIR/discovery.db, without a password (the driver reads it from
	// PGPASSWORD or PGPASSFILE): the store the commands that work on it
	// directly, and discovery started again, open without --store
	// (StoreURL), as authority.json's store is the authority's.
	Store string `json:"store,omitempty"`
}

// unrecorded stands for the user and password of a store URL recorded
// without either, as authority.json writes one it cannot parse.
const unrecorded = "…@"

// StoreURL returns the URL of d's store: given, else the one
// discovery.addr records (no password), else DIR/discovery.db. fromRecord
// says it is discovery.addr's, so that an error connecting can say where
// the password comes from. A URL recorded without its user name is
// refused, asking for --store, before anything is opened.
func (d Dir) StoreURL(given string) (url string, fromRecord bool, err error) {
	if given != "" {
		return given, false, nil
	}
	a, err := d.ReadAddress()
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return d.DefaultStoreURL(), false, nil
	case err != nil:
		return "", false, err
	case a.Store == "":
		return d.DefaultStoreURL(), false, nil
	case strings.Contains(a.Store, unrecorded):
		return "", false, fmt.Errorf("discoveryd: %s records the store %s without its user name; give --store URL", d.AddressFile(), a.Store)
	}
	return a.Store, true, nil
}

// WriteAddress records a. The file stays after a stop, so `muster
// discovery show` can name the issuer.
func (d Dir) WriteAddress(a Address) error {
	data, err := json.MarshalIndent(a, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(d.AddressFile(), append(data, '\n'), 0o600)
}

// ReadAddress reads discovery.addr; fs.ErrNotExist (wrapped) if no
// discovery has started in d.
func (d Dir) ReadAddress() (Address, error) {
	data, err := os.ReadFile(d.AddressFile())
	if err != nil {
		return Address{}, err
	}
	var a Address
	if err := json.Unmarshal(data, &a); err != nil || a.Issuer == "" {
		return Address{}, fmt.Errorf("discoveryd: %s is corrupt", d.AddressFile())
	}
	return a, nil
}

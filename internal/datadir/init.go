package datadir

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/google/uuid"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/oserr"
	"github.com/muster-dev/muster/internal/psk"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

// DefaultOperatorTTL is the lifetime of operator identities unless told
// otherwise: short enough that a leaked one dies on its own.
const DefaultOperatorTTL = 30 * 24 * time.Hour

// InitOptions are the inputs of Init.
type InitOptions struct {
	Dir  Dir
	Name string
	// TrustDomain defaults to the authority ID.
	TrustDomain  string
	OperatorName string
	OperatorTTL  time.Duration
	Now          time.Time
	// OpenStore opens the store the authority will use, when it is not the
	// embedded SQLite file in the data directory (PostgreSQL for
	// replicas). The store must be empty.
	OpenStore func(ctx context.Context) (store.Store, error)
	// StoreURL names that store, without its password, for authority.json.
	StoreURL string
	// Token, if set, is the PKCS#11 token the CA intermediates and the
	// first task signer are generated in; Custody, recorded in
	// authority.json, says how the authority opens it. A CACustody given
	// without a Token (tests) makes the rotated intermediates' keys too.
	Token   *custody.Token
	Custody *Custody
	// CACustody and SignerCustody choose the custody of the keys from the
	// storage key and Token (the authority's CACustody, SignerCustody).
	CACustody     func(seal.StorageKey, *custody.Token) (custody.Custody, error)
	SignerCustody func(seal.StorageKey, *custody.Token) (signer.Custody, error)
}

// InitResult is what Init created and what the operator must be told once.
type InitResult struct {
	// Dir is the absolute path of the new data directory.
	Dir          Dir
	Info         Info
	BootstrapPSK psk.PSK
	PSKID        string
	OperatorID   spiffeid.ID
	OperatorFile string
	// StoreURL names an external store, without its password; "" for the
	// embedded one.
	StoreURL string
}

// ErrAlreadyInitialised reports a directory Init must not touch.
var ErrAlreadyInitialised = errors.New("datadir: already initialised")

// Init creates a complete data directory. Everything is built in a staging
// directory beside DIR and renamed into place at the end, so a failure at
// any step leaves DIR exactly as it was.
func Init(ctx context.Context, o InitOptions) (_ InitResult, err error) {
	if err := ca.ValidName(o.Name); err != nil {
		return InitResult{}, err
	}
	if o.OperatorName == "" {
		o.OperatorName = "admin"
	}
	if err := spiffeid.NameError("--operator", "operator", o.OperatorName); err != nil {
		return InitResult{}, fmt.Errorf("datadir: %w", err)
	}
	if o.TrustDomain != "" {
		if err := spiffeid.ValidTrustDomain(o.TrustDomain); err != nil {
			return InitResult{}, err
		}
	}
	if o.OperatorTTL == 0 {
		o.OperatorTTL = DefaultOperatorTTL
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	target, err := filepath.Abs(string(o.Dir))
	if err != nil {
		return InitResult{}, err
	}
	if err := checkTarget(Dir(target)); err != nil {
		return InitResult{}, err
	}
	// A failed init on the embedded store leaves nothing (the staging
	// directory, with the store, removed; keys made in a token
	// destroyed): it says so, and that the same init runs again. An
	// external store's error says what was left there (undoInitStore).
	var staging string
	stagingLeft, keysLeft := false, false
	defer func() {
		if err == nil || staging == "" || o.OpenStore != nil {
			return
		}
		if stagingLeft {
			err = fmt.Errorf("%w; removing the staging directory %s failed: remove it by hand (it holds the new authority's keys), then run muster init again", err, staging)
		} else if entries, rerr := os.ReadDir(target); !keysLeft && (errors.Is(rerr, fs.ErrNotExist) || rerr == nil && len(entries) == 0) {
			err = fmt.Errorf("%w (muster init left nothing behind: run it again)", err)
		}
	}()
	// Missing parents are created 0700, as mkdir -p would (but private);
	// a failed init removes them again.
	created, err := mkdirParents(filepath.Dir(target))
	if err != nil {
		return InitResult{}, fmt.Errorf("datadir: cannot create %s: %w", target, oserr.Reason(err))
	}
	ok := false
	defer func() {
		if !ok && created != "" {
			os.RemoveAll(created)
		}
	}()
	// Keys made in a token outlive the staging directory and the store:
	// a failed init destroys them (a sealed key has nothing to destroy).
	var made madeKeys
	defer func() {
		if !ok {
			if derr := made.destroyAll(context.WithoutCancel(ctx)); derr != nil {
				keysLeft = true
				err = fmt.Errorf("%w (and destroying the keys this init made in the PKCS#11 token failed: delete the objects labelled muster-ca/… and muster-signer/… by hand, docs/hsm.md: %v)", err, derr)
			}
		}
	}()
	// An existing (empty) directory is kept and filled in place: systemd's
	// StateDirectory= and Kubernetes volumes give one whose parent the
	// service cannot write, or that is a mount point, so the staging
	// directory is then built inside it and its entries moved in.
	_, statErr := os.Stat(target)
	inPlace := statErr == nil
	parent := filepath.Dir(target)
	if inPlace {
		parent = target
	}
	staging, err = os.MkdirTemp(parent, "."+filepath.Base(target)+".init-*")
	if err != nil {
		return InitResult{}, fmt.Errorf("datadir: cannot create %s: %w", target, oserr.Reason(err))
	}
	defer func() {
		if !ok {
			stagingLeft = os.RemoveAll(staging) != nil
		}
	}()
	if err := os.Chmod(staging, 0o700); err != nil {
		return InitResult{}, err
	}
	res, err := build(ctx, Dir(staging), o, &made)
	if err != nil {
		return InitResult{}, err
	}
	// rename(2) refuses to replace an existing directory here (os.Rename
	// checks), and moveInto refuses any existing name, so a racing init
	// cannot be overwritten.
	if inPlace {
		err = moveInto(staging, target)
	} else if err = os.Rename(staging, target); err != nil {
		err = fmt.Errorf("datadir: cannot move the new data directory into %s: %w", target, oserr.Reason(err))
	}
	if err != nil {
		return InitResult{}, err
	}
	ok = true
	if d, err := os.Open(filepath.Dir(target)); err == nil {
		d.Sync()
		d.Close()
	}
	res.Dir = Dir(target)
	res.OperatorFile = res.Dir.OperatorFile()
	return res, nil
}

func checkTarget(d Dir) error {
	entries, err := os.ReadDir(string(d))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("datadir: cannot read %s: %w", d, oserr.Reason(err))
	}
	if _, err := os.Stat(d.InfoFile()); err == nil {
		return fmt.Errorf("%w: %s already holds an authority; refusing to overwrite it", ErrAlreadyInitialised, d)
	}
	if len(entries) > 0 {
		return fmt.Errorf("datadir: %s is not empty; give a new or empty directory", d)
	}
	return nil
}

func build(ctx context.Context, d Dir, o InitOptions, made *madeKeys) (_ InitResult, err error) {
	h, err := ca.Create(o.Name, o.Now)
	if err != nil {
		return InitResult{}, err
	}
	var sk seal.StorageKey
	if sk, err = seal.DeriveStorageKey(h.RootKey); err != nil {
		return InitResult{}, err
	}
	// With a token, the intermediates the store rotates are made again
	// with keys generated inside it; the ones ca.Create made are dropped.
	var inToken []store.CACert
	if o.Token != nil || o.CACustody != nil {
		if inToken, err = intermediatesInToken(ctx, h, sk, o, made); err != nil {
			return InitResult{}, err
		}
	}
	if err := h.WriteDir(d.CADir()); err != nil {
		return InitResult{}, err
	}
	fp := h.Fingerprint()
	info := Info{
		FormatVersion: FormatVersion,
		AuthorityID:   ca.AuthorityID(o.Name, fp),
		Name:          o.Name,
		TrustDomain:   o.TrustDomain,
		CAFingerprint: fp,
		CreatedAt:     o.Now.UTC().Truncate(time.Second),
		Store:         o.StoreURL,
	}
	if info.TrustDomain == "" {
		info.TrustDomain = info.AuthorityID
	}
	info.Custody = o.Custody
	if err := sk.WriteFile(d.StorageKeyFile()); err != nil {
		return InitResult{}, err
	}

	st, err := openInitStore(ctx, d, o)
	if err != nil {
		return InitResult{}, err
	}
	defer st.Close()
	if o.OpenStore != nil {
		// An external store outlives a failed init: take back what it
		// wrote, or say how to.
		defer func() {
			if err != nil {
				err = undoInitStore(context.WithoutCancel(ctx), st, err)
			}
		}()
	}

	logger, err := NewAuditLogger(st, sk, d.CheckpointFile(), nil)
	if err != nil {
		return InitResult{}, err
	}
	// authority.init first: it stamps the store (CheckStore reads it as
	// record 1). It records the whole init, which has no row of its own
	// to share a transaction with: a failed init is undone whole (the
	// staging directory removed, an external store's schema dropped
	// when init created it: undoInitStore), so the record never stands
	// without its authority. Every row init writes after it goes in with
	// its own record (ca.create, psk.create, operator.add), as every
	// later change does.
	if _, err := logger.Record(ctx, audit.Event{Actor: "muster init", Action: initAction, Target: info.AuthorityID, Result: audit.ResultOK, Reason: "ca " + fp}); err != nil {
		return InitResult{}, err
	}
	for _, row := range inToken {
		link, err := logger.Builder(audit.Event{Actor: "muster init", Action: "ca.create", Target: row.Role + "/" + row.Serial, Result: audit.ResultOK,
			Reason: "key generated in PKCS#11 token: " + string(row.KeyRef)})
		if err != nil {
			return InitResult{}, err
		}
		if err := st.InsertCACert(ctx, row, link.Build); err != nil {
			return InitResult{}, err
		}
		logger.Appended(link)
	}
	key, pskID, err := createPSK(ctx, st, sk, o.Now, logger)
	if err != nil {
		return InitResult{}, err
	}
	opID, err := spiffeid.New(info.TrustDomain, spiffeid.RoleAdmin, o.OperatorName)
	if err != nil {
		return InitResult{}, err
	}
	op, err := IssueOperator(h.Issuer(ca.RoleAdmin), h.Root, opID, nil, o.OperatorTTL, o.Now)
	if err != nil {
		return InitResult{}, err
	}
	// Written before the store records the operator, but into the
	// staging directory: a failed InsertOperator removes it with the
	// rest (Init), so no operator.pem the store does not know is left
	// (TestFailedOperatorWriteLeavesNoIdentity).
	if err := op.Save(d.OperatorFile(), false); err != nil {
		return InitResult{}, err
	}
	// The first operator goes in with its record, as every operator
	// does (store.Store.InsertOperator).
	link, err := logger.Builder(audit.Event{Actor: "muster init", Action: "operator.add", Target: opID.String(), Result: audit.ResultOK})
	if err != nil {
		return InitResult{}, err
	}
	if err := st.InsertOperator(ctx, OperatorRecord(op, opID, "muster init", o.Now), link.Build); err != nil {
		return InitResult{}, err
	}
	logger.Appended(link)
	// The first task signer, active at once (DESIGN.md: muster init
	// creates it); authorities started on an older data directory create
	// it at start instead.
	var keys signer.Custody
	if o.SignerCustody != nil {
		keys, err = o.SignerCustody(sk, o.Token)
	} else {
		keys, err = signer.NewSealed(sk)
	}
	if err != nil {
		return InitResult{}, err
	}
	keys = made.signers(keys)
	if _, err := signer.NewKeeper(st, keys, logger, info.AuthorityID, 0).EnsureFirst(ctx, signer.Actor{Name: "muster init"}); err != nil {
		return InitResult{}, err
	}
	if _, err := logger.Checkpoint(ctx); err != nil {
		return InitResult{}, err
	}
	if err := writeJSON(d.InfoFile(), info); err != nil {
		return InitResult{}, err
	}
	return InitResult{Info: info, BootstrapPSK: key, PSKID: pskID, OperatorID: opID}, nil
}

// openInitStore opens the new authority's store. An external store must
// hold no authority yet: init never adds a second chain or PSK to one.
func openInitStore(ctx context.Context, d Dir, o InitOptions) (store.Store, error) {
	if o.OpenStore == nil {
		return sqlite.Open(ctx, d.DatabaseFile())
	}
	st, err := o.OpenStore(ctx)
	if err != nil {
		return nil, err
	}
	head, err := st.AuditHead(ctx)
	if err != nil {
		st.Close()
		return nil, err
	}
	psks, err := st.ListPSKs(ctx)
	if err != nil {
		st.Close()
		return nil, err
	}
	if head.Seq != 0 || len(psks) != 0 {
		st.Close()
		return nil, fmt.Errorf("%w: the store already holds an authority's records; give an empty database (if they are those of a muster init that failed part way, drop and create the database again: DROP DATABASE name; CREATE DATABASE name OWNER user)", ErrAlreadyInitialised)
	}
	return st, nil
}

// schemaDropper is a store whose schema Open may have made, and can drop
// again (the PostgreSQL store).
type schemaDropper interface {
	Created() bool
	DropCreated(ctx context.Context) error
}

// undoInitStore answers an init that failed after it opened an external
// store (cause): muster init's writes are many, so instead of leaving a
// half-made authority that the next init would refuse, it drops the
// schema the store's Open made, rows and all, leaving the database as
// init found it. Where it cannot (a store that had the schema before, or
// another kind), the error names the way out.
func undoInitStore(ctx context.Context, st store.Store, cause error) error {
	if d, ok := st.(schemaDropper); ok && d.Created() {
		err := d.DropCreated(ctx)
		if err == nil {
			return fmt.Errorf("%w (the store is as muster init found it: run muster init again)", cause)
		}
		cause = fmt.Errorf("%w; removing what it wrote to the store failed too: %v", cause, err)
	}
	return fmt.Errorf("%w; the store may now hold part of an authority, which the next muster init refuses: drop and create the database again (DROP DATABASE name; CREATE DATABASE name OWNER user) before running muster init again", cause)
}

// createPSK makes the first bootstrap PSK, stored with its psk.create
// record.
func createPSK(ctx context.Context, st store.Store, sk seal.StorageKey, now time.Time, logger *audit.Logger) (psk.PSK, string, error) {
	key, rec, err := NewPSK(sk, now)
	if err != nil {
		return psk.PSK{}, "", err
	}
	link, err := logger.Builder(audit.Event{Actor: "muster init", Action: "psk.create", Target: rec.ID, Result: audit.ResultOK})
	if err != nil {
		return psk.PSK{}, "", err
	}
	if err := st.InsertPSK(ctx, rec, link.Build); err != nil {
		return psk.PSK{}, "", err
	}
	logger.Appended(link)
	return key, rec.ID, nil
}

// NewPSK generates a bootstrap PSK and its store record, active, sealed
// under the storage key. The row ID is the additional data, so a
// ciphertext copied into another row does not decrypt.
func NewPSK(sk seal.StorageKey, now time.Time) (psk.PSK, store.PSK, error) {
	key, err := psk.Generate()
	if err != nil {
		return psk.PSK{}, store.PSK{}, err
	}
	sealer, err := sk.Sealer(seal.InfoPSK)
	if err != nil {
		return psk.PSK{}, store.PSK{}, err
	}
	rec := store.PSK{ID: "psk-" + uuid.NewString(), Status: store.PSKActive, CreatedAt: now}
	if rec.Ciphertext, rec.Nonce, err = sealer.Seal(key.Bytes(), []byte(rec.ID)); err != nil {
		return psk.PSK{}, store.PSK{}, err
	}
	return key, rec, nil
}

// IssueOperator certifies an operator identity. With a nil key it mints a
// fresh P-256 key.
func IssueOperator(admin *ca.Issuer, root *x509.Certificate, id spiffeid.ID, key *ecdsa.PrivateKey, ttl time.Duration, now time.Time) (*identity.Identity, error) {
	if key == nil {
		var err error
		if key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			return nil, err
		}
	}
	leaf, err := admin.Issue(ca.LeafRequest{
		PublicKey:  key.Public(),
		SPIFFEID:   id.URL(),
		CommonName: id.Name,
		ClientAuth: true,
		NotBefore:  now,
		TTL:        ttl,
	})
	if err != nil {
		return nil, err
	}
	return &identity.Identity{Chain: []*x509.Certificate{leaf, admin.Cert}, Key: key, Roots: []*x509.Certificate{root}}, nil
}

// OperatorRecord is the store's record of an issued operator certificate.
func OperatorRecord(op *identity.Identity, id spiffeid.ID, createdBy string, now time.Time) store.Operator {
	leaf := op.Leaf()
	return store.Operator{
		Serial:    leaf.SerialNumber.Text(16),
		Name:      id.Name,
		SPIFFEID:  id.String(),
		NotBefore: leaf.NotBefore,
		NotAfter:  leaf.NotAfter,
		CreatedBy: createdBy,
		CreatedAt: now,
	}
}

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return identity.WriteFileAtomic(path, append(data, '\n'), 0o600)
}

// NewAuditLogger wires the audit logger with keys derived from the storage
// key, which lives outside the store: whoever can only write the database
// can neither extend the chain nor sign a checkpoint.
func NewAuditLogger(st audit.Store, sk seal.StorageKey, checkpointFile string, onAppend func(audit.Event)) (*audit.Logger, error) {
	return audit.New(audit.Config{
		Store:          st,
		ChainKey:       sk.Derive(seal.InfoAuditChain, 32),
		CheckpointKey:  ed25519.NewKeyFromSeed(sk.Derive(seal.InfoAuditCheckpoint, ed25519.SeedSize)),
		CheckpointFile: checkpointFile,
		// The head file lives beside the checkpoint file, in the same
		// directory the server owns.
		HeadFile: headFileBeside(checkpointFile),
		// The offline commands append beside a running authority, from
		// the same directory: its files are written one process at a time.
		LockFile: besideCheckpoint(checkpointFile, "audit.lock"),
		Now:      time.Now,
		OnAppend: onAppend,
	})
}

// headFileBeside is the audit head file of the data directory whose
// checkpoint file is checkpointFile ("" for none).
func headFileBeside(checkpointFile string) string {
	return besideCheckpoint(checkpointFile, "audit-head")
}

// besideCheckpoint is the file name in the directory of checkpointFile
// ("" for none).
func besideCheckpoint(checkpointFile, name string) string {
	if checkpointFile == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(checkpointFile), name)
}

// mkdirParents creates dir and its missing parents 0700 and returns the
// topmost directory it created ("" if dir existed), for removal if what
// follows fails.
func mkdirParents(dir string) (string, error) {
	top := ""
	for p := dir; ; p = filepath.Dir(p) {
		if _, err := os.Stat(p); err == nil {
			break
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		top = p
		if filepath.Dir(p) == p {
			break
		}
	}
	if top == "" {
		return "", nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	return top, nil
}

// rotatedRoles are the intermediates the store keeps and rotates; the
// policy signing certificate stays in the data directory.
var rotatedRoles = []ca.Role{ca.RoleBootstrap, ca.RoleServer, ca.RoleAgent, ca.RoleAdmin}

// intermediatesInToken replaces h's rotated intermediates with ones whose
// keys are generated in o.Token (or in o.CACustody without one), and
// returns their store rows (active). Every key made is added to made, so
// a failure of init, here or later, destroys it.
func intermediatesInToken(ctx context.Context, h *ca.Hierarchy, sk seal.StorageKey, o InitOptions, made *madeKeys) (rows []store.CACert, err error) {
	if o.CACustody == nil {
		return nil, errors.New("datadir: a token needs the CA custody")
	}
	c, err := o.CACustody(sk, o.Token)
	if err != nil {
		return nil, err
	}
	for _, role := range rotatedRoles {
		serial, err := ca.NewSerial()
		if err != nil {
			return nil, err
		}
		name := string(role) + "/" + serial.Text(16)
		k, err := c.Create(ctx, name, custody.ECDSAP256)
		if err != nil {
			return nil, err
		}
		made.add(func(ctx context.Context) error { return c.Destroy(ctx, name, k) })
		cert, err := h.NewIntermediate(role, serial, k.Public, h.RootKey, o.Now, ca.IntermediateTTL)
		if err != nil {
			return nil, err
		}
		key, err := c.Signer(ctx, name, k)
		if err != nil {
			return nil, err
		}
		h.Issuers[role] = &ca.Issuer{Cert: cert, Key: key}
		rows = append(rows, store.CACert{Role: string(role), Serial: serial.Text(16), CertDER: cert.Raw, KeyRef: k.Ref, State: store.CAActive, NotAfter: cert.NotAfter})
	}
	return rows, nil
}

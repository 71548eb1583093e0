//go:build pkcs11 && cgo

package custody

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/asn1"
	"errors"
	"fmt"
	"io"
	"math/big"
	"strings"
	"sync"
	"time"

	"github.com/miekg/pkcs11"

	"github.com/muster-dev/muster/internal/shellword"
)

// PKCS#11 3.0 values for Ed25519, which miekg/pkcs11 v1.1.2 predates.
const (
	ckkECEdwards            = 0x40
	ckmECEdwardsKeyPairGen  = 0x1055
	ckmEdDSA                = 0x1057
	reconnectBackoffInitial = 100 * time.Millisecond
	reconnectBackoffMax     = 30 * time.Second
)

var (
	oidP256    = []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}
	oidEd25519 = []byte{0x06, 0x03, 0x2b, 0x65, 0x70}
)

// PKCS11Build reports whether this binary can open a PKCS#11 token.
const PKCS11Build = true

// Token is an open PKCS#11 token: one module loaded, one slot, a pool of
// logged-in sessions. Views on it (For) are the custodies; they share the
// pool. A session the module reports lost is dropped and the call retried
// once on a fresh one; when that fails too, the token is re-opened in the
// background with backoff and Ready says why it is not, until it is.
type Token struct {
	mod *pkcs11.Ctx
	uri PKCS11URI
	// module is the library's path, for the commands an operator is
	// told to run against the token (DeleteCommands).
	module string
	// dataArgs is the --data value of the authority
	// whose keys the token holds (NameDataDir), for the commands a
	// missing key's error names: DIR until told.
	dataArgs string
	sem      chan struct{}
	idle     chan pkcs11.SessionHandle

	mu         sync.Mutex
	pin        string
	pinRefused error // the token refused the PIN: never log in again
	openFails  bool  // set by tests: the token is out
	// afterFind, set by tests, runs once a lookup has found the key's
	// objects, before it reads them: where a token pulled out mid-lookup
	// shows.
	afterFind  func()
	slot       uint
	down       error // why the token is unusable, nil when it is fine
	recovering bool
	closed     bool
	stop       chan struct{}
	owner      bool // initialised the module, so finalises it
}

// OpenPKCS11 loads the module, finds the token the URI names and logs in.
func OpenPKCS11(cfg PKCS11Config) (*Token, error) {
	u, err := ParsePKCS11URI(cfg.URI)
	if err != nil {
		return nil, err
	}
	path, err := cfg.module(u)
	if err != nil {
		return nil, err
	}
	pin, err := cfg.ReadPIN(u)
	if err != nil {
		return nil, err
	}
	mod := pkcs11.New(path)
	if mod == nil {
		return nil, fmt.Errorf("custody: cannot load the PKCS#11 module %s", path)
	}
	// A module another Token in this process initialised already is
	// shared: only the one that initialised it finalises it.
	owner := true
	if err := mod.Initialize(); errors.Is(err, pkcs11.Error(pkcs11.CKR_CRYPTOKI_ALREADY_INITIALIZED)) {
		owner = false
	} else if err != nil {
		mod.Destroy()
		return nil, moduleFailed(path, fmt.Errorf("custody: initialising the PKCS#11 module %s: %w", path, err))
	}
	n := cfg.Sessions
	if n <= 0 {
		n = DefaultSessions
	}
	t := &Token{mod: mod, uri: u, module: path, pin: pin, sem: make(chan struct{}, n), idle: make(chan pkcs11.SessionHandle, n), stop: make(chan struct{}), owner: owner}
	if t.slot, err = t.findSlot(); err != nil {
		t.Close()
		return nil, moduleFailed(path, err)
	}
	// One session now, so a wrong PIN fails the start, not the first use.
	sh, err := t.open()
	if err != nil {
		t.Close()
		return nil, moduleFailed(path, err)
	}
	t.idle <- sh
	return t, nil
}

// generalError is a failure to open a token that the module answered
// with CKR_GENERAL_ERROR, told with its likely cause (GeneralCause).
type generalError struct {
	err    error
	module string
}

func (e generalError) Error() string { return e.err.Error() + ": " + GeneralCause(e.module) }

func (e generalError) Unwrap() []error { return []error{e.err, ErrModuleFailed} }

// moduleFailed is err, with the likely cause when module answered
// CKR_GENERAL_ERROR: an operator given only the code cannot act on it.
func moduleFailed(module string, err error) error {
	if errors.Is(err, pkcs11.Error(pkcs11.CKR_GENERAL_ERROR)) {
		return generalError{err: err, module: module}
	}
	return err
}

func (t *Token) findSlot() (uint, error) {
	slots, err := t.mod.GetSlotList(true)
	if err != nil {
		return 0, fmt.Errorf("custody: listing PKCS#11 slots: %w", err)
	}
	for _, s := range slots {
		ti, err := t.mod.GetTokenInfo(s)
		if err != nil {
			continue
		}
		trim := func(s string) string { return strings.TrimRight(s, " \x00") }
		if trim(ti.Label) != t.uri.Token ||
			t.uri.Manufacturer != "" && trim(ti.ManufacturerID) != t.uri.Manufacturer ||
			t.uri.Model != "" && trim(ti.Model) != t.uri.Model ||
			t.uri.Serial != "" && trim(ti.SerialNumber) != t.uri.Serial {
			continue
		}
		return s, nil
	}
	return 0, fmt.Errorf("custody: no PKCS#11 token labelled %q is present", t.uri.Token)
}

// open opens a session and logs in (PKCS#11 logs in the application, not
// the session: after the last session closes it must log in again).
func (t *Token) open() (pkcs11.SessionHandle, error) {
	t.mu.Lock()
	slot, pin, refused, out := t.slot, t.pin, t.pinRefused, t.openFails
	t.mu.Unlock()
	if refused != nil {
		return 0, refused
	}
	if out {
		return 0, fmt.Errorf("custody: opening a PKCS#11 session: %w", pkcs11.Error(pkcs11.CKR_TOKEN_NOT_PRESENT))
	}
	sh, err := t.mod.OpenSession(slot, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		return 0, fmt.Errorf("custody: opening a PKCS#11 session: %w", err)
	}
	if err := t.mod.Login(sh, pkcs11.CKU_USER, pin); err != nil && !errors.Is(err, pkcs11.Error(pkcs11.CKR_USER_ALREADY_LOGGED_IN)) {
		t.mod.CloseSession(sh)
		if errors.Is(err, pkcs11.Error(pkcs11.CKR_PIN_INCORRECT)) || errors.Is(err, pkcs11.Error(pkcs11.CKR_PIN_LOCKED)) {
			// Never tried again: an HSM locks its user PIN after a few
			// wrong ones. The authority must be restarted with the right
			// PIN.
			err = fmt.Errorf("custody: logging in to PKCS#11 token %q: the PIN is wrong or locked (%w); not retried, so that the token does not lock it: correct the PIN (the --pkcs11-pin-file FILE, or %s) and run the command again; a running authority keeps it refused until restarted with the right PIN", t.uri.Token, err, PINEnv)
			t.mu.Lock()
			t.pinRefused = err
			t.mu.Unlock()
			return 0, err
		}
		return 0, fmt.Errorf("custody: logging in to PKCS#11 token %q: %w", t.uri.Token, err)
	}
	return sh, nil
}

// lost reports an error that means the session or token is gone, not
// that the operation was refused.
func lost(err error) bool {
	var e pkcs11.Error
	if !errors.As(err, &e) {
		return false
	}
	switch e {
	case pkcs11.CKR_SESSION_HANDLE_INVALID, pkcs11.CKR_SESSION_CLOSED, pkcs11.CKR_DEVICE_REMOVED, pkcs11.CKR_DEVICE_ERROR,
		pkcs11.CKR_TOKEN_NOT_PRESENT, pkcs11.CKR_TOKEN_NOT_RECOGNIZED, pkcs11.CKR_USER_NOT_LOGGED_IN,
		pkcs11.CKR_CRYPTOKI_NOT_INITIALIZED, pkcs11.CKR_SLOT_ID_INVALID, pkcs11.CKR_GENERAL_ERROR:
		return true
	}
	return false
}

// do runs fn on a pooled session. A lost session is closed and fn tried
// once more on a new one; a second loss starts the background re-open.
func (t *Token) do(ctx context.Context, fn func(pkcs11.SessionHandle) error) error {
	select {
	case t.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-t.sem }()
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		var sh pkcs11.SessionHandle
		select {
		case sh = <-t.idle:
		default:
			if sh, err = t.open(); err != nil {
				if attempt == 0 {
					continue
				}
				return t.markDown(err)
			}
		}
		err = fn(sh)
		if err != nil && !lost(err) {
			// A token pulled out mid-call shows as whatever the call
			// met first: handles found a moment before are invalid, so
			// a key looked up reads as not matching its reference
			// (ErrKey). Only a token still in its slot makes that an
			// answer about the key; one that is gone is lost, retried
			// and re-opened, and the caller hears it is unavailable.
			if terr := t.present(); lost(terr) {
				err = terr
			}
		}
		if !lost(err) {
			t.idle <- sh
			return err
		}
		// The others idle were most likely lost with it (a token
		// re-inserted, sessions closed under us): the retry opens anew.
		t.mod.CloseSession(sh)
		t.drainIdle()
	}
	return t.markDown(err)
}

// present is nil while the token is in its slot, else the module's
// error for it.
func (t *Token) present() error {
	t.mu.Lock()
	slot := t.slot
	t.mu.Unlock()
	_, err := t.mod.GetTokenInfo(slot)
	return err
}

// markDown records that the token is unusable and starts re-opening it.
func (t *Token) markDown(cause error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.down = cause
	if !t.recovering && !t.closed {
		t.recovering = true
		go t.recover()
	}
	return fmt.Errorf("%w: %v", ErrUnavailable, cause)
}

// recover re-opens the token with backoff until a session logs in.
func (t *Token) recover() {
	wait := reconnectBackoffInitial
	for {
		select {
		case <-t.stop:
			return
		case <-time.After(wait):
		}
		err := t.reopen()
		t.mu.Lock()
		if err == nil {
			t.down, t.recovering = nil, false
			t.mu.Unlock()
			return
		}
		t.down = err
		if t.pinRefused != nil {
			t.mu.Unlock()
			return
		}
		t.mu.Unlock()
		wait = min(wait*2, reconnectBackoffMax)
	}
}

// reopen drops the idle sessions, finds the slot again (a re-inserted
// token may have another) and logs in on a new session.
func (t *Token) reopen() error {
	t.drainIdle()
	err := t.reopenSlot()
	t.mu.Lock()
	refused := t.pinRefused
	t.mu.Unlock()
	if err == nil || refused != nil || !t.owner {
		return err
	}
	// A module may keep what it learnt of its tokens at C_Initialize: to
	// SoftHSM2 a token deleted and initialised again under the same label
	// stays the old one, and every login fails (CKR_GENERAL_ERROR) until
	// the process restarts. Starting the module again makes it look anew;
	// only the Token that initialised it does so, and only with no call
	// in the module (PKCS#11 leaves C_Finalize during one undefined): it
	// takes every session slot first, or tries at the next round.
	held := 0
	defer func() {
		for range held {
			<-t.sem
		}
	}()
	for ; held < cap(t.sem); held++ {
		select {
		case t.sem <- struct{}{}:
		default:
			return err
		}
	}
	t.mod.Finalize()
	if err := t.mod.Initialize(); err != nil && !errors.Is(err, pkcs11.Error(pkcs11.CKR_CRYPTOKI_ALREADY_INITIALIZED)) {
		return fmt.Errorf("custody: initialising the PKCS#11 module again: %w", err)
	}
	return t.reopenSlot()
}

// reopenSlot finds the token's slot and logs in on a new session, kept
// idle.
func (t *Token) reopenSlot() error {
	slot, err := t.findSlot()
	if errors.Is(err, pkcs11.Error(pkcs11.CKR_CRYPTOKI_NOT_INITIALIZED)) {
		if err = t.mod.Initialize(); err == nil {
			slot, err = t.findSlot()
		}
	}
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.slot = slot
	t.mu.Unlock()
	sh, err := t.open()
	if err != nil {
		return err
	}
	select {
	case t.idle <- sh:
	default:
		t.mod.CloseSession(sh)
	}
	return nil
}

// drainIdle closes every idle session.
func (t *Token) drainIdle() {
	for {
		select {
		case sh := <-t.idle:
			t.mod.CloseSession(sh)
		default:
			return
		}
	}
}

// NameDataDir tells t the --data value of the
// authority whose keys it holds, quoted for the shell, so that the
// commands its errors name run pasted on that authority's machine.
// Call it before the token is used.
func (t *Token) NameDataDir(args string) {
	t.mu.Lock()
	t.dataArgs = args
	t.mu.Unlock()
}

func (t *Token) hintData() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return firstOf(t.dataArgs, "DIR")
}

// Module is the path of the PKCS#11 library the token was opened with;
// "" for no token (nil).
func (t *Token) Module() string {
	if t == nil {
		return ""
	}
	return t.module
}

// Ready is nil while the token is usable, else why not (for /readyz).
func (t *Token) Ready() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.down != nil {
		return fmt.Errorf("%w (re-opening): %v", ErrUnavailable, t.down)
	}
	return nil
}

// Close logs out, closes every session and unloads the module.
func (t *Token) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	close(t.stop)
	slot := t.slot
	t.mu.Unlock()
	if !t.owner {
		t.drainIdle()
		return nil
	}
	t.mod.CloseAllSessions(slot)
	t.mod.Finalize()
	t.mod.Destroy()
	return nil
}

// For returns the custody of one kind of key in this token: its objects'
// labels are prefix followed by the key's name, e.g. "muster-ca/agent/1f".
func (t *Token) For(prefix string) *PKCS11 { return &PKCS11{t: t, prefix: prefix} }

// PKCS11 is custody in a PKCS#11 token. Keys are generated inside it as
// token objects that are sensitive and not extractable; the reference the
// store keeps is the private key's pkcs11: URI (token, label, CKA_ID), so
// every replica opening the same token finds the same object.
type PKCS11 struct {
	t      *Token
	prefix string
}

var _ Custody = (*PKCS11)(nil)

// Token is the token the custody uses.
func (c *PKCS11) Token() *Token { return c.t }

// Module is the PKCS#11 library of the custody's token.
func (c *PKCS11) Module() string { return c.t.Module() }

// TokenURI is the pkcs11: URI the custody's token was opened by.
func (c *PKCS11) TokenURI() string { return c.t.uri.String() }

// Create generates a key pair inside the token.
func (c *PKCS11) Create(ctx context.Context, name string, alg Algorithm) (Key, error) {
	var (
		mech   uint
		keyTyp uint
		params []byte
	)
	switch alg {
	case ECDSAP256:
		mech, keyTyp, params = pkcs11.CKM_EC_KEY_PAIR_GEN, pkcs11.CKK_EC, oidP256
	case Ed25519:
		mech, keyTyp, params = ckmECEdwardsKeyPairGen, ckkECEdwards, oidEd25519
	default:
		return Key{}, fmt.Errorf("%w: %q", ErrAlgorithm, alg)
	}
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return Key{}, err
	}
	label := c.prefix + name
	pubT := []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_PUBLIC_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, keyTyp),
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
		pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, false),
		pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true),
		pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, params),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
		pkcs11.NewAttribute(pkcs11.CKA_ID, id),
	}
	privT := []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, keyTyp),
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
		pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
		pkcs11.NewAttribute(pkcs11.CKA_SIGN, true),
		pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true),
		pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, false),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
		pkcs11.NewAttribute(pkcs11.CKA_ID, id),
	}
	var pub crypto.PublicKey
	err := c.t.do(ctx, func(sh pkcs11.SessionHandle) error {
		pubH, _, err := c.t.mod.GenerateKeyPair(sh, []*pkcs11.Mechanism{pkcs11.NewMechanism(mech, nil)}, pubT, privT)
		if err != nil {
			return err
		}
		pub, err = c.t.readPublic(sh, pubH, alg)
		return err
	})
	if err != nil {
		return Key{}, fmt.Errorf("custody: generating a %s key in PKCS#11 token %q: %w", alg, c.t.uri.Token, err)
	}
	ref := PKCS11URI{Token: c.t.uri.Token, Object: label, ID: id, Type: "private"}
	return Key{Public: pub, Ref: []byte(ref.String())}, nil
}

// readPublic reads a public key object's point.
func (t *Token) readPublic(sh pkcs11.SessionHandle, h pkcs11.ObjectHandle, alg Algorithm) (crypto.PublicKey, error) {
	attrs, err := t.mod.GetAttributeValue(sh, h, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_EC_POINT, nil)})
	if err != nil {
		return nil, err
	}
	point := attrs[0].Value
	// CKA_EC_POINT is a DER OCTET STRING; some modules give the bare point.
	var inner []byte
	if rest, err := asn1.Unmarshal(point, &inner); err == nil && len(rest) == 0 {
		point = inner
	}
	switch alg {
	case ECDSAP256:
		return ecdsa.ParseUncompressedPublicKey(elliptic.P256(), point)
	case Ed25519:
		if len(point) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("custody: the token's Ed25519 public key is %d bytes", len(point))
		}
		return ed25519.PublicKey(append([]byte(nil), point...)), nil
	}
	return nil, fmt.Errorf("%w: %q", ErrAlgorithm, alg)
}

// ref reads a reference and checks it names this custody's object of name
// in this token.
func (c *PKCS11) ref(name string, k Key) (PKCS11URI, error) {
	if !IsPKCS11Ref(k.Ref) {
		return PKCS11URI{}, ErrKey
	}
	u, err := ParsePKCS11URI(string(k.Ref))
	if err != nil || u.Token != c.t.uri.Token || u.Object != c.prefix+name || len(u.ID) == 0 {
		return PKCS11URI{}, ErrKey
	}
	return u, nil
}

func (t *Token) find(sh pkcs11.SessionHandle, class uint, u PKCS11URI) ([]pkcs11.ObjectHandle, error) {
	if err := t.mod.FindObjectsInit(sh, []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, class),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, u.Object),
		pkcs11.NewAttribute(pkcs11.CKA_ID, u.ID),
	}); err != nil {
		return nil, err
	}
	hs, _, err := t.mod.FindObjects(sh, 2)
	if ferr := t.mod.FindObjectsFinal(sh); err == nil {
		err = ferr
	}
	if err == nil && len(hs) == 0 {
		// A token removed under an open session (an HSM unplugged,
		// SoftHSM2's token directory gone) finds nothing, as for a
		// deleted object. Only a token still present makes it missing;
		// one that is gone is a lost session (do: retried, then
		// re-opened in the background), so the answer says the token
		// is unavailable, not that a key is lost and must be replaced.
		if terr := t.present(); terr != nil {
			return nil, terr
		}
	}
	return hs, err
}

func algOf(pub crypto.PublicKey) (Algorithm, error) {
	switch p := pub.(type) {
	case *ecdsa.PublicKey:
		if p.Curve == elliptic.P256() {
			return ECDSAP256, nil
		}
	case ed25519.PublicKey:
		return Ed25519, nil
	}
	return "", fmt.Errorf("%w: %T", ErrAlgorithm, pub)
}

// Signer finds the key's objects and checks the public one is k.Public
// and the private one can never leave the token.
func (c *PKCS11) Signer(ctx context.Context, name string, k Key) (crypto.Signer, error) {
	u, err := c.ref(name, k)
	if err != nil {
		return nil, err
	}
	alg, err := algOf(k.Public)
	if err != nil {
		return nil, err
	}
	err = c.t.do(ctx, func(sh pkcs11.SessionHandle) error {
		pubs, err := c.t.find(sh, pkcs11.CKO_PUBLIC_KEY, u)
		if err != nil {
			return err
		}
		privs, err := c.t.find(sh, pkcs11.CKO_PRIVATE_KEY, u)
		if err != nil {
			return err
		}
		if len(privs) == 0 {
			return keyMissing{u.String()}
		}
		if len(pubs) != 1 || len(privs) != 1 {
			return ErrKey
		}
		c.t.mu.Lock()
		hook := c.t.afterFind
		c.t.mu.Unlock()
		if hook != nil {
			hook()
		}
		pub, err := c.t.readPublic(sh, pubs[0], alg)
		if err != nil {
			return ErrKey
		}
		type equaler interface{ Equal(crypto.PublicKey) bool }
		if e, ok := pub.(equaler); !ok || !e.Equal(k.Public) {
			return ErrKey
		}
		attrs, err := c.t.mod.GetAttributeValue(sh, privs[0], []*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, nil),
			pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, nil),
		})
		if err != nil {
			return err
		}
		if !attrTrue(attrs[0]) || attrTrue(attrs[1]) {
			return fmt.Errorf("custody: PKCS#11 object %q can leave the token (CKA_SENSITIVE false or CKA_EXTRACTABLE true); muster signs only with keys that cannot", u.Object)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &p11Signer{c: c, u: u, pub: k.Public, alg: alg}, nil
}

// successorCommands is the way out of a key gone from the token with the
// running authority that signs with it (data: its --data value; not
// --config, which these online commands refuse): a successor made in the token and activated, the commands
// named for the key the object label is of (muster-ca/ROLE/SERIAL: that
// intermediate's role; muster-signer/vN: the task signer), with the data
// directory, so that they run pasted.
func successorCommands(object, data string) string {
	if rest, ok := strings.CutPrefix(object, "muster-ca/"); ok {
		if role, _, ok := strings.Cut(rest, "/"); ok && role != "" && shellword.Quote(role) == role {
			return "make its successor in the token and activate it: `muster ca rotate " + role + " --data " + data +
				"`, then, once it is published, `muster ca rotate " + role + " --activate --data " + data + "`"
		}
	}
	if strings.HasPrefix(object, "muster-signer/") {
		return "make its successor in the token and activate it: `muster signer stage --data " + data + "`, then `muster signer activate --data " + data + "`"
	}
	return "make its successor in the token and activate it (muster ca rotate ROLE --data " + data + ", then muster ca rotate ROLE --activate --data " + data +
		"; for a task signer, muster signer stage --data " + data + ", then muster signer activate --data " + data + ")"
}

// keyMissing is ErrKeyMissing for one object. It is ErrKey too: callers
// that only ask whether a reference opens see what they saw before.
type keyMissing struct{ uri string }

func (e keyMissing) Error() string { return ErrKeyMissing.Error() + ": " + e.uri }

func (e keyMissing) Is(target error) bool { return target == ErrKeyMissing || target == ErrKey }

func attrTrue(a *pkcs11.Attribute) bool { return len(a.Value) == 1 && a.Value[0] != 0 }

// Destroy deletes the key's objects from the token. Objects already gone
// are not an error.
func (c *PKCS11) Destroy(ctx context.Context, name string, k Key) error {
	_, err := c.DestroyFound(ctx, name, k)
	return err
}

// DestroyFound is Destroy, saying whether the private key object was
// there to delete.
func (c *PKCS11) DestroyFound(ctx context.Context, name string, k Key) (bool, error) {
	u, err := c.ref(name, k)
	if err != nil {
		return false, err
	}
	var found bool
	err = c.t.do(ctx, func(sh pkcs11.SessionHandle) error {
		for _, class := range []uint{pkcs11.CKO_PRIVATE_KEY, pkcs11.CKO_PUBLIC_KEY} {
			hs, err := c.t.find(sh, class, u)
			if err != nil {
				return err
			}
			if class == pkcs11.CKO_PRIVATE_KEY {
				found = len(hs) > 0
			}
			for _, h := range hs {
				if err := c.t.mod.DestroyObject(sh, h); err != nil {
					return err
				}
			}
		}
		return nil
	})
	return found, err
}

// p11Signer signs inside the token. The private key's handle is looked
// up for every signature: handles do not survive a re-opened token.
type p11Signer struct {
	c   *PKCS11
	u   PKCS11URI
	pub crypto.PublicKey
	alg Algorithm
}

func (s *p11Signer) Public() crypto.PublicKey { return s.pub }

// Sign signs a digest (ECDSA, returned ASN.1 DER as crypto/ecdsa does) or
// a whole message (Ed25519, pure: opts.HashFunc() must be 0).
func (s *p11Signer) Sign(_ io.Reader, data []byte, opts crypto.SignerOpts) ([]byte, error) {
	var mech uint
	switch s.alg {
	case ECDSAP256:
		mech = pkcs11.CKM_ECDSA
		if h := opts.HashFunc(); h != 0 && len(data) != h.Size() {
			return nil, fmt.Errorf("custody: digest is %d bytes, %v needs %d", len(data), h, h.Size())
		}
	case Ed25519:
		mech = ckmEdDSA
		if opts.HashFunc() != 0 {
			return nil, errors.New("custody: Ed25519 in the token signs whole messages only (no Ed25519ph)")
		}
		if o, ok := opts.(*ed25519.Options); ok && o.Context != "" {
			return nil, errors.New("custody: Ed25519 contexts are not supported")
		}
	}
	var sig []byte
	err := s.c.t.do(context.Background(), func(sh pkcs11.SessionHandle) error {
		hs, err := s.c.t.find(sh, pkcs11.CKO_PRIVATE_KEY, s.u)
		if err != nil {
			return err
		}
		if len(hs) != 1 {
			return fmt.Errorf("%w: object %q, token %q (deleted, or the token initialised again): restore the token from its backup, "+
				"or %s", ErrKeyMissing, s.u.Object, s.u.Token, successorCommands(s.u.Object, s.c.t.hintData()))
		}
		if err := s.c.t.mod.SignInit(sh, []*pkcs11.Mechanism{pkcs11.NewMechanism(mech, nil)}, hs[0]); err != nil {
			return err
		}
		sig, err = s.c.t.mod.Sign(sh, data)
		return err
	})
	if err != nil {
		return nil, err
	}
	if s.alg == Ed25519 {
		return sig, nil
	}
	return ecdsaDER(sig)
}

// ecdsaDER turns PKCS#11's r||s into the ASN.1 SEQUENCE crypto.Signer
// callers (crypto/x509) expect.
func ecdsaDER(raw []byte) ([]byte, error) {
	if len(raw) == 0 || len(raw)%2 != 0 {
		return nil, fmt.Errorf("custody: ECDSA signature from the token is %d bytes", len(raw))
	}
	n := len(raw) / 2
	return asn1.Marshal(struct{ R, S *big.Int }{new(big.Int).SetBytes(raw[:n]), new(big.Int).SetBytes(raw[n:])})
}

// module is the library to load.
func (c PKCS11Config) module(u PKCS11URI) (string, error) {
	if c.Module != "" {
		return c.Module, nil
	}
	if u.ModulePath != "" {
		return u.ModulePath, nil
	}
	return "", errors.New("custody: no PKCS#11 module: give --pkcs11-module PATH or module-path= in the URI")
}

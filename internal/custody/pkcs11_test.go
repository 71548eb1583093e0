//go:build pkcs11 && cgo

package custody_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/custody/softhsmtest"
)

func openToken(t *testing.T, sessions int) (*custody.Token, softhsmtest.Token) {
	t.Helper()
	tok := softhsmtest.Start(t)
	tk, err := custody.OpenPKCS11(custody.PKCS11Config{URI: tok.URI, Module: tok.Module, PINFile: tok.PINFile, Sessions: sessions})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tk.Close() })
	return tk, tok
}

func verify(t *testing.T, pub crypto.PublicKey, msg []byte, s crypto.Signer) {
	t.Helper()
	switch p := pub.(type) {
	case *ecdsa.PublicKey:
		sum := sha256.Sum256(msg)
		sig, err := s.Sign(rand.Reader, sum[:], crypto.SHA256)
		if err != nil {
			t.Fatal(err)
		}
		if !ecdsa.VerifyASN1(p, sum[:], sig) {
			t.Fatal("ECDSA signature from the token does not verify")
		}
	case ed25519.PublicKey:
		sig, err := s.Sign(rand.Reader, msg, crypto.Hash(0))
		if err != nil {
			t.Fatal(err)
		}
		if !ed25519.Verify(p, msg, sig) {
			t.Fatal("Ed25519 signature from the token does not verify")
		}
	default:
		t.Fatalf("public key %T", pub)
	}
}

func TestPKCS11CreateSignDestroy(t *testing.T) {
	ctx := context.Background()
	tk, tok := openToken(t, 0)
	c := tk.For("muster-test/")
	for _, alg := range []custody.Algorithm{custody.ECDSAP256, custody.Ed25519} {
		t.Run(string(alg), func(t *testing.T) {
			name := "key-" + string(alg)
			k, err := c.Create(ctx, name, alg)
			if err != nil {
				t.Fatal(err)
			}
			if !custody.IsPKCS11Ref(k.Ref) || !strings.Contains(string(k.Ref), "object=muster-test%2F"+name) {
				t.Fatalf("reference %q does not name the token object", k.Ref)
			}
			s, err := c.Signer(ctx, name, k)
			if err != nil {
				t.Fatal(err)
			}
			verify(t, k.Public, []byte("muster"), s)

			// Another replica opening the same token finds the key by
			// its reference alone.
			other, err := custody.OpenPKCS11(custody.PKCS11Config{URI: tok.URI, Module: tok.Module, PINFile: tok.PINFile})
			if err != nil {
				t.Fatal(err)
			}
			rs, err := other.For("muster-test/").Signer(ctx, name, custody.Key{Public: k.Public, Ref: k.Ref})
			if err != nil {
				t.Fatal(err)
			}
			verify(t, k.Public, []byte("replica"), rs)
			other.Close()

			if err := c.Destroy(ctx, name, k); err != nil {
				t.Fatal(err)
			}
			// Missing, said so (the operator's way out differs from a
			// reference that opens to another key), and still ErrKey
			// for callers that only ask whether it opens.
			if _, err := c.Signer(ctx, name, k); !errors.Is(err, custody.ErrKeyMissing) || !errors.Is(err, custody.ErrKey) {
				t.Fatalf("signer of a destroyed key: %v, want ErrKeyMissing and ErrKey", err)
			}
			if err := c.Destroy(ctx, name, k); err != nil {
				t.Fatalf("destroying twice: %v", err)
			}
		})
	}
}

// A certificate signed by a token key verifies: the r||s signature is
// turned into the ASN.1 crypto/x509 needs.
func TestPKCS11SignsCertificates(t *testing.T) {
	ctx := context.Background()
	tk, _ := openToken(t, 0)
	c := tk.For("muster-ca/")
	k, s := createSigner(ctx, t, c, "agent/01", custody.ECDSAP256)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "token CA"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, k.Public, s)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	if err := cert.CheckSignatureFrom(cert); err != nil {
		t.Fatal(err)
	}
}

func TestPKCS11RefusesForeignReferences(t *testing.T) {
	ctx := context.Background()
	tk, _ := openToken(t, 0)
	c := tk.For("muster-ca/")
	signers := tk.For("muster-signer/")
	k, err := c.Create(ctx, "server/aa", custody.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := c.Create(ctx, "server/bb", custody.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	sealed, _ := custody.NewSealedCA(storageKey(t, 1))
	sk, _ := sealed.Create(ctx, "server/aa", custody.ECDSAP256)
	for name, try := range map[string]func() error{
		"another name":   func() error { _, err := c.Signer(ctx, "server/bb", k); return err },
		"another prefix": func() error { _, err := signers.Signer(ctx, "server/aa", k); return err },
		"another public key": func() error {
			_, err := c.Signer(ctx, "server/aa", custody.Key{Public: k2.Public, Ref: k.Ref})
			return err
		},
		"a sealed reference": func() error { _, err := c.Signer(ctx, "server/aa", sk); return err },
		"another token": func() error {
			_, err := c.Signer(ctx, "server/aa", custody.Key{Public: k.Public, Ref: []byte(strings.Replace(string(k.Ref), "token=muster", "token=other", 1))})
			return err
		},
	} {
		if err := try(); !errors.Is(err, custody.ErrKey) {
			t.Errorf("%s: got %v, want ErrKey", name, err)
		}
	}
}

// Many signatures at once share a pool smaller than the callers.
func TestPKCS11ConcurrentSigning(t *testing.T) {
	ctx := context.Background()
	tk, _ := openToken(t, 3)
	c := tk.For("muster-test/")
	ek, err := c.Create(ctx, "ec", custody.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	edk, err := c.Create(ctx, "ed", custody.Ed25519)
	if err != nil {
		t.Fatal(err)
	}
	es, err := c.Signer(ctx, "ec", ek)
	if err != nil {
		t.Fatal(err)
	}
	eds, err := c.Signer(ctx, "ed", edk)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Go(func() {
			msg := []byte{byte(i)}
			if i%2 == 0 {
				verify(t, ek.Public, msg, es)
			} else {
				verify(t, edk.Public, msg, eds)
			}
		})
	}
	wg.Wait()
}

// Sessions closed under the authority (a token pulled and put back) are
// re-opened, logged in again, and the signature made: no crash, no error.
func TestPKCS11ReopensLostSessions(t *testing.T) {
	ctx := context.Background()
	tk, _ := openToken(t, 2)
	c := tk.For("muster-test/")
	k, s := createSigner(ctx, t, c, "ed", custody.Ed25519)
	for range 3 {
		if err := tk.DropSessions(); err != nil {
			t.Fatal(err)
		}
		verify(t, k.Public, []byte("after"), s)
		if err := tk.Ready(); err != nil {
			t.Fatalf("Ready after re-opening: %v", err)
		}
	}
}

// pkcs11-tool, reading the token independently, sees the private keys
// muster made as sensitive and never extractable.
func TestPKCS11KeysAreNotExtractable(t *testing.T) {
	ctx := context.Background()
	tk, tok := openToken(t, 0)
	c := tk.For("muster-test/")
	for _, alg := range []custody.Algorithm{custody.ECDSAP256, custody.Ed25519} {
		if _, err := c.Create(ctx, string(alg), alg); err != nil {
			t.Fatal(err)
		}
	}
	tool, err := exec.LookPath("pkcs11-tool")
	if err != nil {
		t.Fatalf("pkcs11-tool (package opensc): %v", err)
	}
	out, err := exec.Command(tool, "--module", tok.Module, "--token-label", softhsmtest.Label, "--login", "--pin", softhsmtest.PIN,
		"--list-objects", "--type", "privkey").CombinedOutput()
	if err != nil {
		t.Fatalf("pkcs11-tool: %v\n%s", err, out)
	}
	objs := strings.Split(string(out), "Private Key Object")[1:]
	if len(objs) != 2 {
		t.Fatalf("pkcs11-tool lists %d private keys, want 2:\n%s", len(objs), out)
	}
	for _, o := range objs {
		if !strings.Contains(o, "never extractable") || !strings.Contains(o, "sensitive") || !strings.Contains(o, "local") {
			t.Errorf("private key not sensitive, never extractable and generated in the token:\n%s", o)
		}
	}
}

func TestPKCS11RefusesAnOpenPINFileAndAWrongPIN(t *testing.T) {
	tok := softhsmtest.Start(t)
	open := filepath.Join(t.TempDir(), "pin")
	if err := os.WriteFile(open, []byte(softhsmtest.PIN), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := custody.OpenPKCS11(custody.PKCS11Config{URI: tok.URI, Module: tok.Module, PINFile: open}); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("PIN file readable by others: %v", err)
	}
	t.Setenv(custody.PINEnv, "0000")
	// Refused to a command (init, migrate-custody, admin add --offline)
	// as to an authority: the way out is a PIN, not an authority restart.
	if _, err := custody.OpenPKCS11(custody.PKCS11Config{URI: tok.URI, Module: tok.Module}); err == nil || !strings.Contains(err.Error(), "PIN is wrong") ||
		!strings.Contains(err.Error(), "--pkcs11-pin-file FILE, or "+custody.PINEnv) {
		t.Errorf("wrong PIN: %v", err)
	}
	t.Setenv(custody.PINEnv, softhsmtest.PIN)
	tk, err := custody.OpenPKCS11(custody.PKCS11Config{URI: tok.URI, Module: tok.Module})
	if err != nil {
		t.Fatalf("PIN from %s: %v", custody.PINEnv, err)
	}
	tk.Close()
}

// Sessions lost while the token is out: signing fails with
// ErrUnavailable and Ready says why, without a crash, until the
// background re-open (with backoff) finds the token again. DropSessions
// in a loop stands for a token that keeps failing.
func TestPKCS11TokenDownIsReportedAndReopened(t *testing.T) {
	ctx := context.Background()
	tk, _ := openToken(t, 2)
	c := tk.For("muster-test/")
	k, s := createSigner(ctx, t, c, "ec", custody.ECDSAP256)
	tk.SetOpenFails(true)
	if err := tk.DropSessions(); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("down"))
	if _, err := s.Sign(rand.Reader, sum[:], crypto.SHA256); !errors.Is(err, custody.ErrUnavailable) {
		t.Fatalf("signing with the token unusable: %v, want ErrUnavailable", err)
	}
	if err := tk.Ready(); err == nil || !errors.Is(err, custody.ErrUnavailable) {
		t.Fatalf("Ready while the token cannot be opened: %v", err)
	}
	time.Sleep(300 * time.Millisecond) // a few failed re-opens
	if tk.Ready() == nil {
		t.Fatal("re-opened while the token was out")
	}
	tk.SetOpenFails(false)
	deadline := time.Now().Add(20 * time.Second)
	for tk.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("the token was not re-opened: %v", tk.Ready())
		}
		time.Sleep(50 * time.Millisecond)
	}
	verify(t, k.Public, []byte("back"), s)
}

// A PIN the token refuses after a lost session is tried once and never
// again (an HSM locks the PIN after a few wrong ones): the token stays
// reported down and says to restart with the right PIN.
func TestPKCS11WrongPINIsNotRetried(t *testing.T) {
	ctx := context.Background()
	tk, _ := openToken(t, 2)
	c := tk.For("muster-test/")
	_, s := createSigner(ctx, t, c, "ed", custody.Ed25519)
	if err := tk.DropSessions(); err != nil {
		t.Fatal(err)
	}
	tk.SetPIN("9999")
	if _, err := s.Sign(rand.Reader, []byte("m"), crypto.Hash(0)); !errors.Is(err, custody.ErrUnavailable) {
		t.Fatalf("signing after the PIN was refused: %v, want ErrUnavailable", err)
	}
	tk.SetPIN(softhsmtest.PIN)
	time.Sleep(500 * time.Millisecond)
	if err := tk.Ready(); err == nil || !strings.Contains(err.Error(), "restarted with the right PIN") {
		t.Fatalf("Ready after a refused PIN: %v", err)
	}
	if _, err := s.Sign(rand.Reader, []byte("m"), crypto.Hash(0)); err == nil {
		t.Fatal("logged in again after the token refused the PIN")
	}
}

// TestPKCS11DeletedObjectIsKeyMissing: an object deleted from the token
// under a running authority (by hand, or the token initialised again) is
// ErrKeyMissing, which the service layer answers UNAVAILABLE so agents
// retry rather than stop, and whose message names the way out.
func TestPKCS11DeletedObjectIsKeyMissing(t *testing.T) {
	ctx := context.Background()
	tk, tok := openToken(t, 0)
	c := tk.For("muster-test/")
	_, s := createSigner(ctx, t, c, "ec", custody.ECDSAP256)
	tool, err := exec.LookPath("pkcs11-tool")
	if err != nil {
		t.Fatalf("pkcs11-tool (package opensc): %v", err)
	}
	if out, err := exec.Command(tool, "--module", tok.Module, "--token-label", softhsmtest.Label, "--login", "--pin", softhsmtest.PIN,
		"--delete-object", "--type", "privkey", "--label", "muster-test/ec").CombinedOutput(); err != nil {
		t.Fatalf("pkcs11-tool --delete-object: %v\n%s", err, out)
	}
	sum := sha256.Sum256([]byte("gone"))
	_, err = s.Sign(rand.Reader, sum[:], crypto.SHA256)
	if !errors.Is(err, custody.ErrKeyMissing) {
		t.Fatalf("signing with a deleted object: %v, want ErrKeyMissing", err)
	}
	if !strings.Contains(err.Error(), "muster ca rotate ROLE --activate") {
		t.Errorf("the error names no way out: %v", err)
	}
	if tk.Ready() != nil {
		t.Errorf("the token itself is still usable, but Ready says %v", tk.Ready())
	}
}

// TestPKCS11TokenInitialisedAgainIsReopened: the token deleted and
// initialised again (same label, same PIN) under a running authority. Its
// keys are gone, but the token is back: the background re-open must reach
// it, so that the successors the operator makes there (muster ca rotate)
// can be made and used without restarting the authority.
func TestPKCS11TokenInitialisedAgainIsReopened(t *testing.T) {
	ctx := context.Background()
	tk, tok := openToken(t, 2)
	c := tk.For("muster-test/")
	_, s := createSigner(ctx, t, c, "ec", custody.ECDSAP256)
	for _, args := range [][]string{
		{"--delete-token", "--token", softhsmtest.Label},
		{"--init-token", "--free", "--label", softhsmtest.Label, "--pin", softhsmtest.PIN, "--so-pin", softhsmtest.SOPIN},
	} {
		if out, err := tok.Command("softhsm2-util", args...).CombinedOutput(); err != nil {
			t.Fatalf("softhsm2-util %v: %v\n%s", args, err, out)
		}
	}
	sum := sha256.Sum256([]byte("gone"))
	if _, err := s.Sign(rand.Reader, sum[:], crypto.SHA256); err == nil {
		t.Fatal("signed with a key of the token deleted")
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		k2, err := c.Create(ctx, "ec2", custody.ECDSAP256)
		if err == nil {
			s2, err := c.Signer(ctx, "ec2", k2)
			if err != nil {
				t.Fatal(err)
			}
			verify(t, k2.Public, []byte("back"), s2)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the token initialised again is not reached: %v (Ready: %v)", err, tk.Ready())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPKCS11RemovedTokenIsUnavailableNotKeyMissing: a token removed under
// open sessions (SoftHSM2's token directory moved out, as an HSM
// unplugged) is ErrUnavailable, re-opened in the background, and signs
// again once it is back, not ErrKeyMissing, whose way out (a new
// intermediate, a restored backup) an operator would follow for a token
// that only has to be put back.
func TestPKCS11RemovedTokenIsUnavailableNotKeyMissing(t *testing.T) {
	ctx := context.Background()
	tk, tok := openToken(t, 0)
	c := tk.For("muster-test/")
	_, s := createSigner(ctx, t, c, "ec", custody.ECDSAP256)
	tokens := filepath.Join(filepath.Dir(tok.Conf), "tokens")
	entries, err := os.ReadDir(tokens)
	if err != nil || len(entries) != 1 {
		t.Fatalf("the token directory %s: %v, %d entries", tokens, err, len(entries))
	}
	in, away := filepath.Join(tokens, entries[0].Name()), filepath.Join(filepath.Dir(tok.Conf), "away")
	if err := os.Rename(in, away); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("away"))
	_, err = s.Sign(rand.Reader, sum[:], crypto.SHA256)
	if !errors.Is(err, custody.ErrUnavailable) || errors.Is(err, custody.ErrKeyMissing) {
		t.Fatalf("signing with the token removed: %v, want ErrUnavailable", err)
	}
	if err := os.Rename(away, in); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		if _, err = s.Sign(rand.Reader, sum[:], crypto.SHA256); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the token put back does not sign within 90 s: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// createSigner creates the key name on c and opens its signer, failing
// the test if either step fails.
func createSigner(ctx context.Context, t *testing.T, c *custody.PKCS11, name string, alg custody.Algorithm) (custody.Key, crypto.Signer) {
	t.Helper()
	k, err := c.Create(ctx, name, alg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Signer(ctx, name, k)
	if err != nil {
		t.Fatal(err)
	}
	return k, s
}

// TestPKCS11RemovedTokenLookupIsUnavailableNotErrKey: the token's
// directory moved away right after a key was made in it (muster ca
// prepare, then the token gone as the authority reads the new
// intermediate), at the worst moment: after the lookup found the key's
// objects, before it read them, so their handles are invalid. Looking the
// key up is ErrUnavailable, whose way out is to put the token back, not
// ErrKey, which says the stored reference does not match its key.
func TestPKCS11RemovedTokenLookupIsUnavailableNotErrKey(t *testing.T) {
	ctx := context.Background()
	tk, tok := openToken(t, 0)
	c := tk.For("muster-test/")
	k, err := c.Create(ctx, "ec", custody.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(filepath.Dir(tok.Conf), "tokens")
	entries, err := os.ReadDir(tokens)
	if err != nil || len(entries) != 1 {
		t.Fatalf("the token directory %s: %v, %d entries", tokens, err, len(entries))
	}
	in, away := filepath.Join(tokens, entries[0].Name()), filepath.Join(filepath.Dir(tok.Conf), "away")
	var once sync.Once
	tk.SetAfterFind(func() {
		once.Do(func() {
			if err := os.Rename(in, away); err != nil {
				t.Error(err)
			}
		})
	})
	_, err = c.Signer(ctx, "ec", k)
	tk.SetAfterFind(nil)
	if !errors.Is(err, custody.ErrUnavailable) || errors.Is(err, custody.ErrKey) {
		t.Fatalf("looking the key up with the token removed: %v, want ErrUnavailable and not ErrKey", err)
	}
	if err := os.Rename(away, in); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		s, err := c.Signer(ctx, "ec", k)
		if err == nil {
			verify(t, k.Public, []byte("back"), s)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the token put back does not open the key within 90 s: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestPKCS11DeletedObjectNamesPasteableSuccessors: the way out of a key
// gone from the token under a running authority names the commands for
// that key (an intermediate's role from its label, or the task signer)
// with the authority's directory (NameDataDir), so that they run pasted;
// before, they said muster ca rotate ROLE and muster signer stage without
// --data, which open ./muster-data, not the authority's directory.
func TestPKCS11DeletedObjectNamesPasteableSuccessors(t *testing.T) {
	ctx := context.Background()
	tk, tok := openToken(t, 0)
	tk.NameDataDir("'/var/lib/muster/my authority'")
	const data = "--data '/var/lib/muster/my authority'"
	for _, tc := range []struct {
		prefix, name string
		want         []string
	}{
		{"muster-ca/", "agent/1f", []string{"`muster ca rotate agent " + data + "`", "`muster ca rotate agent --activate " + data + "`"}},
		{"muster-signer/", "v2", []string{"`muster signer stage " + data + "`", "`muster signer activate " + data + "`"}},
	} {
		t.Run(tc.prefix, func(t *testing.T) {
			c := tk.For(tc.prefix)
			_, s := createSigner(ctx, t, c, tc.name, custody.Ed25519)
			if out, err := tok.Command("pkcs11-tool", "--module", tok.Module, "--token-label", softhsmtest.Label, "--login", "--pin", softhsmtest.PIN,
				"--delete-object", "--type", "privkey", "--label", tc.prefix+tc.name).CombinedOutput(); err != nil {
				t.Fatalf("pkcs11-tool --delete-object: %v\n%s", err, out)
			}
			_, err := s.Sign(rand.Reader, []byte("gone"), crypto.Hash(0))
			if !errors.Is(err, custody.ErrKeyMissing) {
				t.Fatalf("signing with a deleted object: %v, want ErrKeyMissing", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v\ndoes not name %s", err, w)
				}
			}
			if strings.Contains(err.Error(), "DIR") || strings.Contains(err.Error(), "ROLE") {
				t.Errorf("%v\nnames a placeholder", err)
			}
		})
	}
}

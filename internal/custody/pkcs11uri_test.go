package custody_test

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/custody"
)

func TestPKCS11URI(t *testing.T) {
	u, err := custody.ParsePKCS11URI("pkcs11:token=my%20hsm;object=muster-ca%2Fagent%2F1f;id=%01%ff;type=private?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/etc/muster/pin")
	if err != nil {
		t.Fatal(err)
	}
	if u.Token != "my hsm" || u.Object != "muster-ca/agent/1f" || !bytes.Equal(u.ID, []byte{1, 0xff}) || u.Type != "private" ||
		u.ModulePath != "/usr/lib/softhsm/libsofthsm2.so" || u.PINSource != "/etc/muster/pin" {
		t.Fatalf("parsed %+v", u)
	}
	back, err := custody.ParsePKCS11URI(u.String())
	if err != nil {
		t.Fatal(err)
	}
	if back.String() != u.String() {
		t.Fatalf("round trip: %s != %s", back, u)
	}
	for _, bad := range []string{"token=x", "pkcs11:object=x", "pkcs11:token=x?pin-value=1234", "pkcs11:token=x;slot=1", "pkcs11:token=%zz"} {
		if _, err := custody.ParsePKCS11URI(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := custody.ParsePKCS11URI("pkcs11:token=x?pin-value=1234"); err == nil || !strings.Contains(err.Error(), custody.PINEnv) {
		t.Errorf("pin-value refusal does not say what to do instead: %v", err)
	}
}

// The static build says which build it needs; the pkcs11 build opens.
func TestOpenPKCS11WithoutTheBuild(t *testing.T) {
	_, err := custody.OpenPKCS11(custody.PKCS11Config{URI: "pkcs11:token=none", Module: "/nonexistent.so", PINFile: "/nonexistent"})
	if custody.PKCS11Build {
		if err == nil {
			t.Fatal("opened a nonexistent module")
		}
		return
	}
	if err != custody.ErrNoPKCS11Build || !strings.Contains(err.Error(), "pkcs11 custody needs the pkcs11 build") || !strings.Contains(err.Error(), "/usr/bin/muster-pkcs11") {
		t.Fatalf("got %v", err)
	}
}

// TestReadPINFromTheEnvironmentRemovesIt: a PIN given in MUSTER_PKCS11_PIN
// is read once and leaves the environment, so no process started from
// the authority (a helper a vendor's module runs) inherits it.
func TestReadPINFromTheEnvironmentRemovesIt(t *testing.T) {
	t.Setenv(custody.PINEnv, "s3cret-4711")
	pin, err := custody.PKCS11Config{}.ReadPIN(custody.PKCS11URI{Token: "muster"})
	if err != nil || pin != "s3cret-4711" {
		t.Fatalf("ReadPIN = %q, %v", pin, err)
	}
	if v, ok := os.LookupEnv(custody.PINEnv); ok {
		t.Errorf("%s is still in the environment (%d bytes)", custody.PINEnv, len(v))
	}
	out, err := exec.Command("env").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "s3cret-4711") {
		t.Error("a child process inherits the PIN")
	}
}

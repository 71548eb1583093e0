//go:build pkcs11 && cgo

package e2e

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestPKCS11BreakGlassAcrossARootRotation: with the CA keys in a SoftHSM2
// token, a root rotation makes its new root in the token; in
// update_servers (the admin intermediate under the new root) break-glass,
// muster admin add NAME --offline, the way out every expired operator is
// told of, issues an identity that the authority accepts. It used to be
// refused in every phase from init on: the new root's key "does not open
// with the data directory's storage key", as it was looked for sealed.
func TestPKCS11BreakGlassAcrossARootRotation(t *testing.T) {
	t.Parallel()
	_, env, dir := initCustody(t)
	p, rec := startProcEnv(t, "authority", "authority started", env,
		"authority", "--data", dir, "--listen", freePort(t), "--metrics-listen", "127.0.0.1:0", "--log-format", "json")
	p.addr, _ = rec["advertise"].(string)

	breakGlass := func(phase string) {
		t.Helper()
		out := filepath.Join(t.TempDir(), "alice.pem")
		if r := muster(t, env, "admin", "add", "alice", "--offline", "--data", dir, "--out", out); r.code != 0 {
			t.Fatalf("in %s, admin add --offline: exit %d\n%s", phase, r.code, r.stderr)
		}
		r := muster(t, nil, "status", "--data", dir, "--identity", out)
		if r.code != 0 || !strings.Contains(r.stdout, "/admin/alice") {
			t.Fatalf("in %s, the break-glass identity: exit %d\n%s%s", phase, r.code, r.stdout, r.stderr)
		}
	}
	if st := caRoot(t, dir, "rotate"); st.Phase != "init" {
		t.Fatalf("after rotate: %+v", st)
	}
	breakGlass("init")
	caRoot(t, dir, "next-phase")
	if st := caRoot(t, dir, "next-phase"); st.Phase != "update_servers" {
		t.Fatalf("next-phase to update_servers: %+v", st)
	}
	breakGlass("update_servers")
}

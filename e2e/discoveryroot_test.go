package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/discovery"
	"github.com/muster-dev/muster/internal/discoveryclient"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// discoveryRoots is what muster discovery lookup lists for the authority:
// the root its ID is locked to, and the roots agents may pin now.
func (e *referralEnv) discoveryRoots(t *testing.T) (locked string, roots []string) {
	t.Helper()
	out := mustRun(t, "discovery", "lookup", e.authorityID, "--discovery", e.disc.addr, "--discovery-fingerprint", e.disc.fingerprint, "-o", "json")
	var l struct {
		CAFingerprint    string   `json:"ca_fingerprint"`
		RootFingerprints []string `json:"root_fingerprints"`
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("discovery lookup -o json printed %q: %v", out, err)
	}
	return l.CAFingerprint, l.RootFingerprints
}

// waitDiscoveryRoots waits until discovery lists want as the roots
// agents may pin (the leader registers within seconds of a phase change).
func (e *referralEnv) waitDiscoveryRoots(t *testing.T, phase string, want ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		locked, roots := e.discoveryRoots(t)
		if locked != e.fingerprint {
			t.Fatalf("%s: discovery lists the authority locked to %s; want the root its ID names, %s", phase, locked, e.fingerprint)
		}
		if slices.Equal(roots, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: 30 s on, discovery lists roots %v; want %v\nauthority:\n%s", phase, roots, want, e.auth.Logs())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestDiscoveryFollowsRootRotation: an authority registered with discovery
// goes through a root rotation, every phase and back from each; in every
// phase discovery lists the roots agents may pin (through the
// cross-certificate from the root the ID is locked to, which stays the
// lock), referral tickets are issued and a PSK join through discovery
// pinned to each trusted root is admitted; in standby a join pinned to
// the old root is refused at the lookup, before anything is sent, and an
// agent that joined through discovery renews. A registration signed with
// the authority's own policy key that names a root its root never
// certified is refused, audited in discovery's chain, and changes nothing.
func TestDiscoveryFollowsRootRotation(t *testing.T) {
	t.Parallel()
	e := newReferralEnv(t, "")
	oldFP := e.fingerprint
	e.waitDiscoveryRoots(t, "before the rotation", oldFP)

	n := 0
	join := func(phase, fp string) (string, result) {
		t.Helper()
		n++
		adir := filepath.Join(t.TempDir(), "a"+strconv.Itoa(n))
		return adir, muster(t, []string{"MUSTER_BOOTSTRAP_PSK=" + e.psk}, "agent", "join", "--data", adir, "--node", "d"+strconv.Itoa(n),
			"--discovery", e.disc.addr, "--discovery-fingerprint", e.disc.fingerprint, "--authority-id", e.authorityID, "--ca-fingerprint", fp)
	}
	mustJoin := func(phase string, fps ...string) string {
		t.Helper()
		var adir string
		for _, fp := range fps {
			var r result
			if adir, r = join(phase, fp); r.code != 0 {
				t.Fatalf("%s: PSK join through discovery pinned to %s: exit %d\n%s\nauthority:\n%s", phase, fp, r.code, r.stderr, e.auth.Logs())
			}
		}
		return adir
	}
	step := func(cmd, want string) {
		t.Helper()
		if st := caRoot(t, e.dir, cmd); st.Phase != want {
			t.Fatalf("%s: phase %s, want %s", cmd, st.Phase, want)
		}
	}

	st := caRoot(t, e.dir, "rotate")
	newFP := st.NewRoot.Fingerprint
	e.waitDiscoveryRoots(t, "init", oldFP, newFP)
	early := mustJoin("init", oldFP, newFP)

	step("next-phase", "update_agents")
	e.waitDiscoveryRoots(t, "update_agents", oldFP, newFP)
	mustJoin("update_agents", oldFP, newFP)
	step("rollback", "init")
	e.waitDiscoveryRoots(t, "init after a rollback", oldFP, newFP)
	step("next-phase", "update_agents")

	step("next-phase", "update_servers")
	e.waitDiscoveryRoots(t, "update_servers", newFP, oldFP)
	mustJoin("update_servers", newFP, oldFP)
	step("rollback", "update_agents")
	e.waitDiscoveryRoots(t, "update_agents after a rollback", oldFP, newFP)
	mustJoin("update_agents after a rollback", oldFP)
	step("next-phase", "update_servers")
	e.waitDiscoveryRoots(t, "update_servers again", newFP, oldFP)
	// Every agent renews once in update_servers, under the new root.
	mustRun(t, "agent", "renew", "--data", early)

	mustRun(t, "admin", "renew", "--data", e.dir)
	step("next-phase", "standby")
	e.waitDiscoveryRoots(t, "standby", newFP)
	late := mustJoin("standby", newFP)
	if _, r := join("standby", oldFP); r.code == 0 || !strings.Contains(r.stderr, "discovery lists authority "+e.authorityID+" with root "+newFP) ||
		!strings.Contains(r.stderr, "nothing was sent") {
		t.Fatalf("standby: a join through discovery pinned to the old root: exit %d\n%s; want refused at the lookup", r.code, r.stderr)
	}
	step("rollback", "update_servers")
	e.waitDiscoveryRoots(t, "update_servers after a rollback from standby", newFP, oldFP)
	mustJoin("update_servers after a rollback from standby", oldFP)
	step("next-phase", "standby")
	e.waitDiscoveryRoots(t, "standby again", newFP)
	// Agents that learned the authority from discovery pin what it proved:
	// one joined in init (renewed in update_servers) renews in standby, as
	// does one of standby.
	for _, adir := range []string{early, late} {
		mustRun(t, "agent", "renew", "--data", adir)
	}

	// The authority's own policy key, a root of someone else's: refused.
	h, err := ca.Load(filepath.Join(e.dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := ca.NewSerial()
	stranger, err := ca.NewRoot("prod", serial, key, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	look := func() *musterv1.LookupAuthorityResponse {
		conn, err := discoveryclient.Dial(e.disc.addr, e.disc.fingerprint)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		l, err := musterv1.NewDiscoveryServiceClient(conn).LookupAuthority(context.Background(), &musterv1.LookupAuthorityRequest{AuthorityId: e.authorityID})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	before := look()
	reg := discovery.Registration{AuthorityID: e.authorityID, Endpoints: []string{e.auth.addr},
		CABundlePEM: string(append(ca.EncodeCertPEM(h.Root), ca.EncodeCertPEM(stranger)...)),
		Policy:      json.RawMessage(before.GetPolicyJson()), Version: before.GetVersion() + 1,
		PolicyCertificatePEM: string(ca.EncodeCertPEM(h.Issuer(ca.RolePolicy).Cert))}
	_, sig, err := reg.Sign(h.Issuer(ca.RolePolicy).Key)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := discoveryclient.Dial(e.disc.addr, e.disc.fingerprint)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = musterv1.NewDiscoveryServiceClient(conn).RegisterAuthority(context.Background(), &musterv1.RegisterAuthorityRequest{
		AuthorityId: reg.AuthorityID, Endpoints: reg.Endpoints, CaBundlePem: reg.CABundlePEM, PolicyJson: string(reg.Policy),
		Version: reg.Version, PolicyCertificatePem: reg.PolicyCertificatePEM, Signature: sig})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "only through a cross-certificate from the root it is locked to, "+oldFP) {
		t.Fatalf("a registration naming a root its root never certified: %v", err)
	}
	if after := look(); after.GetVersion() != before.GetVersion() || after.GetCaBundlePem() != before.GetCaBundlePem() {
		t.Errorf("the refused registration changed what discovery serves: version %d -> %d", before.GetVersion(), after.GetVersion())
	}
	e.waitDiscoveryRoots(t, "after the refused registration", newFP)
	out := mustRun(t, "discovery", "audit", "list", "--data", e.discDir, "--action", "authority.register", "-o", "json")
	var recs []struct {
		Result string `json:"result"`
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal([]byte(out), &recs); err != nil {
		t.Fatalf("discovery audit list -o json: %v\n%s", err, out)
	}
	refused, registered := 0, 0
	for _, r := range recs {
		switch {
		case r.Result != "ok" && strings.Contains(r.Reason, ca.Fingerprint(stranger)):
			refused++
		case r.Result == "ok" && strings.Contains(r.Reason, "root "+oldFP):
			registered++
		}
	}
	if refused != 1 || registered < 8 {
		t.Errorf("discovery audited %d refusals naming the stranger root (want 1) and %d registrations under the locked root (want one a phase)\n%s", refused, registered, out)
	}
	if m := metricsOf(t, e.disc.metrics); !strings.Contains(m, `muster_discovery_registrations_total{result="root_not_linked"} 1`) {
		t.Errorf("discovery's metrics do not count the refusal:\n%s", m)
	}
}

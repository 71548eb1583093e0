package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/shellword"
)

// TestOperatorIdentityLifecycle: an operator identity renews itself before
// it expires (admin renew: new key, same name, the file replaced 0600,
// audited), is warned about on every admin command as its end nears, and
// once expired is refused with the break-glass command named, which brings
// it back (admin add --offline beside the running authority) with the
// audit chain intact.
func TestOperatorIdentityLifecycle(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	a := startAuthority(t, dir)
	bob := filepath.Join(t.TempDir(), "bob.pem")
	mustRun(t, "admin", "add", "bob", "--ttl", "1h", "--out", bob, "--data", dir)

	// Within 7 days of its end: status says so, and every admin command
	// warns on standard error.
	r := muster(t, nil, "status", "--identity", bob, "--data", dir)
	if r.code != 0 || !strings.Contains(r.stdout, "Warning:") || !strings.Contains(r.stderr, "renew it with muster admin renew") {
		t.Fatalf("status with an identity expiring in 1h: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	// A shell prompt is no place for it: completion stays silent.
	if r := muster(t, nil, "__complete", "agents", "show", "--identity", bob, "--data", dir, ""); r.code != 0 || strings.Contains(r.stderr, "warning") {
		t.Errorf("completion with an identity expiring in 1h: exit %d, stderr %s", r.code, r.stderr)
	}
	if r := muster(t, nil, "status", "--data", dir); r.code != 0 || strings.Contains(r.stderr, "warning") || strings.Contains(r.stdout, "Warning:") {
		t.Fatalf("status with a 30-day identity warns: stdout %s stderr %s", r.stdout, r.stderr)
	}
	// The renewal the warning names, pasted as it is, renews bob.pem, not
	// the data directory's operator.pem (it once named a bare `muster admin
	// renew`, which renewed the first operator's identity instead).
	_, pasted, ok := strings.Cut(strings.SplitN(r.stderr, "\n", 2)[0], "renew it with muster ")
	if !ok {
		t.Fatal("the warning names no renewal")
	}
	adminBefore, err := identity.Load(filepath.Join(dir, "operator.pem"))
	if err != nil {
		t.Fatal(err)
	}
	bobBefore, err := identity.Load(bob)
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, strings.Fields(pasted)...)
	if adminAfter, err := identity.Load(filepath.Join(dir, "operator.pem")); err != nil || adminAfter.Leaf().SerialNumber.Cmp(adminBefore.Leaf().SerialNumber) != 0 {
		t.Errorf("the pasted %q renewed operator.pem (%v)", pasted, err)
	}
	if bobAfter, err := identity.Load(bob); err != nil || bobAfter.Leaf().SerialNumber.Cmp(bobBefore.Leaf().SerialNumber) == 0 {
		t.Errorf("the pasted %q did not renew bob.pem (%v)", pasted, err)
	}

	// Renewal: a new key and serial under the same name, in the same file.
	before, err := identity.Load(bob)
	if err != nil {
		t.Fatal(err)
	}
	var renewed map[string]any
	if err := json.Unmarshal([]byte(mustRun(t, "admin", "renew", "--identity", bob, "--ttl", "6s", "--data", dir, "-o", "json")), &renewed); err != nil {
		t.Fatal(err)
	}
	after, err := identity.Load(bob)
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(bob); fi.Mode().Perm() != 0o600 {
		t.Errorf("renewed identity has mode %v, want 0600", fi.Mode().Perm())
	}
	if identity.SamePublicKey(before.Key.Public(), after.Key.Public()) || after.Leaf().SerialNumber.Text(16) != renewed["serial"] {
		t.Errorf("renew kept the key or wrote another serial than it printed (%v)", renewed)
	}
	if after.Leaf().Subject.CommonName != "bob" || !strings.HasSuffix(renewed["spiffe_id"].(string), "/admin/bob") {
		t.Errorf("renew changed the name: %v", renewed)
	}
	if out := mustRun(t, "status", "--identity", bob, "--data", dir); !strings.Contains(out, "/admin/bob") {
		t.Errorf("status with the renewed identity: %s", out)
	}
	// The first operator renews its operator.pem in place.
	mustRun(t, "admin", "renew", "--data", dir)
	mustRun(t, "admin", "list", "--data", dir)

	// Expired: refused, with the way back named.
	time.Sleep(time.Until(after.Leaf().NotAfter.Add(time.Second)))
	r = muster(t, nil, "status", "--identity", bob, "--data", dir)
	if r.code == 0 || !strings.Contains(r.stderr, "UNAUTHENTICATED") || !strings.Contains(r.stderr, "muster admin add bob --offline --data "+shellword.Quote(dir)+" --out bob-new.pem") ||
		strings.Contains(r.stderr, "join again") {
		t.Fatalf("an expired operator: exit %d, stderr %s", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "expired at") {
		t.Errorf("no local warning of the expired identity: %s", r.stderr)
	}

	// Break-glass beside the running authority.
	bob2 := filepath.Join(t.TempDir(), "bob2.pem")
	var added map[string]any
	if err := json.Unmarshal([]byte(mustRun(t, "admin", "add", "bob", "--offline", "--data", dir, "--ttl", "2h", "--out", bob2, "-o", "json")), &added); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(bob2); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("break-glass identity: %v %v", fi, err)
	}
	if out := mustRun(t, "status", "--identity", bob2, "--authority", a.addr); !strings.Contains(out, "/admin/bob") {
		t.Errorf("status with the break-glass identity: %s", out)
	}
	// Without --out the identity lands in the current directory as
	// NAME.pem, and the commands after it still use DIR/operator.pem: the
	// output names the export that makes them use the new one, which
	// pasted into a shell (here another directory's) works.
	wd := t.TempDir()
	add := exec.Command(musterBin, "admin", "add", "carol", "--offline", "--data", dir, "--ttl", "2h")
	add.Dir, add.Env = wd, []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	printed, err := add.Output()
	if err != nil {
		t.Fatalf("admin add carol --offline: %v\n%s", err, printed)
	}
	var export string
	for _, line := range strings.Split(string(printed), "\n") {
		if l := strings.TrimSpace(line); strings.HasPrefix(l, "export MUSTER_IDENTITY=") {
			export = l
		}
	}
	if export == "" || !strings.Contains(string(printed), "--identity "+filepath.Join(wd, "carol.pem")) {
		t.Fatalf("admin add --offline names no export of the new identity, or no --identity:\n%s", printed)
	}
	sh := exec.Command("sh", "-c", export+"\nexec \"$0\" status --authority \"$1\"", musterBin, a.addr)
	sh.Dir, sh.Env = t.TempDir(), []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	if out, err := sh.CombinedOutput(); err != nil || !strings.Contains(string(out), "/admin/carol") {
		t.Errorf("status after pasting %q: %v\n%s", export, err, out)
	}
	// --out never overwrites.
	if line := mustFail(t, "admin", "add", "bob", "--offline", "--data", dir, "--out", bob2); !strings.Contains(line, "already exists") {
		t.Errorf("break-glass over an existing file: %s", line)
	}

	var recs []map[string]any
	json.Unmarshal([]byte(mustRun(t, "audit", "list", "--data", dir, "-o", "json", "--action", "operator.*")), &recs)
	var renews, offline int
	for _, rec := range recs {
		switch {
		case rec["action"] == "operator.renew" && rec["result"] == "ok":
			renews++
		case rec["action"] == "operator.add" && rec["actor"] == "muster admin add --offline" && strings.Contains(rec["reason"].(string), added["serial"].(string)):
			offline++
		}
	}
	if renews != 3 || offline != 1 {
		t.Errorf("audit: %d operator.renew (want 3: the pasted one, two more), %d offline operator.add (want 1): %v", renews, offline, recs)
	}
	if out := mustRun(t, "audit", "verify", "--data", dir); !strings.Contains(out, "intact") {
		t.Errorf("audit verify after break-glass: %s", out)
	}
}

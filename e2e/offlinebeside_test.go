package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/muster-dev/muster/internal/audit"
)

// TestOfflineCommandsBesideTheAuthority: the offline commands that append
// to the audit chain from the data directory (here admin add --offline,
// the break-glass path, which exists for an authority that runs while no
// operator can reach it) run beside the authority on the same directory
// while it appends too. Each succeeds, the running authority accepts what
// they made, and once everything stopped DIR/audit-head names the chain's
// newest record (every process writes it only forward, under
// DIR/audit.lock; before, the last writer won and could leave an older
// record there, so a cut tail went unseen) and the chain verifies.
func TestOfflineCommandsBesideTheAuthority(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	a := startAuthority(t, dir)
	outs := t.TempDir()
	const offline, online = 4, 8
	var wg sync.WaitGroup
	for i := range offline {
		wg.Go(func() {
			out := filepath.Join(outs, fmt.Sprintf("op%d.pem", i))
			if r := muster(t, nil, "admin", "add", fmt.Sprintf("op%d", i), "--offline", "--data", dir, "--ttl", "1h", "--out", out); r.code != 0 {
				t.Errorf("admin add --offline beside the authority: exit %d\n%s", r.code, r.stderr)
			}
		})
	}
	for range online {
		wg.Go(func() {
			if r := muster(t, nil, "token", "create", "--data", dir); r.code != 0 {
				t.Errorf("token create: exit %d\n%s", r.code, r.stderr)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for i := range offline {
		id := filepath.Join(outs, fmt.Sprintf("op%d.pem", i))
		if out := mustRun(t, "status", "--identity", id, "--authority", a.addr); !strings.Contains(out, fmt.Sprintf("/admin/op%d", i)) {
			t.Errorf("the running authority with op%d's break-glass identity: %s", i, out)
		}
	}
	a.stop(t)

	auditHeadAtChainHead(t, dir, nil)
}

// auditHeadAtChainHead checks, once every process on dir stopped, that
// DIR/audit-head names the chain's newest record and the chain verifies.
func auditHeadAtChainHead(t *testing.T, dir string, env []string) {
	t.Helper()
	r := muster(t, env, "audit", "list", "--offline", "--data", dir, "-o", "json")
	var recs []struct {
		Seq  int64  `json:"seq"`
		Hash string `json:"hash"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &recs); err != nil || len(recs) == 0 {
		t.Fatalf("audit list --offline: %v (%d records)\n%s", err, len(recs), r.stderr)
	}
	newest := recs[0]
	for _, r := range recs {
		if r.Seq > newest.Seq {
			newest = r
		}
	}
	head, err := audit.ReadHeadFile(filepath.Join(dir, "audit-head"))
	if err != nil || head.Seq != newest.Seq || fmt.Sprintf("%x", head.Hash) != newest.Hash {
		t.Errorf("audit-head %d %x (%v), want the chain's newest record %d %s", head.Seq, head.Hash, err, newest.Seq, newest.Hash)
	}
	if r := muster(t, env, "audit", "verify", "--offline", "--data", dir); r.code != 0 || !strings.Contains(r.stdout, "intact") {
		t.Errorf("audit verify --offline: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"database/sql"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	_ "modernc.org/sqlite"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/spiffeid"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

func TestAdminCommands(t *testing.T) {
	t.Parallel()
	dir, out := initDir(t)
	a := startAuthority(t, dir)
	authID := out["authority_id"].(string)

	var st map[string]any
	json.Unmarshal([]byte(mustRun(t, "status", "--data", dir, "-o", "json")), &st)
	if st["authority_id"] != authID || st["caller"] != "spiffe://"+authID+"/admin/admin" {
		t.Fatalf("status = %v", st)
	}

	alice := filepath.Join(t.TempDir(), "alice.pem")
	mustRun(t, "admin", "add", "alice", "--data", dir, "--out", alice, "--ttl", "1h")
	if fi, err := os.Stat(alice); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("alice's identity: %v, mode %v", err, fi.Mode())
	}
	// The new identity works on its own, with the address given explicitly.
	r := muster(t, []string{"MUSTER_IDENTITY=" + alice, "MUSTER_AUTHORITY=" + a.addr}, "status", "-o", "json")
	if r.code != 0 || !strings.Contains(r.stdout, "/admin/alice") {
		t.Fatalf("status as alice: %+v", r)
	}
	// Re-adding into the same file is refused: identities are never overwritten.
	mustFail(t, "admin", "add", "alice", "--data", dir, "--out", alice)
	// So is a second identity with the same name: its SAN would be alice's.
	line := mustFail(t, "admin", "add", "alice", "--data", dir, "--out", filepath.Join(t.TempDir(), "alice2.pem"))
	if !strings.Contains(line, "ALREADY_EXISTS") || !strings.Contains(line, "alice already holds a valid certificate") {
		t.Errorf("adding alice twice: %q, want ALREADY_EXISTS", line)
	}
	mustRun(t, "admin", "add", "alice", "--reissue", "--data", dir, "--out", filepath.Join(t.TempDir(), "alice3.pem"))

	// Lock alice: her next call is refused, and the refusal is audited.
	mustRun(t, "lock", "create", "--admin", "alice", "--reason", "laptop stolen", "--data", dir)
	line = mustFail(t, "status", "--identity", alice, "--authority", a.addr)
	if !strings.Contains(line, "PERMISSION_DENIED") || !strings.Contains(line, "locked") {
		t.Errorf("locked operator got %q, want PERMISSION_DENIED ... locked", line)
	}
	// An operator cannot lock itself out.
	if line := mustFail(t, "lock", "create", "--admin", "admin", "--data", dir); !strings.Contains(line, "FAILED_PRECONDITION") {
		t.Errorf("self-lock: %q", line)
	}

	var locks []map[string]any
	json.Unmarshal([]byte(mustRun(t, "lock", "list", "--data", dir, "-o", "json")), &locks)
	if len(locks) != 1 || locks[0]["target"] != "alice" {
		t.Fatalf("lock list = %v", locks)
	}
	var ops []map[string]any
	json.Unmarshal([]byte(mustRun(t, "admin", "list", "--data", dir, "-o", "json")), &ops)
	lockedAlice := false
	for _, o := range ops {
		if o["name"] == "alice" && o["locked"] == true {
			lockedAlice = true
		}
	}
	if !lockedAlice {
		t.Errorf("admin list does not show alice locked: %v", ops)
	}
	mustRun(t, "lock", "delete", locks[0]["id"].(string), "--data", dir)
	mustRun(t, "status", "--identity", alice, "--authority", a.addr)
	line = mustFail(t, "lock", "delete", locks[0]["id"].(string), "--data", dir)
	if !strings.Contains(line, "NOT_FOUND") {
		t.Errorf("deleting a deleted lock: %q", line)
	}
	// Its way out lists the locks at the authority this call reached,
	// pasted as printed.
	if _, list, ok := strings.Cut(line, "their IDs: muster "); !ok || !strings.Contains(list, "--data "+shellword.Quote(dir)) {
		t.Errorf("deleting a deleted lock names no muster lock list with --data: %q", line)
	} else if out, err := exec.Command("sh", "-c", shellword.Quote(musterBin)+" "+list+" -o json").CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "[]" {
		t.Errorf("the pasted muster %s: %v\n%s", list, err, out)
	}

	var recs []map[string]any
	json.Unmarshal([]byte(mustRun(t, "audit", "list", "--data", dir, "-o", "json")), &recs)
	actions := map[string]int{}
	for _, r := range recs {
		actions[r["action"].(string)+"/"+r["result"].(string)]++
	}
	for _, want := range []string{"authority.init/ok", "operator.add/ok", "lock.create/ok", "lock.create/denied", "api.access/denied", "lock.delete/ok", "lock.delete/denied"} {
		if actions[want] == 0 {
			t.Errorf("audit list has no %s record; has %v", want, actions)
		}
	}
	json.Unmarshal([]byte(mustRun(t, "audit", "list", "--data", dir, "-o", "json", "--action", "lock.*")), &recs)
	for _, r := range recs {
		if !strings.HasPrefix(r["action"].(string), "lock.") {
			t.Errorf("--action lock.* returned %v", r["action"])
		}
	}
	if !strings.Contains(mustRun(t, "audit", "verify", "--data", dir), "intact") {
		t.Error("audit verify on an untouched chain does not say intact")
	}
}

// dialAdmin connects to the admin API with the given client identity (nil
// for none), verifying the authority like the CLI does.
func dialAdmin(t *testing.T, dir, addr string, id *identity.Identity) musterv1.AdminServiceClient {
	t.Helper()
	op, err := identity.Load(filepath.Join(dir, "operator.pem"))
	if err != nil {
		t.Fatal(err)
	}
	me, _ := op.ID()
	tc := identity.ClientTLS(id, op.RootPool(), identity.MatchRole(me.TrustDomain, spiffeid.RoleAuthority))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return musterv1.NewAdminServiceClient(conn)
}

func TestAdminAPIRefusesNonOperators(t *testing.T) {
	t.Parallel()
	dir, out := initDir(t)
	a := startAuthority(t, dir)
	h, err := ca.Load(filepath.Join(dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	td := out["trust_domain"].(string)
	issue := func(role ca.Role, id spiffeid.ID) *identity.Identity {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		leaf, err := h.Issuer(role).Issue(ca.LeafRequest{PublicKey: key.Public(), SPIFFEID: id.URL(),
			CommonName: id.Name, ClientAuth: true, NotBefore: time.Now(), TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return &identity.Identity{Chain: []*x509.Certificate{leaf, h.Issuer(role).Cert}, Key: key, Roots: []*x509.Certificate{h.Root}}
	}
	agentID, _ := spiffeid.New(td, spiffeid.RoleAgent, "node-1")
	// An admin-looking SAN on a certificate from the agent intermediate must
	// not pass: the issuer is checked, not only the SAN.
	fakeAdmin, _ := spiffeid.New(td, spiffeid.RoleAdmin, "mallory")

	for _, tc := range []struct {
		name string
		id   *identity.Identity
		code codes.Code
	}{
		{"no certificate", nil, codes.Unauthenticated},
		{"agent certificate", issue(ca.RoleAgent, agentID), codes.PermissionDenied},
		{"admin SAN from the agent intermediate", issue(ca.RoleAgent, fakeAdmin), codes.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialAdmin(t, dir, a.addr, tc.id)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := c.ListLocks(ctx, &musterv1.ListLocksRequest{})
			if status.Code(err) != tc.code {
				t.Fatalf("ListLocks: %v, want %v", err, tc.code)
			}
		})
	}
	var recs []map[string]any
	json.Unmarshal([]byte(mustRun(t, "audit", "list", "--data", dir, "-o", "json", "--action", "api.access")), &recs)
	if len(recs) != 3 {
		t.Fatalf("want 3 audited refusals, got %d: %v", len(recs), recs)
	}
	for _, r := range recs {
		if r["result"] != "denied" || r["reason"] == "" || r["source"] != "127.0.0.1" {
			t.Errorf("refusal record %v lacks result, reason or source", r)
		}
	}
}

// tamper opens the authority's SQLite database as an attacker with write
// access to it would.
func tamper(t *testing.T, dir string, f func(db *sql.DB)) {
	t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(dir, "muster.db")+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// The append-only triggers stop mistakes, not an attacker who can
	// write the file: such an attacker drops them first.
	mustExec(t, db, `DROP TRIGGER IF EXISTS audit_records_no_update`)
	mustExec(t, db, `DROP TRIGGER IF EXISTS audit_records_no_delete`)
	f(db)
}

func TestAuditVerifyCatchesTampering(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		attack  func(t *testing.T, db *sql.DB)
		wantSeq string
	}{
		{"edited record", func(t *testing.T, db *sql.DB) {
			mustExec(t, db, `UPDATE audit_records SET reason = 'nothing to see' WHERE seq = 3`)
		}, "record 3"},
		{"chain recomputed in the database", func(t *testing.T, db *sql.DB) {
			mustExec(t, db, `UPDATE audit_records SET actor = 'someone else' WHERE seq = 3`)
			rehash(t, db, 3)
		}, "record 3"},
		{"removed record", func(t *testing.T, db *sql.DB) {
			mustExec(t, db, `DELETE FROM audit_records WHERE seq = 4`)
		}, "record 4"},
		{"inserted record", func(t *testing.T, db *sql.DB) {
			// Make room at 4 (from the top down, keeping seq unique), then
			// copy record 3 into the gap, linked to it.
			var max int64
			db.QueryRow(`SELECT max(seq) FROM audit_records`).Scan(&max)
			for seq := max; seq >= 4; seq-- {
				mustExec(t, db, `UPDATE audit_records SET seq = seq + 1 WHERE seq = ?`, seq)
			}
			mustExec(t, db, `INSERT INTO audit_records (seq, time, actor, action, target, result, reason, source, correlation_id, prev_hash, hash)
				SELECT 4, time, actor, action, 'forged', result, reason, source, correlation_id, hash, hash FROM audit_records WHERE seq = 3`)
		}, "record 4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, _ := initDir(t)
			a := startAuthority(t, dir)
			for i := 0; i < 3; i++ {
				mustRun(t, "lock", "create", "--node", "n"+string(rune('a'+i)), "--data", dir)
			}
			mustRun(t, "audit", "verify", "--data", dir)
			tamper(t, dir, func(db *sql.DB) { tc.attack(t, db) })
			line := mustFail(t, "audit", "verify", "--data", dir, "--authority", a.addr)
			if !strings.Contains(line, tc.wantSeq) {
				t.Errorf("verify said %q, want it to name %s", line, tc.wantSeq)
			}
			// The same walk in the store, from the data directory.
			line = mustFail(t, "audit", "verify", "--offline", "--data", dir)
			if !strings.Contains(line, tc.wantSeq) {
				t.Errorf("verify --offline said %q, want it to name %s", line, tc.wantSeq)
			}
		})
	}
}

// rehash recomputes the chain from record from on with plain SHA-256, linking
// each record to the one before as the schema expects: what an attacker
// without the chain key can do to hide an edit.
func rehash(t *testing.T, db *sql.DB, from int64) {
	var prev []byte
	if err := db.QueryRow(`SELECT hash FROM audit_records WHERE seq = ?`, from-1).Scan(&prev); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(`SELECT seq, actor, action, target, result, reason FROM audit_records WHERE seq >= ? ORDER BY seq`, from)
	if err != nil {
		t.Fatal(err)
	}
	type rec struct {
		seq  int64
		text string
	}
	var recs []rec
	for rows.Next() {
		var r rec
		var a, b, c, d, e sql.NullString
		rows.Scan(&r.seq, &a, &b, &c, &d, &e)
		r.text = a.String + b.String + c.String + d.String + e.String
		recs = append(recs, r)
	}
	rows.Close()
	for _, r := range recs {
		h := sha256.Sum256(append(append([]byte{}, prev...), r.text...))
		mustExec(t, db, `UPDATE audit_records SET prev_hash = ?, hash = ? WHERE seq = ?`, prev, h[:], r.seq)
		prev = h[:]
	}
}

func mustExec(t *testing.T, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func TestMetricsAndHealth(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	a := startAuthority(t, dir)
	mustRun(t, "status", "--data", dir)
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + a.metrics + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := get("/healthz"); code != 200 {
		t.Errorf("/healthz: %d %s", code, body)
	}
	if code, body := get("/readyz"); code != 200 {
		t.Errorf("/readyz: %d %s", code, body)
	}
	_, body := get("/metrics")
	for _, want := range []string{
		"muster_build_info{",
		`muster_rpc_requests_total{code="OK",method="GetStatus",service="muster.v1.AdminService"} 1`,
		`muster_audit_records_total{result="ok"}`,
		"muster_rpc_duration_seconds_bucket",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestAuthorityRefusesBadSetups(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()

	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string)
		args  []string
		want  string
	}{
		{"missing directory", func(t *testing.T, dir string) { os.RemoveAll(dir) }, nil, "does not exist"},
		{"foreign directory", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "authority.json")) }, nil, "authority.json"},
		{"corrupt authority.json", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "authority.json"), []byte("{not json"), 0o600)
		}, nil, "corrupt"},
		{"unreadable storage key", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "storage.key"), []byte("short\n"), 0o600)
		}, nil, "storage"},
		{"foreign CA", func(t *testing.T, dir string) {
			other, _ := initDir(t)
			os.RemoveAll(filepath.Join(dir, "ca"))
			os.Rename(filepath.Join(other, "ca"), filepath.Join(dir, "ca"))
		}, nil, "does not match"},
		{"unknown key in authority.yaml", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "authority.yaml"), []byte("listen: 127.0.0.1:0\nlisen: typo\n"), 0o600)
		}, nil, "lisen"},
		{"newer schema", func(t *testing.T, dir string) {
			tamper(t, dir, func(db *sql.DB) {
				mustExec(t, db, `INSERT INTO schema_migrations (version, applied_at) VALUES (9999, 0)`)
			})
		}, nil, "newer"},
		{"port in use", func(t *testing.T, dir string) {}, []string{"--listen", busy.Addr().String()}, "in use"},
		{"agent certificate ttl too long", func(t *testing.T, dir string) {}, []string{"--agent-cert-ttl", "200h"}, "ttl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, _ := initDir(t)
			tc.setup(t, dir)
			args := append([]string{"authority", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", ""}, tc.args...)
			line := mustFail(t, args...)
			if !strings.Contains(line, tc.want) {
				t.Errorf("refusal %q does not mention %q", line, tc.want)
			}
		})
	}
}

func TestDev(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "dev-data")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := execCommand(ctx, "dev", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--discovery-listen", "127.0.0.1:0")
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Signal(os.Interrupt); cmd.Wait() }()
	buf := make([]byte, 0, 8192)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(string(buf), "Stop with Ctrl-C") {
		if time.Now().After(deadline) {
			t.Fatalf("dev did not say it was ready:\n%s", buf)
		}
		chunk := make([]byte, 4096)
		n, err := stdout.Read(chunk)
		buf = append(buf, chunk[:n]...)
		if err != nil {
			t.Fatalf("dev output ended: %v\n%s", err, buf)
		}
	}
	text := string(buf)
	for _, want := range []string{"Authority ID:", "Bootstrap PSK:", "token create --data", "agent join --data", "listening on 127.0.0.1:",
		"--discovery 127.0.0.1:"} {
		if !strings.Contains(text, want) {
			t.Errorf("dev output lacks %q:\n%s", want, text)
		}
	}
	mustRun(t, "status", "--data", dir)

	// The PSK join through the embedded discovery, as the output says.
	field := func(after string) string {
		_, rest, ok := strings.Cut(text, after)
		if !ok {
			t.Fatalf("dev output lacks %q:\n%s", after, text)
		}
		return strings.Fields(rest)[0]
	}
	adir := filepath.Join(t.TempDir(), "agent-psk")
	r := muster(t, []string{"MUSTER_BOOTSTRAP_PSK=" + field("Bootstrap PSK:")}, "agent", "join", "--data", adir, "--node", "my-psk-node",
		"--discovery", field("--discovery "), "--discovery-fingerprint", field("--discovery-fingerprint "),
		"--authority-id", field("--authority-id "), "--ca-fingerprint", field("--ca-fingerprint "))
	if r.code != 0 {
		t.Fatalf("the PSK join dev prints: exit %d\n%s", r.code, r.stderr)
	}
}

// TestAuditCatchesACutTail: the newest records, appended after the last
// checkpoint, removed from the store (after a kill -9, by whoever can write
// it) are reported by audit verify, and the authority refuses to start on
// the shorter chain rather than reuse their sequence numbers.
func TestAuditCatchesACutTail(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	a := startAuthority(t, dir)
	for i := 0; i < 3; i++ {
		mustRun(t, "lock", "create", "--node", "n"+string(rune('a'+i)), "--data", dir)
	}
	tamper(t, dir, func(db *sql.DB) {
		mustExec(t, db, `DELETE FROM audit_records WHERE seq > (SELECT max(seq) - 2 FROM audit_records)`)
	})
	line := mustFail(t, "audit", "verify", "--data", dir, "--authority", a.addr)
	if !strings.Contains(line, "removed from the tail") {
		t.Errorf("verify said %q, want the cut tail named", line)
	}
	a.cmd.Process.Kill()
	<-a.done
	r := muster(t, nil, "authority", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
	if r.code == 0 || !strings.Contains(r.stderr, "removed from the tail") || !strings.Contains(r.stderr, "head file") {
		t.Fatalf("restart on the cut chain: exit %d, %s", r.code, r.stderr)
	}
	// With no authority running, the chain is still checked from the
	// data directory.
	if line := mustFail(t, "audit", "verify", "--offline", "--data", dir); !strings.Contains(line, "removed from the tail") {
		t.Errorf("verify --offline on the cut chain said %q", line)
	}
}

// TestAuditOffline reads the chain with --offline beside a running
// authority and after it stopped: the same records as through the admin
// API, and nothing written by reading.
func TestAuditOffline(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	a := startAuthority(t, dir)
	for _, n := range []string{"na", "nb"} {
		mustRun(t, "lock", "create", "--node", n, "--data", dir)
	}
	online := mustRun(t, "audit", "list", "--data", dir, "--action", "lock.*", "-o", "json")
	running := mustRun(t, "audit", "list", "--offline", "--data", dir, "--action", "lock.*", "-o", "json")
	if online != running || strings.Count(online, `"lock.create"`) != 2 {
		t.Errorf("audit list --offline beside the authority:\n%s\nthrough the API:\n%s", running, online)
	}
	a.stop(t)
	stopped := mustRun(t, "audit", "list", "--offline", "--data", dir, "--action", "lock.*", "-o", "json")
	if stopped != online {
		t.Errorf("audit list --offline after the stop:\n%s\nthrough the API:\n%s", stopped, online)
	}
	all := mustRun(t, "audit", "list", "--offline", "--data", dir, "-o", "json")
	if out := mustRun(t, "audit", "verify", "--offline", "--data", dir); !strings.Contains(out, "audit chain intact") {
		t.Errorf("audit verify --offline: %s", out)
	}
	if again := mustRun(t, "audit", "list", "--offline", "--data", dir, "-o", "json"); again != all {
		t.Errorf("reading the chain offline changed it:\nbefore: %s\nafter: %s", all, again)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"audit", "list", "--offline", "--data", filepath.Join(t.TempDir(), "none")}, "muster init"},
		{[]string{"audit", "list", "--offline", "--data", dir, "--store", "sqlite://" + filepath.Join(t.TempDir(), "other.db")}, "no store at"},
		{[]string{"audit", "list", "--offline", "--data", dir, "--authority", "127.0.0.1:1"}, "--offline does not use"},
		{[]string{"audit", "verify", "--data", dir, "--store", "sqlite://x.db"}, "--store goes with --offline"},
	} {
		if line := mustFail(t, tc.args...); !strings.Contains(line, tc.want) {
			t.Errorf("muster %s: %q, want %q", strings.Join(tc.args, " "), line, tc.want)
		}
	}
}

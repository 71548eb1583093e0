package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/store"
)

// reapplyFixture is a data directory whose store was restored from a
// backup: backup is the copy taken, aside the store the restore
// replaced.
type reapplyFixture struct {
	dir               datadir.Dir
	db, backup, aside string
}

func newReapplyFixture(t *testing.T) *reapplyFixture {
	t.Helper()
	res, err := datadir.Init(context.Background(), datadir.InitOptions{Dir: datadir.Dir(filepath.Join(t.TempDir(), "data")), Name: "test", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	f := &reapplyFixture{dir: res.Dir, db: filepath.Join(string(res.Dir), "muster.db")}
	f.backup, f.aside = filepath.Join(t.TempDir(), "backup.db"), f.db+".before-restore"
	return f
}

// with opens the store at path with its audit logger, as an authority of
// the directory would, and runs fn on them.
func (f *reapplyFixture) with(t *testing.T, path string, fn func(ctx context.Context, st store.Store, l *audit.Logger)) {
	t.Helper()
	ctx := context.Background()
	d, err := loadDataDir(f.dir, "sqlite://"+path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := d.openStore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	l, err := newAuditLogger(st, d.sk, f.dir, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	fn(ctx, st, l)
}

// write makes one change through write with its record, as the
// authority's handlers do.
func write(t *testing.T, l *audit.Logger, action, target string, write func(build func(store.AuditHead) (store.AuditRecord, error)) error) {
	t.Helper()
	link, err := l.Builder(audit.Event{Actor: "test", Action: action, Target: target, Result: audit.ResultOK})
	if err != nil {
		t.Fatal(err)
	}
	if err := write(link.Build); err != nil {
		t.Fatalf("%s %s: %v", action, target, err)
	}
	l.Appended(link)
}

// backUp copies the store; restore moves it aside and puts the copy
// back, and the audit files aside as the refused start says.
func (f *reapplyFixture) backUp(t *testing.T) { copyTestFile(t, f.db, f.backup) }

func (f *reapplyFixture) restore(t *testing.T) {
	t.Helper()
	for _, suffix := range []string{"", "-wal", "-shm"} {
		if err := os.Rename(f.db+suffix, f.aside+suffix); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	copyTestFile(t, f.backup, f.db)
	for _, name := range []string{"audit-head", "audit-checkpoint.json"} {
		if err := os.Remove(filepath.Join(string(f.dir), name)); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
}

func copyTestFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func (f *reapplyFixture) run(t *testing.T, extra ...string) (int, string, string) {
	t.Helper()
	return runCLI(t, append([]string{"store", "reapply", "--offline", "--data", string(f.dir), "--from", "sqlite://" + f.aside}, extra...)...)
}

func (f *reapplyFixture) head(t *testing.T) int64 {
	t.Helper()
	var seq int64
	f.with(t, f.db, func(ctx context.Context, st store.Store, _ *audit.Logger) {
		h, err := st.AuditHead(ctx)
		if err != nil {
			t.Fatal(err)
		}
		seq = h.Seq
	})
	return seq
}

func testToken(id string, uses int64, created time.Time) store.Token {
	return store.Token{ID: id, JoinMethod: store.JoinMethodToken, Ciphertext: []byte("c"), Nonce: []byte("n"),
		UsesAllowed: uses, CreatedBy: "test", CreatedAt: created.UTC().Truncate(time.Microsecond)}
}

// TestStoreReapplyTokens: a token of several uses spent in part since the
// backup counts those uses again, never more; one deleted and made again
// under its name since is deleted; one of unlimited uses is left as it
// is (no count refuses its joins).
func TestStoreReapplyTokens(t *testing.T) {
	f := newReapplyFixture(t)
	created := time.Now().Add(-time.Hour)
	f.with(t, f.db, func(ctx context.Context, st store.Store, l *audit.Logger) {
		for _, tok := range []store.Token{testToken("multi1", 3, created), testToken("renamd", 1, created), testToken("unlim1", 0, created)} {
			write(t, l, "token.create", "token "+tok.ID, func(b func(store.AuditHead) (store.AuditRecord, error)) error { return st.InsertToken(ctx, tok, b) })
		}
	})
	f.backUp(t)
	f.with(t, f.db, func(ctx context.Context, st store.Store, l *audit.Logger) {
		write(t, l, "agent.join", "n1", func(b func(store.AuditHead) (store.AuditRecord, error)) error {
			return st.RaiseTokenUses(ctx, "multi1", 2, b)
		})
		write(t, l, "token.delete", "token renamd", func(b func(store.AuditHead) (store.AuditRecord, error)) error {
			return st.DeleteToken(ctx, "renamd", b)
		})
		again := testToken("renamd", 1, created.Add(time.Minute))
		write(t, l, "token.create", "token renamd", func(b func(store.AuditHead) (store.AuditRecord, error)) error { return st.InsertToken(ctx, again, b) })
	})
	f.restore(t)

	code, out, errOut := f.run(t, "--apply")
	if code != 0 {
		t.Fatalf("store reapply --apply: exit %d\n%s%s", code, out, errOut)
	}
	f.with(t, f.db, func(ctx context.Context, st store.Store, _ *audit.Logger) {
		if tok, err := st.GetToken(ctx, "multi1"); err != nil || tok.UsesCount != 2 || tok.UsesAllowed != 3 {
			t.Errorf("multi1 after the reapply: %+v, %v; want 2 of its 3 uses spent", tok, err)
		}
		if tok, err := st.GetToken(ctx, "renamd"); err == nil {
			t.Errorf("renamd, deleted since the backup, is still there: %+v", tok)
		}
		if tok, err := st.GetToken(ctx, "unlim1"); err != nil || tok.UsesCount != 0 {
			t.Errorf("unlim1 after the reapply: %+v, %v", tok, err)
		}
	})
	if !strings.Contains(out, "another token made under its name since") || strings.Count(out, ": done, record") != 2 {
		t.Errorf("store reapply --apply printed:\n%s", out)
	}
}

// TestStoreReapplyRefusesAnotherChain: a --from store that does not hold
// the restored store's newest record (here: one appended to the restored
// store after the restore, as an authority started on it appends) is
// refused and nothing is written; as are flags that cannot work.
func TestStoreReapplyRefusesAnotherChain(t *testing.T) {
	f := newReapplyFixture(t)
	f.backUp(t)
	f.with(t, f.db, func(ctx context.Context, st store.Store, l *audit.Logger) {
		lock := store.Lock{ID: "lock-1", Kind: store.LockNode, Target: "stolen-01", CreatedBy: "test", CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
		write(t, l, "lock.create", "node:stolen-01", func(b func(store.AuditHead) (store.AuditRecord, error)) error { return st.InsertLock(ctx, lock, b) })
	})
	f.restore(t)
	f.with(t, f.db, func(ctx context.Context, _ store.Store, l *audit.Logger) {
		if _, err := l.Record(ctx, audit.Event{Actor: "authority", Action: "authority.start", Result: audit.ResultOK}); err != nil {
			t.Fatal(err)
		}
	})
	before := f.head(t)
	for _, extra := range [][]string{nil, {"--apply"}} {
		code, out, errOut := f.run(t, extra...)
		if code == 0 || !strings.Contains(errOut, "differs from the restored store's newest") || !strings.Contains(errOut, "nothing was changed") {
			t.Errorf("store reapply %v from a chain that parted: exit %d\n%s%s", extra, code, out, errOut)
		}
	}
	if after := f.head(t); after != before {
		t.Errorf("the refused reapply appended records %d to %d", before+1, after)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"store", "reapply", "--data", string(f.dir), "--from", "sqlite://" + f.aside}, "give --offline"},
		{[]string{"store", "reapply", "--offline", "--data", string(f.dir)}, "--from is required"},
		{[]string{"store", "reapply", "--offline", "--data", string(f.dir), "--from", "sqlite://" + f.db}, "names the restored store itself"},
		{[]string{"store", "reapply", "--offline", "--data", string(f.dir), "--from", "sqlite://" + f.db + ".nothing"}, "no store at"},
	} {
		if code, _, errOut := runCLI(t, tc.args...); code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("muster %v: exit %d, %s; want %q", tc.args, code, errOut, tc.want)
		}
	}
}

// TestStoreReapplyRefusesABackupFromBeforeAnEarlierRestore: restored
// to T1 and re-applied, then restored to T2 (taken on the chain the first
// restore replaced), the store kept aside by the second restore parted
// from T2's chain at T1: reapply refuses, changing nothing, and says so,
// naming the store the first restore kept aside, which re-applies what
// was done since T2. Before, it said the store given was not the one
// the backup was taken from, and to give the one in use when the restore
// replaced it: the one given.
func TestStoreReapplyRefusesABackupFromBeforeAnEarlierRestore(t *testing.T) {
	f := newReapplyFixture(t)
	lock := func(id string) {
		f.with(t, f.db, func(ctx context.Context, st store.Store, l *audit.Logger) {
			lk := store.Lock{ID: id, Kind: store.LockNode, Target: id + "-node", CreatedBy: "test", CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
			write(t, l, "lock.create", "node:"+lk.Target, func(b func(store.AuditHead) (store.AuditRecord, error)) error { return st.InsertLock(ctx, lk, b) })
		})
	}
	lock("lock-a")
	f.backUp(t)
	t1 := f.backup
	lock("lock-b")
	f.backup = filepath.Join(t.TempDir(), "t2.db")
	f.backUp(t)
	t2 := f.backup
	lock("lock-c")

	f.backup = t1
	f.restore(t)
	if code, out, errOut := f.run(t, "--apply"); code != 0 || strings.Count(out, ": done, record") != 2 {
		t.Fatalf("the first reapply: exit %d\n%s%s", code, out, errOut)
	}
	lock("lock-d")
	first := f.aside + ".first"
	if err := os.Rename(f.aside, first); err != nil {
		t.Fatal(err)
	}
	f.backup = t2
	f.restore(t)

	before := f.head(t)
	code, out, errOut := f.run(t, "--apply")
	for _, want := range []string{"itself restored from an older backup, which ended at record", "give that store as --from", "--action store.backup", "nothing was changed"} {
		if code == 0 || !strings.Contains(errOut, want) {
			t.Errorf("store reapply of T2 from the store restored to T1: exit %d, want %q\n%s%s", code, want, out, errOut)
		}
	}
	if after := f.head(t); after != before {
		t.Errorf("the refused reapply appended records %d to %d", before+1, after)
	}
	code, out, errOut = runCLI(t, "store", "reapply", "--offline", "--data", string(f.dir), "--from", "sqlite://"+first, "--apply")
	if code != 0 || !strings.Contains(out, "lock lock-c") || strings.Count(out, ": done, record") != 1 {
		t.Errorf("store reapply of T2 from the store the first restore kept aside: exit %d\n%s%s", code, out, errOut)
	}
}

// TestTokenDeleteWithUsesLeft: with the store a restore replaced lost,
// every join token made before the backup that still has uses left (and
// has not expired) is deleted offline, each with its own record; without
// --apply nothing changes.
func TestTokenDeleteWithUsesLeft(t *testing.T) {
	f := newReapplyFixture(t)
	cut := time.Now().Add(-time.Hour)
	spent, expired := testToken("spent1", 1, cut.Add(-time.Hour)), testToken("expird", 1, cut.Add(-time.Hour))
	spent.UsesCount, expired.ExpiresAt = 1, cut.UTC().Truncate(time.Microsecond)
	f.with(t, f.db, func(ctx context.Context, st store.Store, l *audit.Logger) {
		for _, tok := range []store.Token{testToken("unused", 1, cut.Add(-time.Hour)), testToken("unlimd", 0, cut.Add(-time.Hour)),
			testToken("later1", 1, cut.Add(time.Minute)), spent, expired} {
			write(t, l, "token.create", "token "+tok.ID, func(b func(store.AuditHead) (store.AuditRecord, error)) error { return st.InsertToken(ctx, tok, b) })
		}
	})
	tokens := func() []string {
		var ids []string
		f.with(t, f.db, func(ctx context.Context, st store.Store, _ *audit.Logger) {
			ts, err := st.ListTokens(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, tok := range ts {
				ids = append(ids, tok.ID)
			}
		})
		return strings.Fields(strings.Join(ids, " "))
	}
	args := []string{"token", "delete", "--with-uses-left", "--created-before", cut.UTC().Format(time.RFC3339Nano), "--offline", "--data", string(f.dir)}
	before, seq := tokens(), f.head(t)
	code, out, errOut := runCLI(t, args...)
	if code != 0 || !strings.Contains(out, "Would delete token unused") || !strings.Contains(out, "Would delete token unlimd") || strings.Count(out, "Would delete") != 2 {
		t.Fatalf("the listing: exit %d\n%s%s", code, out, errOut)
	}
	if got := tokens(); strings.Join(got, " ") != strings.Join(before, " ") || f.head(t) != seq {
		t.Fatalf("the listing changed the store: tokens %v, were %v", got, before)
	}
	if code, out, errOut = runCLI(t, append(args, "--apply")...); code != 0 || strings.Count(out, "Deleted token") != 2 {
		t.Fatalf("--apply: exit %d\n%s%s", code, out, errOut)
	}
	if got := strings.Join(tokens(), " "); got != "expird spent1 later1" {
		t.Errorf("tokens left: %s, want the expired, the spent and the later one", got)
	}
	f.with(t, f.db, func(ctx context.Context, st store.Store, _ *audit.Logger) {
		recs, err := st.ListAudit(ctx, store.AuditFilter{AfterSeq: seq})
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != 2 || recs[0].Action != "token.delete" || recs[0].Actor != tokenDeleteOfflineActor {
			t.Errorf("records of the deletion: %+v", recs)
		}
	})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"token", "delete", "--with-uses-left", "--created-before", "2h", "--data", string(f.dir)}, "give --offline"},
		{[]string{"token", "delete", "--with-uses-left", "--offline", "--data", string(f.dir)}, "--created-before is required"},
		{[]string{"token", "delete", "--with-uses-left", "--created-before", "yesterday", "--offline", "--data", string(f.dir)}, "give an RFC 3339 time"},
		{[]string{"token", "delete", "abc123", "--apply"}, "--apply goes with --with-uses-left"},
		{[]string{"token", "delete", "abc123", "--with-uses-left", "--created-before", "2h", "--offline"}, "not both"},
		{[]string{"token", "delete"}, "give the ID"},
	} {
		if code, _, errOut := runCLI(t, tc.args...); code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("muster %v: exit %d, %s; want %q", tc.args, code, errOut, tc.want)
		}
	}
}

// TestStoreReapplyListsWhatTheAuditCannotRedo: a PSK rotation (the new
// PSK is in no record), an operator identity issued and a lock lifted
// since the backup are listed with the command that redoes each, and each
// command parses as muster's command tree reads it; nothing of them is
// written.
func TestStoreReapplyListsWhatTheAuditCannotRedo(t *testing.T) {
	f := newReapplyFixture(t)
	f.with(t, f.db, func(ctx context.Context, st store.Store, l *audit.Logger) {
		lock := store.Lock{ID: "lock-old", Kind: store.LockNode, Target: "n1", CreatedBy: "test", CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
		write(t, l, "lock.create", "node:n1", func(b func(store.AuditHead) (store.AuditRecord, error)) error { return st.InsertLock(ctx, lock, b) })
	})
	f.backUp(t)
	f.with(t, f.db, func(ctx context.Context, st store.Store, l *audit.Logger) {
		write(t, l, "lock.delete", "lock-old", func(b func(store.AuditHead) (store.AuditRecord, error)) error {
			return st.DeleteLock(ctx, "lock-old", b)
		})
		for _, e := range []audit.Event{{Action: "psk.rotate", Target: "psk-2"}, {Action: "operator.add", Target: "bob"}} {
			e.Actor, e.Result = "test", audit.ResultOK
			if _, err := l.Record(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
	})
	f.restore(t)
	before := f.head(t)
	code, out, errOut := f.run(t, "--apply", "-o", "json")
	if code != 0 {
		t.Fatalf("store reapply: exit %d\n%s%s", code, out, errOut)
	}
	if f.head(t) != before {
		t.Errorf("records were appended for what is only listed")
	}
	var res reapplyResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"lock.delete":  "muster lock delete lock-old",
		"psk.rotate":   "muster psk rotate --grace 0",
		"operator.add": "muster admin add bob --offline --data " + string(f.dir) + " --out bob-new.pem",
	}
	root := newRoot(&Env{})
	for _, m := range res.Manual {
		if w, ok := want[m.Action]; !ok || m.Command != w {
			t.Errorf("listed %+v; want the command %q", m, w)
		}
		delete(want, m.Action)
		cmds, _ := lineCommands("output", 1, m.Command)
		if len(cmds) != 1 {
			t.Errorf("%q is not one muster command", m.Command)
			continue
		}
		if problem := checkDocCommand(root, cmds[0]); problem != "" {
			t.Errorf("%q: %s", m.Command, problem)
		}
	}
	if len(want) > 0 || len(res.Steps) != 0 {
		t.Errorf("not listed: %v; steps %+v, want none", want, res.Steps)
	}
}

// testJoin is a join of node by a token-less method that creates
// instance at created.
func testJoin(node, instance string, created time.Time) store.Join {
	created = created.UTC().Truncate(time.Microsecond)
	sn := fmt.Sprintf("%x", instance)
	return store.Join{Credential: "psk-1", NodeID: node,
		Instance: store.Instance{ID: instance, JoinMethod: store.JoinMethodPSK, TokenID: "psk-1", CreatedAt: created,
			LastSerial: sn, LastPublicKey: []byte("k-" + instance), LastChainPEM: []byte("chain"), LastIssuedAt: created},
		Certificate: store.Certificate{Serial: sn, NodeID: node, InstanceID: instance, JoinMethod: store.JoinMethodPSK, TokenID: "psk-1",
			PublicKey: []byte("k-" + instance), NotBefore: created, NotAfter: created.Add(time.Hour), IssuedAt: created}}
}

// TestStoreReapplyNodeDeletionMatchesTheNode: a node deleted since the
// backup is deleted again as the node the restored store holds, by its
// creation: a node deleted and joined again under its ID by the time the
// write comes (here made between the plan and the write) is another node,
// and is left, nothing written; before, the deletion went by the ID and
// took whatever node held it. Where the store kept aside holds such a
// node, the plan says its agent joins again.
func TestStoreReapplyNodeDeletionMatchesTheNode(t *testing.T) {
	f := newReapplyFixture(t)
	now := time.Now().Add(-time.Hour)
	f.with(t, f.db, func(ctx context.Context, st store.Store, l *audit.Logger) {
		for _, n := range []string{"gone-01", "back-01"} {
			j := testJoin(n, n+"-a", now)
			j.Audit = func(h store.AuditHead) (store.AuditRecord, error) {
				link, err := l.Builder(audit.Event{Actor: "test", Action: "agent.join", Target: n, Result: audit.ResultOK})
				if err != nil {
					return store.AuditRecord{}, err
				}
				defer l.Appended(link)
				return link.Build(h)
			}
			if _, err := st.CommitJoin(ctx, j); err != nil {
				t.Fatal(err)
			}
		}
	})
	f.backUp(t)
	f.with(t, f.db, func(ctx context.Context, st store.Store, l *audit.Logger) {
		for _, n := range []string{"gone-01", "back-01"} {
			write(t, l, "agent.delete", n, func(b func(store.AuditHead) (store.AuditRecord, error)) error { return st.DeleteNode(ctx, n, b) })
		}
		if _, err := st.CommitJoin(ctx, testJoin("back-01", "back-01-b", now.Add(time.Minute))); err != nil {
			t.Fatal(err)
		}
	})
	f.restore(t)

	ctx := context.Background()
	env := &Env{Getenv: func(string) string { return "" }}
	st, d, od, err := openOfflineDirStore(ctx, env, string(f.dir), "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	l, err := newAuditLogger(st, d.sk, f.dir, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	from, _, err := openOfflineStore(ctx, od, "sqlite://"+f.aside)
	if err != nil {
		t.Fatal(err)
	}
	defer from.Close()
	head, err := restoredHead(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	lost, _, err := lostRecords(ctx, st, from, head, f.aside, od)
	if err != nil {
		t.Fatal(err)
	}
	p := &reapplyPlanner{st: st, from: from, lost: lost, fromName: f.aside, od: od}
	res := &reapplyResult{}
	if err := p.plan(ctx, res); err != nil {
		t.Fatal(err)
	}
	steps := map[string]reapplyStep{}
	for _, s := range res.Steps {
		steps[s.target] = s
	}
	if len(steps) != 2 || !strings.Contains(steps["back-01"].What, "another node joined under its ID since") ||
		strings.Contains(steps["gone-01"].What, "another node") {
		t.Fatalf("the plan: %+v, want both nodes deleted, back-01's agent said to join again", res.Steps)
	}
	// The node deleted since joins again in the restored store before
	// the write (as under an authority running beside it).
	write(t, l, "agent.delete", "back-01", func(b func(store.AuditHead) (store.AuditRecord, error)) error {
		return st.DeleteNode(ctx, "back-01", b)
	})
	if _, err := st.CommitJoin(ctx, testJoin("back-01", "back-01-c", now.Add(2*time.Minute))); err != nil {
		t.Fatal(err)
	}
	link, err := l.Builder(audit.Event{Actor: reapplyActor, Action: reapplyAction, Target: "back-01", Result: audit.ResultOK})
	if err != nil {
		t.Fatal(err)
	}
	if err := steps["back-01"].write(ctx, st, link.Build); !errors.Is(err, store.ErrConflict) {
		t.Errorf("deleting back-01 as planned, with another node under its ID: %v, want a conflict", err)
	}
	if n, err := st.GetNode(ctx, "back-01"); err != nil || n.InstanceID != "back-01-c" {
		t.Errorf("back-01 after the planned delete: %+v, %v; want the node joined since left", n, err)
	}
	write(t, l, reapplyAction, "gone-01", func(b func(store.AuditHead) (store.AuditRecord, error)) error {
		return steps["gone-01"].write(ctx, st, b)
	})
	if _, err := st.GetNode(ctx, "gone-01"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("gone-01 after the planned delete: %v, want it gone", err)
	}
}

package authority

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
	"github.com/muster-dev/muster/internal/task"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// openSQLite is a fresh SQLite store for a test.
func openSQLite(t *testing.T) *sqlite.SQLite {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// wantNoAudit fails unless the chain is empty.
func wantNoAudit(t *testing.T, st store.Store) {
	t.Helper()
	if recs, err := st.ListAudit(t.Context(), store.AuditFilter{}); err != nil || len(recs) != 0 {
		t.Fatalf("audit chain %+v (%v); want it empty", recs, err)
	}
}

func (u unauditable) RotateJWTKey(ctx context.Context, from store.JWTKey, _ func(store.AuditHead) (store.AuditRecord, error)) (store.JWTKey, error) {
	return u.Store.RotateJWTKey(ctx, from, func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, u.err })
}

// TestJWTRotateUnauditedChangesNothing: a JWT-SVID key rotation whose
// jwt.rotate record cannot be written leaves the version where it was,
// whether an operator or the period asked for it, and the replica keeps
// signing with the old key. Before, the version moved first and its
// record was written after, its failure logged and dropped.
func TestJWTRotateUnauditedChangesNothing(t *testing.T) {
	st := openSQLite(t)
	s, buf := unauditedServer(t, st)
	if err := s.useJWTKey(store.JWTKey{Version: 1}); err != nil {
		t.Fatal(err)
	}
	ctx := context.WithValue(t.Context(), callerKey{}, Caller{CorrelationID: "corr-1"})
	if resp, err := (&adminService{s: s}).RotateJWTKey(ctx, &musterv1.RotateJWTKeyRequest{}); status.Code(err) != codes.Internal || resp != nil {
		t.Fatalf("RotateJWTKey = %v, %v; want Internal and no key", resp, err)
	}
	if err := s.jwtKeyStepWith(ctx, time.Nanosecond); err == nil || !strings.Contains(err.Error(), "not rotated from version 1") {
		t.Fatalf("jwtKeyStepWith = %v; want the rotation refused for its record", err)
	}
	if k, err := st.GetJWTKey(t.Context()); err != nil || k.Version != 1 {
		t.Fatalf("JWT key %+v (%v); want version 1 still", k, err)
	}
	if v := s.jwt.Load().Version(); v != 1 {
		t.Fatalf("the replica signs with version %d; want 1", v)
	}
	if !strings.Contains(buf.String(), "not rotated from version 1") {
		t.Errorf("the log does not say the key was not rotated:\n%s", buf.String())
	}
	wantNoAudit(t, st)
}

func (u unauditable) OpenResync(ctx context.Context, o store.ResyncOpen, _ func(store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error)) (store.ResyncEpoch, error) {
	return u.Store.OpenResync(ctx, o, u.epochRecord)
}

func (u unauditable) CloseResync(ctx context.Context, by string, _ func(store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error)) (store.ResyncEpoch, error) {
	return u.Store.CloseResync(ctx, by, u.epochRecord)
}

func (u unauditable) epochRecord(store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error) {
	return func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, u.err }
}

// TestResyncUnauditedChangesNothing: a bound-keypair resync window whose
// bound_keypair.resync.open or .close record cannot be written is neither
// opened nor closed. Before, the window was written first and recorded
// after, the record's failure logged and dropped: a window admitting
// join states ahead of the store with nothing in the chain.
func TestResyncUnauditedChangesNothing(t *testing.T) {
	st := openSQLite(t)
	s, buf := unauditedServer(t, st)
	ctx := context.WithValue(t.Context(), callerKey{}, Caller{CorrelationID: "corr-2"})
	a := &adminService{s: s}
	req := &musterv1.OpenResyncRequest{Duration: durationpb.New(time.Hour), Reason: "restored the 02:00 backup"}
	if resp, err := a.OpenResync(ctx, req); status.Code(err) != codes.Internal || resp != nil {
		t.Fatalf("OpenResync = %v, %v; want Internal and no window", resp, err)
	}
	if list, err := st.ListResyncEpochs(t.Context()); err != nil || len(list) != 0 {
		t.Fatalf("epochs %+v (%v); want none", list, err)
	}
	if _, err := st.OpenResync(t.Context(), store.ResyncOpen{ID: "ep-1", For: time.Hour, OpenedBy: "admin:test"},
		func(store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error) { return setupLink }); err != nil {
		t.Fatal(err)
	}
	wantOpen := func() {
		t.Helper()
		list, err := st.ListResyncEpochs(t.Context())
		if err != nil || len(list) != 1 || !list[0].ClosedAt.IsZero() {
			t.Fatalf("epochs %+v (%v); want ep-1 open", list, err)
		}
	}
	wantOpen()
	if resp, err := a.CloseResync(ctx, &musterv1.CloseResyncRequest{Reason: "done"}); status.Code(err) != codes.Internal || resp != nil {
		t.Fatalf("CloseResync = %v, %v; want Internal and no window", resp, err)
	}
	wantOpen()
	for _, want := range []string{"not opened: it opens with its bound_keypair.resync.open record", "not closed: it closes with its bound_keypair.resync.close record"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the log does not say %q:\n%s", want, buf.String())
		}
	}
	if recs, err := st.ListAudit(t.Context(), store.AuditFilter{}); err != nil || len(recs) != 1 || recs[0].Action != "test.setup" {
		t.Fatalf("audit chain %+v (%v); want only the setup's record", recs, err)
	}
}

// errSwitchedOff is the append failure of an auditSwitch.
var errSwitchedOff = errors.New("the audit chain refuses the record (test)")

// auditSwitch is a store whose writes that carry their own audit record
// fail to append it while failing is set: a whole authority runs on it
// (startReplicas), and a test turns the chain off for the write it checks.
type auditSwitch struct {
	store.Store
	failing *atomic.Bool
}

// switchedAudit returns the store open gives, wrapped, and its switch.
func switchedAudit(t *testing.T) (func(context.Context) (store.Store, error), *atomic.Bool) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "db")
	failing := new(atomic.Bool)
	return func(ctx context.Context) (store.Store, error) {
		st, err := sqlite.Open(ctx, path)
		if err != nil {
			return nil, err
		}
		return auditSwitch{Store: st, failing: failing}, nil
	}, failing
}

func (a auditSwitch) record(build func(store.AuditHead) (store.AuditRecord, error)) func(store.AuditHead) (store.AuditRecord, error) {
	if !a.failing.Load() {
		return build
	}
	return func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, errSwitchedOff }
}

func (a auditSwitch) InsertTasks(ctx context.Context, ts []store.QueuedTask, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	return a.Store.InsertTasks(ctx, ts, a.record(audit))
}

func (a auditSwitch) QueueTaskToAll(ctx context.Context, t store.Task, size int, page func([]string), audit func(int) func(store.AuditHead) (store.AuditRecord, error)) (int, error) {
	return a.Store.QueueTaskToAll(ctx, t, size, page, func(n int) func(store.AuditHead) (store.AuditRecord, error) { return a.record(audit(n)) })
}

func (a auditSwitch) RecordTaskResult(ctx context.Context, taskID, nodeID, state, detail string, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	return a.Store.RecordTaskResult(ctx, taskID, nodeID, state, detail, a.record(audit))
}

// actions lists the actions of the records of the chain after seq.
func actions(t *testing.T, st store.Store, seq int64) []string {
	t.Helper()
	recs, err := st.ListAudit(t.Context(), store.AuditFilter{AfterSeq: seq})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range recs {
		out = append(out, r.Action+" "+r.Result)
	}
	return out
}

// auditHead is the chain's last seq.
func auditHead(t *testing.T, st store.Store) int64 {
	t.Helper()
	h, err := st.AuditHead(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return h.Seq
}

// TestTaskSendUnauditedQueuesNothing: a task whose task.send record cannot
// be written is queued for no node, whether sent to all or to a page of
// nodes, and the send fails saying so; with its record it is queued. Before,
// the task was queued first and recorded after, the record's failure
// logged and dropped.
func TestTaskSendUnauditedQueuesNothing(t *testing.T) {
	open, failing := switchedAudit(t)
	b := startReplicas(t, open, 1)
	s := b.srvs[0]
	ctx := context.WithValue(t.Context(), callerKey{}, Caller{CorrelationID: "corr-3"})
	a := &adminService{s: s}
	const node = "n-task"
	pending := func() int {
		t.Helper()
		ts, err := b.store.PendingTasks(t.Context(), node)
		if err != nil {
			t.Fatal(err)
		}
		return len(ts)
	}
	seq := auditHead(t, b.store)
	failing.Store(true)
	if resp, err := a.SendTask(ctx, &musterv1.SendTaskRequest{TaskType: task.TypeReport, All: true}); status.Code(err) != codes.Internal || resp != nil {
		t.Fatalf("SendTask to all = %v, %v; want Internal and no task", resp, err)
	}
	if _, err := s.queueTasks(ctx, task.Envelope{TaskType: task.TypeReport, Target: task.Target{NodeIDs: []string{node}}},
		[][]string{{node}}, time.Hour, audit.Event{Actor: "test"}); err == nil || !errors.Is(err, errSwitchedOff) {
		t.Fatalf("queueTasks = %v; want the record's failure", err)
	}
	if n := pending(); n != 0 {
		t.Fatalf("%d tasks pending for %s after unaudited sends; want none", n, node)
	}
	if got := actions(t, b.store, seq); !slices.Equal(got, []string{"task.send error"}) {
		t.Fatalf("records after the unaudited sends: %q; want the refused send's error alone", got)
	}
	failing.Store(false)
	seq = auditHead(t, b.store)
	envs, err := s.queueTasks(ctx, task.Envelope{TaskType: task.TypeReport, Target: task.Target{NodeIDs: []string{node}}},
		[][]string{{node}}, time.Hour, audit.Event{Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if n := pending(); n != 1 {
		t.Fatalf("%d tasks pending for %s after an audited send; want 1", n, node)
	}
	recs, err := b.store.ListAudit(t.Context(), store.AuditFilter{AfterSeq: seq})
	if err != nil || len(recs) != 1 || recs[0].Action != "task.send" || recs[0].Target != "task "+envs[0].TaskID+" "+task.TypeReport+" to 1 node" {
		t.Fatalf("records after the audited send: %+v (%v); want its task.send", recs, err)
	}
}

// TestTaskResultUnauditedStaysPending: an agent's answer whose task.result
// record cannot be written is not recorded (the delivery stays pending)
// and the failure is logged; with its record, both are written. Before,
// the answer was recorded first and audited after, the record's failure
// logged and dropped.
func TestTaskResultUnauditedStaysPending(t *testing.T) {
	open, failing := switchedAudit(t)
	buf := new(syncBuffer)
	b := startReplicas(t, open, 1, func(c *Config) { c.Log = slog.New(slog.NewTextHandler(buf, nil)) })
	s := b.srvs[0]
	const node = "n-result"
	now := time.Now()
	id := uuid.NewString()
	if err := b.store.InsertTask(t.Context(), store.Task{ID: id, Type: task.TypeReport, SignerVersionID: "v1", Signed: []byte("signed"),
		CreatedBy: "test", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, []string{node}, setupLink); err != nil {
		t.Fatal(err)
	}
	pending := func() int {
		t.Helper()
		ts, err := b.store.PendingTasks(t.Context(), node)
		if err != nil {
			t.Fatal(err)
		}
		return len(ts)
	}
	seq := auditHead(t, b.store)
	answer := &musterv1.TaskResult{TaskId: id, State: store.TaskOK, SignerVersionId: "v1"}
	failing.Store(true)
	s.taskResult(t.Context(), node, answer, task.TypeReport)
	if n := pending(); n != 1 {
		t.Fatalf("%d tasks pending after an unaudited answer; want the task still pending", n)
	}
	if got := actions(t, b.store, seq); len(got) != 0 {
		t.Fatalf("records after the unaudited answer: %q; want none", got)
	}
	if !strings.Contains(buf.String(), "task result not recorded") {
		t.Errorf("the log does not say the answer was not recorded:\n%s", buf.String())
	}
	failing.Store(false)
	s.taskResult(t.Context(), node, answer, task.TypeReport)
	if n := pending(); n != 0 {
		t.Fatalf("%d tasks pending after an audited answer; want none", n)
	}
	if got := actions(t, b.store, seq); !slices.Equal(got, []string{"task.result ok"}) {
		t.Fatalf("records after the audited answer: %q; want its task.result", got)
	}
}

func (a auditSwitch) ApplySignerChanges(ctx context.Context, v store.SignerSetID, cs []store.SignerChange, audit func(store.AuditHead) (store.AuditRecord, error)) (int64, error) {
	return a.Store.ApplySignerChanges(ctx, v, cs, a.record(audit))
}

// TestSignerStepUnauditedChangesNothing: a signer step asked of the
// authority (muster signer stage, activate) whose node_task_signer record
// cannot be written changes no signer and sends no rotate task, and the
// step fails; with its record, the step, its record and the rollout's
// task.send are all written. Before, the step was written first and
// recorded after, the record's failure logged and dropped.
func TestSignerStepUnauditedChangesNothing(t *testing.T) {
	open, failing := switchedAudit(t)
	b := startReplicas(t, open, 1)
	s := b.srvs[0]
	ctx := context.WithValue(t.Context(), callerKey{}, Caller{CorrelationID: "corr-4"})
	a := &adminService{s: s}
	signers := func() string {
		t.Helper()
		rows, id, err := b.store.ListSigners(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range rows {
			out = append(out, r.VersionID+" "+r.State)
		}
		return fmt.Sprintf("%v at %d", out, id.Version)
	}
	before, seq := signers(), auditHead(t, b.store)
	failing.Store(true)
	if resp, err := a.StageSigner(ctx, &musterv1.StageSignerRequest{}); status.Code(err) != codes.Internal || resp != nil {
		t.Fatalf("StageSigner = %v, %v; want Internal and no change", resp, err)
	}
	if resp, err := a.ActivateSigner(ctx, &musterv1.ActivateSignerRequest{}); err == nil || resp != nil {
		t.Fatalf("ActivateSigner = %v, %v; want it refused", resp, err)
	}
	if got := signers(); got != before {
		t.Fatalf("signers after unaudited steps: %s; want %s", got, before)
	}
	if got := actions(t, b.store, seq); !slices.Equal(got, []string{"node_task_signer.stage error", "node_task_signer.activate denied"}) {
		t.Fatalf("records after the unaudited steps: %q; want the refusals alone", got)
	}
	failing.Store(false)
	seq = auditHead(t, b.store)
	resp, err := a.StageSigner(ctx, &musterv1.StageSignerRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := actions(t, b.store, seq); !slices.Equal(got, []string{"node_task_signer.stage ok", "task.send ok"}) {
		t.Fatalf("records after the audited stage: %q; want the step's and its rollout's", got)
	}
	if got := signers(); got == before || !strings.Contains(got, resp.GetChanged()[0].GetVersionId()+" staged") {
		t.Fatalf("signers after the audited stage: %s", got)
	}
}

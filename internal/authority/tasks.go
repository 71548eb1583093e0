package authority

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/task"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// maxListedNodes bounds the node IDs a send's answer lists: the count is
// always given, the IDs only of the first nodes, so an answer to a fleet
// stays small (a task to 100,000 nodes listed every ID, about 4 MiB).
const maxListedNodes = 1000

// allPage is how many nodes a send to all reads and queues at a time: the
// authority holds one page of node IDs, never the fleet.
const allPage = 1024

// queueToAll signs env (its ID, issue time and signer are filled here)
// with the active signer and queues it for every node, a page at a time;
// it returns the task, how many nodes it was queued for, and the first
// maxListedNodes of them by ID. The task is queued with its task.send
// record (rec, by rec.Actor, its target the task and the nodes queued) in
// one transaction, or not at all.
func (s *Server) queueToAll(ctx context.Context, env task.Envelope, lifetime time.Duration, rec audit.Event) (task.Envelope, int, []string, error) {
	envs, queued, err := s.signTasks(ctx, env, [][]string{nil}, lifetime, rec.Actor)
	if err != nil {
		return task.Envelope{}, 0, nil, err
	}
	var (
		listed []string
		link   *audit.Link
	)
	n, err := s.store.QueueTaskToAll(ctx, queued[0].Task, allPage, func(page []string) {
		if room := maxListedNodes - len(listed); room > 0 {
			listed = append(listed, page[:min(room, len(page))]...)
		}
	}, func(n int) func(store.AuditHead) (store.AuditRecord, error) {
		l, err := s.sendLink(rec, sendTarget(envs, n))
		if err != nil {
			return func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, err }
		}
		link = l
		return l.Build
	})
	if err != nil {
		return task.Envelope{}, 0, nil, notSent(err)
	}
	s.audit.Appended(link)
	return envs[0], n, listed, nil
}

// queueTasks signs one task per page of nodes with the active signer, the
// same issue time and expiry for all, each page its own task ID and, when
// env targets node IDs, the page as its signed target; the tasks are
// queued in one transaction with their task.send record (rec, by
// rec.Actor), all or none.
func (s *Server) queueTasks(ctx context.Context, env task.Envelope, pages [][]string, lifetime time.Duration, rec audit.Event) ([]task.Envelope, error) {
	envs, queued, err := s.signTasks(ctx, env, pages, lifetime, rec.Actor)
	if err != nil {
		return nil, err
	}
	n := 0
	for _, p := range pages {
		n += len(p)
	}
	link, err := s.sendLink(rec, sendTarget(envs, n))
	if err != nil {
		return nil, err
	}
	if err := s.store.InsertTasks(ctx, queued, link.Build); err != nil {
		return nil, notSent(err)
	}
	s.audit.Appended(link)
	return envs, nil
}

// sendLink is the task.send record rec names target with.
func (s *Server) sendLink(rec audit.Event, target string) (*audit.Link, error) {
	rec.Action, rec.Target, rec.Result = "task.send", target, audit.ResultOK
	return s.audit.Builder(rec)
}

// sendTarget is a send's audit target: its tasks (one, or one per page of
// nodes) and how many nodes they were queued for.
func sendTarget(envs []task.Envelope, nodes int) string {
	if len(envs) > 1 {
		return fmt.Sprintf("tasks %s…%s (%d, one per page of nodes) %s to %s", envs[0].TaskID, envs[len(envs)-1].TaskID, len(envs), envs[0].TaskType, nodeCount(nodes))
	}
	return fmt.Sprintf("task %s %s to %s", envs[0].TaskID, envs[0].TaskType, nodeCount(nodes))
}

// notSent says a send's write failed: nothing was queued, as a task goes
// out with its record or not at all.
func notSent(err error) error {
	return fmt.Errorf("task not sent: it is queued with its task.send record or not at all, and the write failed: %w", err)
}

// signTasks signs one task per page of nodes, as queueTasks queues them.
func (s *Server) signTasks(ctx context.Context, env task.Envelope, pages [][]string, lifetime time.Duration, actor string) ([]task.Envelope, []store.QueuedTask, error) {
	now, err := s.store.Now(ctx)
	if err != nil {
		return nil, nil, err
	}
	version, sign, err := s.signers.ActiveSigner(ctx)
	if err != nil {
		return nil, nil, err
	}
	env.SignerVersionID = version
	// A caller may date the task earlier (a rotate task is dated by its
	// staging, from which its lead time counts), never later.
	if env.IssuedAt.IsZero() || env.IssuedAt.After(now) {
		env.IssuedAt = now
	}
	env.IssuedAt = env.IssuedAt.UTC().Truncate(time.Second)
	env.ExpiresAt = env.IssuedAt.Add(lifetime)
	if env.Params == nil {
		env.Params = map[string]string{}
	}
	envs := make([]task.Envelope, 0, len(pages))
	queued := make([]store.QueuedTask, 0, len(pages))
	for _, nodes := range pages {
		e := env
		e.TaskID = uuid.NewString()
		if len(env.Target.NodeIDs) > 0 {
			e.Target = task.Target{NodeIDs: nodes}
		}
		signed, err := e.Sign(sign)
		if err != nil {
			return nil, nil, err
		}
		envs = append(envs, e)
		queued = append(queued, store.QueuedTask{Task: store.Task{ID: e.TaskID, Type: e.TaskType, SignerVersionID: version, Signed: signed,
			CreatedBy: actor, CreatedAt: now, ExpiresAt: e.ExpiresAt}, NodeIDs: nodes})
	}
	return envs, queued, nil
}

// nodesFor resolves a target other than all to node IDs: the named ones
// (each must exist; a node named twice is queued once — split into
// pages, it would otherwise be named by two tasks, and run both), or
// those whose join token carries every label (one query). A send to all
// never holds the fleet's IDs: queueToAll reads them a page at a time.
func (s *Server) nodesFor(ctx context.Context, t task.Target) ([]string, error) {
	if len(t.NodeIDs) > 0 {
		ids := slices.Clone(t.NodeIDs)
		slices.Sort(ids)
		ids = slices.Compact(ids)
		missing, err := s.store.MissingNodes(ctx, ids)
		if err != nil {
			return nil, err
		}
		if len(missing) > 0 {
			return nil, status.Errorf(codes.NotFound, "no node %s (`muster agents list` lists the enrolled nodes)", missing[0])
		}
		return ids, nil
	}
	return s.store.NodesWithLabels(ctx, t.Labels)
}

func (a *adminService) SendTask(ctx context.Context, req *musterv1.SendTaskRequest) (*musterv1.SendTaskResponse, error) {
	resp, err := a.sendTask(ctx, req)
	if err != nil {
		// A send is recorded with its write; a refusal here.
		err = toStatus(ctx, a.s.log, err)
		a.record(ctx, "task.send", "", err)
		return nil, err
	}
	return resp, nil
}

func (a *adminService) sendTask(ctx context.Context, req *musterv1.SendTaskRequest) (*musterv1.SendTaskResponse, error) {
	if req.TaskType == task.TypeRotateSigningKey {
		return nil, badRequest("node.rotate_signing_key is sent by muster signer stage only")
	}
	lifetime, err := optionalDuration("expires", req.Expires, task.DefaultExpires)
	if err != nil {
		return nil, err
	}
	if lifetime > task.MaxLifetime {
		return nil, badRequest(fmt.Sprintf("expires must be at most %s", task.MaxLifetime))
	}
	target := task.Target{NodeIDs: req.NodeIds, Labels: req.Labels, All: req.All}
	// Before anything is read: a target of no kind would resolve to no
	// nodes, and one of several kinds to one of them.
	if err := target.CheckKind(); err != nil {
		return nil, badRequest(err.Error())
	}
	c := callerFrom(ctx)
	rec := audit.Event{Actor: c.Actor(), Source: c.Source, CorrelationID: c.CorrelationID}
	if req.All {
		// The envelope's own check reports malformed input before
		// anything is signed or read.
		env := task.Envelope{TaskType: req.TaskType, Target: target, Params: req.Params}
		if err := checkEnvelope(env, lifetime); err != nil {
			return nil, err
		}
		env, n, listed, err := a.s.queueToAll(ctx, env, lifetime, rec)
		if err != nil {
			return nil, signedRefusal(err)
		}
		return sendAnswer([]task.Envelope{env}, n, listed), nil
	}
	nodes, err := a.s.nodesFor(ctx, target)
	if err != nil {
		return nil, err
	}
	if len(req.Labels) > 0 {
		// Agents do not know their token's labels: a label selector is
		// resolved here, and each task names the nodes it chose.
		target = task.Target{NodeIDs: nodes}
		if len(nodes) == 0 {
			return nil, status.Error(codes.FailedPrecondition, "no node joined with a token carrying these labels (`muster token list` shows the tokens' labels; the nodes of a token deleted or cleaned up are in no label selection)")
		}
	}
	env := task.Envelope{TaskType: req.TaskType, Target: target, Params: req.Params}
	// A node list (named or selected) longer than one signed task may hold
	// is sent as one task per page, each naming its nodes.
	pages := env.Pages(nodes)
	probe := env
	probe.Target = task.Target{NodeIDs: pages[0]}
	if err := checkEnvelope(probe, lifetime); err != nil {
		return nil, err
	}
	envs, err := a.s.queueTasks(ctx, env, pages, lifetime, rec)
	if err != nil {
		return nil, signedRefusal(err)
	}
	return sendAnswer(envs, len(nodes), nodes[:min(len(nodes), maxListedNodes)]), nil
}

// nodeCount is "1 node" or "N nodes", for audit targets.
func nodeCount(n int) string {
	if n == 1 {
		return "1 node"
	}
	return fmt.Sprintf("%d nodes", n)
}

// signedRefusal refuses a task that, signed, is larger than an agent
// accepts, as bad input; other errors pass.
func signedRefusal(err error) error {
	if errors.Is(err, task.ErrMalformed) {
		return badRequest(err.Error())
	}
	return err
}

// checkEnvelope runs the envelope's own check on env as it would be
// signed (an ID, a signer, the times filled), so malformed input is
// refused before anything is signed or queued.
func checkEnvelope(env task.Envelope, lifetime time.Duration) error {
	env.TaskID, env.SignerVersionID, env.IssuedAt, env.ExpiresAt = uuid.NewString(), "v1", time.Now(), time.Now().Add(lifetime)
	if env.Params == nil {
		env.Params = map[string]string{}
	}
	if err := env.Check(); err != nil {
		return badRequest(err.Error())
	}
	return nil
}

// sendAnswer is a send's answer: every task, how many nodes they were
// queued for, and listed, the first of those nodes (at most
// maxListedNodes).
func sendAnswer(envs []task.Envelope, queued int, listed []string) *musterv1.SendTaskResponse {
	resp := &musterv1.SendTaskResponse{TaskId: envs[0].TaskID, NodeIds: listed, SignerVersionId: envs[0].SignerVersionID,
		ExpiresAt: timestamppb.New(envs[0].ExpiresAt), NodeCount: int64(queued)}
	for _, e := range envs {
		resp.TaskIds = append(resp.TaskIds, e.TaskID)
	}
	return resp
}

// queueRotation sends node.rotate_signing_key for a staged signer to every
// enrolled agent, signed by the active signer, to arrive before the new
// signer's effective time (agents that miss it learn the signer from the
// verifier set). stepAt is the time of the step that staged it
// (signer.Result.At), which dates the task (signer.RolloutIssuedAt).
func (s *Server) queueRotation(ctx context.Context, staged signer.Signer, stepAt time.Time, actor string) {
	err := func() error {
		now, err := s.store.Now(ctx)
		if err != nil {
			return err
		}
		issued := signer.RolloutIssuedAt(stepAt, now)
		lifetime := min(staged.EffectiveAt.Sub(issued), task.MaxLifetime)
		env := task.Envelope{TaskType: task.TypeRotateSigningKey, Target: task.Target{All: true}, IssuedAt: issued,
			Params: task.RotateParams(staged.VersionID, staged.PublicKey, staged.EffectiveAt, staged.GraceUntil)}
		_, _, _, err = s.queueToAll(ctx, env, lifetime, audit.Event{Actor: actor, Reason: "rollout of signer " + staged.VersionID})
		return err
	}()
	if err != nil {
		s.log.Error("cannot queue the rotate task; agents learn the staged signer from the verifier set", "err", err, "signer_version_id", staged.VersionID)
	}
}

// rotationOf is the staged signer a step left, if any.
func rotationOf(res signer.Result) (signer.Signer, bool) {
	i := slices.IndexFunc(res.Changes, func(c signer.Change) bool { return c.To.State == signer.Staged })
	if i < 0 {
		return signer.Signer{}, false
	}
	return res.Changes[i].To, true
}

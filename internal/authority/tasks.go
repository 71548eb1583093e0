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

// queueTask signs env (its ID, issue time and signer are filled here)
// with the active signer and queues it for nodes.
func (s *Server) queueTask(ctx context.Context, env task.Envelope, nodes []string, lifetime time.Duration, actor string) (task.Envelope, error) {
	envs, err := s.queueTasks(ctx, env, [][]string{nodes}, lifetime, actor)
	if err != nil {
		return task.Envelope{}, err
	}
	return envs[0], nil
}

// queueTasks signs one task per page of nodes with the active signer, the
// same issue time and expiry for all, each page its own task ID and, when
// env targets node IDs, the page as its signed target; the tasks are
// queued in one transaction, all or none.
func (s *Server) queueTasks(ctx context.Context, env task.Envelope, pages [][]string, lifetime time.Duration, actor string) ([]task.Envelope, error) {
	now, err := s.store.Now(ctx)
	if err != nil {
		return nil, err
	}
	version, sign, err := s.signers.ActiveSigner(ctx)
	if err != nil {
		return nil, err
	}
	env.SignerVersionID = version
	env.IssuedAt = now.UTC().Truncate(time.Second)
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
			return nil, err
		}
		envs = append(envs, e)
		queued = append(queued, store.QueuedTask{Task: store.Task{ID: e.TaskID, Type: e.TaskType, SignerVersionID: version, Signed: signed,
			CreatedBy: actor, CreatedAt: now, ExpiresAt: e.ExpiresAt}, NodeIDs: nodes})
	}
	return envs, s.store.InsertTasks(ctx, queued)
}

// nodesFor resolves a target to node IDs: every node, the named ones
// (each must exist; a node named twice is queued once — split into
// pages, it would otherwise be named by two tasks, and run both), or
// those whose join token carries every label (one query).
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
			return nil, status.Errorf(codes.NotFound, "no node %s", missing[0])
		}
		return ids, nil
	}
	if !t.All {
		return s.store.NodesWithLabels(ctx, t.Labels)
	}
	nodes, err := s.store.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, n.ID)
	}
	return out, nil
}

func (a *adminService) SendTask(ctx context.Context, req *musterv1.SendTaskRequest) (*musterv1.SendTaskResponse, error) {
	resp, target, err := a.sendTask(ctx, req)
	err = toStatus(ctx, a.s.log, err)
	a.record(ctx, "task.send", target, err)
	return resp, err
}

func (a *adminService) sendTask(ctx context.Context, req *musterv1.SendTaskRequest) (*musterv1.SendTaskResponse, string, error) {
	if req.TaskType == task.TypeRotateSigningKey {
		return nil, "", badRequest("node.rotate_signing_key is sent by muster signer stage only")
	}
	lifetime, err := optionalDuration("expires", req.Expires, task.DefaultExpires)
	if err != nil {
		return nil, "", err
	}
	if lifetime > task.MaxLifetime {
		return nil, "", badRequest(fmt.Sprintf("expires must be at most %s", task.MaxLifetime))
	}
	target := task.Target{NodeIDs: req.NodeIds, Labels: req.Labels, All: req.All}
	nodes, err := a.s.nodesFor(ctx, target)
	if err != nil {
		return nil, "", err
	}
	if len(req.Labels) > 0 {
		// Agents do not know their token's labels: a label selector is
		// resolved here, and each task names the nodes it chose.
		target = task.Target{NodeIDs: nodes}
		if len(nodes) == 0 {
			return nil, "", status.Error(codes.FailedPrecondition, "no node joined with a token carrying these labels")
		}
	}
	env := task.Envelope{TaskType: req.TaskType, Target: target, Params: req.Params}
	// A node list (named or selected) longer than one signed task may hold
	// is sent as one task per page, each naming its nodes; --all is one
	// task every agent accepts.
	pages := [][]string{nodes}
	if len(target.NodeIDs) > 0 {
		pages = env.Pages(nodes)
	}
	// The envelope's own check reports malformed input before anything is
	// signed.
	probe := env
	probe.TaskID, probe.SignerVersionID, probe.IssuedAt, probe.ExpiresAt = uuid.NewString(), "v1", time.Now(), time.Now().Add(lifetime)
	if len(target.NodeIDs) > 0 {
		probe.Target = task.Target{NodeIDs: pages[0]}
	}
	if probe.Params == nil {
		probe.Params = map[string]string{}
	}
	if err := probe.Check(); err != nil {
		return nil, "", badRequest(err.Error())
	}
	envs, err := a.s.queueTasks(ctx, env, pages, lifetime, callerFrom(ctx).Actor())
	if errors.Is(err, task.ErrMalformed) {
		// Signed, it is larger than an agent accepts.
		return nil, "", badRequest(err.Error())
	} else if err != nil {
		return nil, "", err
	}
	resp := &musterv1.SendTaskResponse{TaskId: envs[0].TaskID, NodeIds: nodes, SignerVersionId: envs[0].SignerVersionID,
		ExpiresAt: timestamppb.New(envs[0].ExpiresAt)}
	for _, e := range envs {
		resp.TaskIds = append(resp.TaskIds, e.TaskID)
	}
	what := fmt.Sprintf("task %s %s to %d nodes", envs[0].TaskID, req.TaskType, len(nodes))
	if len(envs) > 1 {
		what = fmt.Sprintf("tasks %s…%s (%d, one per page of nodes) %s to %d nodes", envs[0].TaskID, envs[len(envs)-1].TaskID, len(envs), req.TaskType, len(nodes))
	}
	return resp, what, nil
}

// queueRotation sends node.rotate_signing_key for a staged signer to every
// enrolled agent, signed by the active signer, to arrive before the new
// signer's effective time (agents that miss it learn the signer from the
// verifier set).
func (s *Server) queueRotation(ctx context.Context, staged signer.Signer, actor string) {
	err := func() error {
		nodes, err := s.nodesFor(ctx, task.Target{All: true})
		if err != nil || len(nodes) == 0 {
			return err
		}
		now, err := s.store.Now(ctx)
		if err != nil {
			return err
		}
		lifetime := min(staged.EffectiveAt.Sub(now), task.MaxLifetime)
		env := task.Envelope{TaskType: task.TypeRotateSigningKey, Target: task.Target{All: true},
			Params: task.RotateParams(staged.VersionID, staged.PublicKey, staged.EffectiveAt, staged.GraceUntil)}
		env, err = s.queueTask(ctx, env, nodes, lifetime, actor)
		if err != nil {
			return err
		}
		s.audit.Record(context.WithoutCancel(ctx), audit.Event{Actor: actor, Action: "task.send", Target: fmt.Sprintf("task %s %s to %d nodes", env.TaskID, env.TaskType, len(nodes)),
			Result: audit.ResultOK, Reason: "rollout of signer " + staged.VersionID})
		return nil
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

package authority

import (
	"context"
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
	now, err := s.store.Now(ctx)
	if err != nil {
		return task.Envelope{}, err
	}
	version, sign, err := s.signers.ActiveSigner(ctx)
	if err != nil {
		return task.Envelope{}, err
	}
	env.TaskID, env.SignerVersionID = uuid.NewString(), version
	env.IssuedAt = now.UTC().Truncate(time.Second)
	env.ExpiresAt = env.IssuedAt.Add(lifetime)
	if env.Params == nil {
		env.Params = map[string]string{}
	}
	signed, err := env.Sign(sign)
	if err != nil {
		return task.Envelope{}, err
	}
	err = s.store.InsertTask(ctx, store.Task{ID: env.TaskID, Type: env.TaskType, SignerVersionID: version, Signed: signed,
		CreatedBy: actor, CreatedAt: now, ExpiresAt: env.ExpiresAt}, nodes)
	return env, err
}

// nodesFor resolves a target to node IDs: every node, the named ones
// (each must exist), or those whose join token carries every label.
func (s *Server) nodesFor(ctx context.Context, t task.Target) ([]string, error) {
	if len(t.NodeIDs) > 0 {
		missing, err := s.store.MissingNodes(ctx, t.NodeIDs)
		if err != nil {
			return nil, err
		}
		if len(missing) > 0 {
			return nil, status.Errorf(codes.NotFound, "no node %s", missing[0])
		}
		return t.NodeIDs, nil
	}
	nodes, err := s.store.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range nodes {
		if !t.All {
			tok, err := s.store.GetToken(ctx, n.TokenID)
			if err != nil || !t.Matches(n.ID, tok.Labels) {
				continue
			}
		}
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
		// resolved here, and the task names the nodes it chose.
		target = task.Target{NodeIDs: nodes}
		if len(nodes) == 0 {
			return nil, "", status.Error(codes.FailedPrecondition, "no node joined with a token carrying these labels")
		}
	}
	env := task.Envelope{TaskType: req.TaskType, Target: target, Params: req.Params}
	// The envelope's own check reports malformed input before anything is
	// signed.
	probe := env
	probe.TaskID, probe.SignerVersionID, probe.IssuedAt, probe.ExpiresAt = uuid.NewString(), "v1", time.Now(), time.Now().Add(lifetime)
	if probe.Params == nil {
		probe.Params = map[string]string{}
	}
	if err := probe.Check(); err != nil {
		return nil, "", badRequest(err.Error())
	}
	env, err = a.s.queueTask(ctx, env, nodes, lifetime, callerFrom(ctx).Actor())
	if err != nil {
		return nil, "", err
	}
	return &musterv1.SendTaskResponse{TaskId: env.TaskID, NodeIds: nodes, SignerVersionId: env.SignerVersionID,
		ExpiresAt: timestamppb.New(env.ExpiresAt)}, fmt.Sprintf("task %s %s to %d nodes", env.TaskID, env.TaskType, len(nodes)), nil
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

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/task"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// refusalOf is the answer to a task acceptTask did not take.
func (a *Agent) refusalOf(env task.Envelope, err error) *musterv1.TaskResult {
	var re *task.RefusalError
	if errors.As(err, &re) {
		a.log.Warn("task refused", "task_id", re.TaskID, "reason", re.Reason, "signer_version_id", re.SignerVersionID, "detail", re.Detail)
		a.metrics.taskRefused()
		a.countFailure(re.SignerVersionID)
		return &musterv1.TaskResult{TaskId: re.TaskID, State: store.TaskRefused, Reason: string(re.Reason), SignerVersionId: re.SignerVersionID, Detail: re.Detail}
	}
	return &musterv1.TaskResult{TaskId: env.TaskID, State: store.TaskFailed, SignerVersionId: env.SignerVersionID, Detail: err.Error()}
}

// runAccepted runs a task acceptTask took and returns the answer for the
// authority.
func (a *Agent) runAccepted(ctx context.Context, t acceptedTask) *musterv1.TaskResult {
	out := &musterv1.TaskResult{TaskId: t.env.TaskID, State: store.TaskOK, SignerVersionId: t.env.SignerVersionID}
	detail, err := t.run(ctx)
	if err != nil {
		out.State, detail = store.TaskFailed, err.Error()
	}
	if len(detail) > maxHandlerOutput {
		detail = detail[:maxHandlerOutput]
	}
	out.Detail = detail
	a.log.Info("task done", "task_id", t.env.TaskID, "task_type", t.env.TaskType, "state", out.State)
	return out
}

// acceptTask verifies a task and, with the directory locked, remembers it
// (in the persisted replay window, before it runs, so it runs at most
// once, even across a crash) and takes what a rotate task brings. It
// returns what is left to run outside the lock.
func (a *Agent) acceptTask(ctx context.Context, raw []byte) (task.Envelope, func(context.Context) (string, error), error) {
	unlock, err := a.dir.lock(ctx)
	if err != nil {
		return task.Envelope{}, nil, err
	}
	defer unlock()
	st, err := a.dir.ReadState()
	if err != nil {
		return task.Envelope{}, nil, err
	}
	trust, err := a.trustOf(st)
	if err != nil {
		return task.Envelope{}, nil, err
	}
	window := task.NewWindow(st.RecentTasks)
	window.Prune(a.now())
	v := &task.Verifier{NodeID: st.NodeID, Keys: trust, Window: window, Now: a.now}
	env, err := v.Verify(raw)
	if err != nil {
		return env, nil, err
	}
	st.RecentTasks = window.Entries()
	var run func(context.Context) (string, error)
	switch env.TaskType {
	case task.TypeRotateSigningKey:
		// The lead time is the authority's signer.min_lead_time, as the
		// held verifier set names it.
		key, err := task.ValidateRotate(env, trust, trust.MinLeadTime(), a.now())
		if err == nil {
			err = trust.AddStaged(key)
		}
		if err != nil {
			// Remembered, so a replay is refused as such.
			if werr := a.dir.writeState(st); werr != nil {
				return env, nil, werr
			}
			var re *task.RefusalError
			if !errors.As(err, &re) {
				err = &task.RefusalError{Reason: task.ReasonInvalidRotate, SignerVersionID: env.SignerVersionID, TaskID: env.TaskID, Detail: err.Error()}
			}
			return env, nil, err
		}
		st.StagedVerifiers, st.LastRotateTask = trust.Pending(), env.TaskID
		run = func(context.Context) (string, error) {
			return fmt.Sprintf("staged signer %s, effective %s", key.VersionID, key.EffectiveAt.UTC().Format(time.RFC3339)), nil
		}
	case task.TypeRenewNow:
		run = func(ctx context.Context) (string, error) {
			st, err := a.Renew(ctx)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("renewed: generation %d, serial %s", st.Generation, st.Serial), nil
		}
	case task.TypeReport:
		run = func(ctx context.Context) (string, error) {
			s, err := a.Status()
			if err != nil {
				return "", err
			}
			b, err := json.Marshal(s)
			return string(b), err
		}
	default:
		handlers, err := a.dir.ReadTaskHandlers()
		if err != nil {
			return env, nil, err
		}
		handler, ok := handlers.Handlers[env.TaskType]
		if !ok {
			if werr := a.dir.writeState(st); werr != nil {
				return env, nil, werr
			}
			return env, nil, &task.RefusalError{Reason: task.ReasonNoHandler, SignerVersionID: env.SignerVersionID, TaskID: env.TaskID,
				Detail: "task-handlers.yaml maps " + env.TaskType + " to no handler"}
		}
		run = func(ctx context.Context) (string, error) { return runHandler(ctx, handler, env) }
	}
	if err := a.dir.writeState(st); err != nil {
		return env, nil, err
	}
	return env, run, nil
}

// maxFailureKeys bounds the signer versions counted, whatever tasks name.
const maxFailureKeys = 32

func (a *Agent) countFailure(version string) {
	a.failuresMu.Lock()
	defer a.failuresMu.Unlock()
	if a.failures == nil {
		a.failures = map[string]int64{}
	}
	if _, ok := a.failures[version]; ok || len(a.failures) < maxFailureKeys {
		a.failures[version]++
	}
}

func (a *Agent) failureCounts() map[string]int64 {
	a.failuresMu.Lock()
	defer a.failuresMu.Unlock()
	out := make(map[string]int64, len(a.failures))
	for k, v := range a.failures {
		out[k] = v
	}
	return out
}

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os/exec"
	"path/filepath"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/task"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// Limits of custom task handlers.
const (
	handlerTimeout   = time.Minute
	maxHandlerOutput = 4096
)

// handleTask verifies one signed task, records its ID in the persisted
// replay window before running it (so it runs at most once, even across a
// crash), runs it and returns the answer for the authority.
func (a *Agent) handleTask(ctx context.Context, raw []byte) *musterv1.TaskResult {
	env, run, err := a.acceptTask(ctx, raw)
	var re *task.RefusalError
	switch {
	case errors.As(err, &re):
		a.log.Warn("task refused", "task_id", re.TaskID, "reason", re.Reason, "signer_version_id", re.SignerVersionID, "detail", re.Detail)
		a.metrics.taskRefused()
		a.countFailure(re.SignerVersionID)
		return &musterv1.TaskResult{TaskId: re.TaskID, State: store.TaskRefused, Reason: string(re.Reason), SignerVersionId: re.SignerVersionID, Detail: re.Detail}
	case err != nil:
		return &musterv1.TaskResult{TaskId: env.TaskID, State: store.TaskFailed, SignerVersionId: env.SignerVersionID, Detail: err.Error()}
	}
	out := &musterv1.TaskResult{TaskId: env.TaskID, State: store.TaskOK, SignerVersionId: env.SignerVersionID}
	detail, err := run(ctx)
	if err != nil {
		out.State, detail = store.TaskFailed, err.Error()
	}
	if len(detail) > maxHandlerOutput {
		detail = detail[:maxHandlerOutput]
	}
	out.Detail = detail
	a.log.Info("task done", "task_id", env.TaskID, "task_type", env.TaskType, "state", out.State)
	return out
}

// acceptTask verifies a task and, with the directory locked, remembers it
// and takes what a rotate task brings. It returns what is left to run
// outside the lock.
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
		handler := handlers.Handlers[env.TaskType]
		if handler == "" {
			if werr := a.dir.writeState(st); werr != nil {
				return env, nil, werr
			}
			return env, nil, &task.RefusalError{Reason: task.ReasonNoHandler, SignerVersionID: env.SignerVersionID, TaskID: env.TaskID,
				Detail: "task-handlers.yaml maps " + env.TaskType + " to no handler"}
		}
		params := env.Params
		run = func(ctx context.Context) (string, error) { return runHandler(ctx, handler, params) }
	}
	if err := a.dir.writeState(st); err != nil {
		return env, nil, err
	}
	return env, run, nil
}

// runHandler runs a custom task's handler: params as JSON on standard
// input, standard output and error (bounded) as the detail, a non-zero
// exit as a failure.
func runHandler(ctx context.Context, path string, params map[string]string) (string, error) {
	in, err := json.Marshal(params)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, handlerTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path)
	cmd.Stdin = bytes.NewReader(in)
	out := &boundedBuffer{max: maxHandlerOutput}
	cmd.Stdout, cmd.Stderr = out, out
	err = cmd.Run()
	if err != nil {
		return "", fmt.Errorf("handler %s: %v: %s", path, err, out.String())
	}
	return out.String(), nil
}

// boundedBuffer keeps the first max bytes written and discards the rest,
// so a handler cannot make the agent hold unbounded output.
type boundedBuffer struct {
	buf bytes.Buffer
	max int
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *boundedBuffer) String() string { return b.buf.String() }

// TaskHandlers is ADIR/task-handlers.yaml: the executables that run custom
// task types. A custom type not listed is refused (no_handler).
type TaskHandlers struct {
	Handlers map[string]string `yaml:"handlers"`
}

// TaskHandlersFile is where the handlers are configured.
func (d Dir) TaskHandlersFile() string { return d.path("task-handlers.yaml") }

// ReadTaskHandlers reads task-handlers.yaml; a missing file maps nothing.
// Unknown keys are refused, and every handler must be an absolute path.
func (d Dir) ReadTaskHandlers() (TaskHandlers, error) {
	var h TaskHandlers
	data, err := readSmall(d.TaskHandlersFile())
	if errors.Is(err, fs.ErrNotExist) {
		return h, nil
	} else if err != nil {
		return h, fmt.Errorf("agent: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&h); err != nil && !errors.Is(err, io.EOF) {
		return TaskHandlers{}, fmt.Errorf("agent: %s is not valid: %v", d.TaskHandlersFile(), err)
	}
	for typ, path := range h.Handlers {
		if !filepath.IsAbs(path) {
			return TaskHandlers{}, fmt.Errorf("agent: %s: the handler of %s must be an absolute path", d.TaskHandlersFile(), typ)
		}
	}
	return h, nil
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

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/muster-dev/muster/internal/task"
)

// Limits of custom task handlers.
const (
	// DefaultHandlerTimeout is a handler's time limit unless its entry
	// names one; MaxHandlerTimeout the most an entry may name.
	DefaultHandlerTimeout = time.Minute
	MaxHandlerTimeout     = time.Hour
	maxHandlerOutput      = 4096
	// handlerWaitDelay is how long the agent waits for a handler's output
	// to close once the handler has exited or been killed: a child it
	// left running (`sleep 600 &`) may hold standard output open, and
	// the answer does not wait for it (the child is killed after it).
	handlerWaitDelay = 2 * time.Second
)

// handlerEnvAllowed are the variables of the agent's environment every
// handler gets, besides the LC_* locale variables; anything else only
// if its entry names it (env), and never a MUSTER_* one: the agent's
// environment may carry its join secrets (MUSTER_BOOTSTRAP_PSK,
// MUSTER_JOIN_TOKEN, MUSTER_JOIN_URI), and a handler's output goes to
// the audit log.
var handlerEnvAllowed = map[string]bool{"PATH": true, "HOME": true, "USER": true, "LOGNAME": true, "LANG": true, "TZ": true, "TMPDIR": true}

// envName is what a variable an entry names must look like.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// TaskHandlers is ADIR/task-handlers.yaml: the executables that run custom
// task types. A custom type not listed is refused (no_handler).
type TaskHandlers struct {
	Handlers map[string]Handler `yaml:"handlers"`
}

// Handler is one entry of task-handlers.yaml: either an absolute path
// alone, or {path, env, timeout}.
type Handler struct {
	// Path is the executable, an absolute path.
	Path string `yaml:"path"`
	// Env names variables of the agent's environment passed on to the
	// handler beside the allow-list; no MUSTER_* name.
	Env []string `yaml:"env"`
	// Timeout is the handler's time limit (0: DefaultHandlerTimeout).
	Timeout time.Duration `yaml:"timeout"`
}

// UnmarshalYAML takes a path alone or a mapping with known keys only.
func (h *Handler) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*h = Handler{Path: n.Value}
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: a handler is a path or a mapping of path, env and timeout", n.Line)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		switch k := n.Content[i].Value; k {
		case "path", "env", "timeout":
		default:
			return fmt.Errorf("line %d: field %s not found in a handler (path, env, timeout)", n.Content[i].Line, k)
		}
	}
	type plain Handler
	return n.Decode((*plain)(h))
}

// timeout is the handler's time limit.
func (h Handler) timeout() time.Duration {
	if h.Timeout == 0 {
		return DefaultHandlerTimeout
	}
	return h.Timeout
}

// check says what is wrong with an entry.
func (h Handler) check() error {
	if !filepath.IsAbs(h.Path) {
		return errors.New("the handler must be an absolute path")
	}
	if h.Timeout < 0 || h.Timeout > MaxHandlerTimeout {
		return fmt.Errorf("timeout %s is outside 0 (the default, %s) to %s", h.Timeout, DefaultHandlerTimeout, MaxHandlerTimeout)
	}
	for _, name := range h.Env {
		if !envName.MatchString(name) {
			return fmt.Errorf("env: %q is not a variable name", name)
		}
		if strings.HasPrefix(strings.ToUpper(name), "MUSTER_") {
			return fmt.Errorf("env: %s is refused: MUSTER_* variables carry the agent's own settings and secrets (the bootstrap PSK, join tokens and URIs) and are never given to a handler", name)
		}
	}
	return nil
}

// TaskHandlersFile is where the handlers are configured.
func (d Dir) TaskHandlersFile() string { return d.path("task-handlers.yaml") }

// ReadTaskHandlers reads task-handlers.yaml; a missing file maps nothing.
// Unknown keys are refused, every handler must be an absolute path, and
// an entry naming a MUSTER_* variable is refused.
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
	for typ, hd := range h.Handlers {
		if err := hd.check(); err != nil {
			return TaskHandlers{}, fmt.Errorf("agent: %s: %s: %v", d.TaskHandlersFile(), typ, err)
		}
	}
	return h, nil
}

// handlerEnv is a handler's whole environment, from the agent's: the
// allow-list, the LC_* variables, what the entry names, and the task's
// ID and type. Nothing else of the agent's environment passes.
func handlerEnv(environ []string, h Handler, env task.Envelope) []string {
	named := map[string]bool{}
	for _, n := range h.Env {
		named[n] = true
	}
	var out []string
	for _, kv := range environ {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || strings.HasPrefix(strings.ToUpper(k), "MUSTER_") {
			continue
		}
		if handlerEnvAllowed[k] || strings.HasPrefix(k, "LC_") || named[k] {
			out = append(out, kv)
		}
	}
	return append(out, "MUSTER_TASK_ID="+env.TaskID, "MUSTER_TASK_TYPE="+env.TaskType)
}

// runHandler runs a custom task's handler: params as JSON on standard
// input, standard output and error (bounded) as the detail, a non-zero
// exit as a failure. At its time limit the handler's whole process group
// is killed (a child it started dies with it), and the answer waits for
// its output at most handlerWaitDelay after it exited or was killed. Once
// it has ended, however, the rest of its group is killed too: a child it
// left running would have no time limit.
func runHandler(ctx context.Context, h Handler, env task.Envelope) (string, error) {
	in, err := json.Marshal(env.Params)
	if err != nil {
		return "", err
	}
	limit := h.timeout()
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.Path)
	inGroup(cmd)
	cmd.WaitDelay = handlerWaitDelay
	cmd.Env = handlerEnv(os.Environ(), h, env)
	cmd.Stdin = bytes.NewReader(in)
	out := &boundedBuffer{max: maxHandlerOutput}
	cmd.Stdout, cmd.Stderr = out, out
	err = cmd.Run()
	killGroup(cmd)
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return "", fmt.Errorf("handler %s: killed at its time limit of %s (with its process group): %s", h.Path, limit, out.String())
	case errors.Is(err, exec.ErrWaitDelay):
		// It exited 0 and left a child holding its output: its answer is
		// what it wrote until then.
		return out.String(), nil
	case err != nil:
		return "", fmt.Errorf("handler %s: %v: %s", h.Path, err, out.String())
	}
	return out.String(), nil
}

// boundedBuffer keeps the first max bytes written and discards the rest,
// so a handler cannot make the agent hold unbounded output. It is written
// by the handler's output copier and read once the handler's wait ended,
// or by a late copier after WaitDelay gave up on it: hence the lock.
type boundedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *boundedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

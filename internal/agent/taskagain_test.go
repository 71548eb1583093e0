package agent

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/task"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestTaskSentAgain: the authority sends a task again on each new stream
// until it records an answer, so a task whose stream closed while it ran,
// or whose answer went out on a stream that closed before the authority
// read it, comes again. It is not run again, and not answered replayed
// (the authority would record that, the first answer standing, and drop
// the real one): while it runs it is answered once, when it ends; once
// answered, with the same answer again. A task this runner never took is
// still answered replayed.
func TestTaskSentAgain(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	d := Dir(t.TempDir())
	if err := d.writeState(&State{NodeID: "n1"}); err != nil {
		t.Fatal(err)
	}
	// The handler runs until the test lets it end, and counts its runs.
	gate, runs := filepath.Join(t.TempDir(), "gate"), filepath.Join(t.TempDir(), "runs")
	h := script(t, "echo run >> "+runs+"\nwhile [ ! -e "+gate+" ]; do sleep 0.05; done\necho done\n")
	if err := os.WriteFile(d.TaskHandlersFile(), []byte("handlers:\n  site.wait: "+h+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := New(Options{Dir: d, StaticVerifiers: signer.EncodePublicKey(pub)})
	signed := func() ([]byte, string) {
		t.Helper()
		now := time.Now().UTC().Truncate(time.Second)
		env := task.Envelope{TaskID: uuid.NewString(), TaskType: "site.wait", Target: task.Target{NodeIDs: []string{"n1"}},
			Params: map[string]string{}, IssuedAt: now, ExpiresAt: now.Add(time.Hour), SignerVersionID: "v1"}
		raw, err := env.Sign(func(m []byte) ([]byte, error) { return ed25519.Sign(priv, m), nil })
		if err != nil {
			t.Fatal(err)
		}
		return raw, env.TaskID
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := newTaskRunner(ctx, a)
	defer r.wait()
	defer cancel()
	// next waits for the next answer, within.
	next := func(within time.Duration) *musterv1.TaskResult {
		t.Helper()
		deadline := time.After(within)
		for {
			if res := r.next(); res != nil {
				return res
			}
			select {
			case <-r.ready:
			case <-deadline:
				return nil
			}
		}
	}

	raw, id := signed()
	r.submit(raw)
	r.submit(raw) // sent again while it runs
	if res := next(time.Second); res != nil {
		t.Fatalf("a task sent again while it runs was answered at once: %v", res)
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	first := next(time.Minute)
	if first == nil || first.GetTaskId() != id || first.GetState() != store.TaskOK {
		t.Fatalf("the task's answer: %v", first)
	}
	if res := next(time.Second); res != nil {
		t.Fatalf("a second answer to one task: %v", res)
	}
	r.submit(raw) // sent again after its answer went out
	again := next(time.Minute)
	if again == nil || again.GetTaskId() != id || again.GetState() != first.GetState() || again.GetDetail() != first.GetDetail() {
		t.Fatalf("a task sent again after its answer: answered %v, want %v again", again, first)
	}
	if got, err := os.ReadFile(runs); err != nil || string(got) != "run\n" {
		t.Fatalf("the handler ran %q (%v), want once", got, err)
	}

	// A task taken before the agent restarted (a runner of its own): replayed.
	other := newTaskRunner(ctx, a)
	defer other.wait()
	other.submit(raw)
	res := other.next()
	if res == nil || res.GetState() != store.TaskRefused || res.GetReason() != string(task.ReasonReplayed) {
		t.Fatalf("a task the runner never took, sent again: %v, want refused replayed", res)
	}
}

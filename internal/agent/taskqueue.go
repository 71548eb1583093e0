package agent

import (
	"context"
	"fmt"
	"sync"

	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/task"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// taskQueueLen is how many tasks of one type may wait while one of that
// type runs. A task past it is not run: it is answered failed at once,
// saying so (and audited by the authority as task.result), never dropped
// silently.
const taskQueueLen = 8

// acceptedTask is a task acceptTask took: verified, remembered, to run.
type acceptedTask struct {
	env task.Envelope
	run func(context.Context) (string, error)
}

// taskRunner runs the tasks a stream brings off its receive loop: one
// task of a type at a time, in the order they came, types beside each
// other, so a slow handler delays no other type, no verifier set and no
// heartbeat. It outlives a stream: a task still running when its stream
// ends is answered on the next one, and tasks stop only with the agent.
//
// Answers wait in a list the stream that is open sends (next, requeue).
// It is safe for concurrent use.
type taskRunner struct {
	a   *Agent
	ctx context.Context
	wg  sync.WaitGroup

	mu      sync.Mutex
	queues  map[string]chan acceptedTask
	answers []*musterv1.TaskResult
	// ready has a value while answers wait.
	ready chan struct{}
}

func newTaskRunner(ctx context.Context, a *Agent) *taskRunner {
	return &taskRunner{a: a, ctx: ctx, queues: map[string]chan acceptedTask{}, ready: make(chan struct{}, 1)}
}

// submit verifies and remembers a task (in the caller, so tasks are taken
// in the order the stream brought them, between the verifier sets it
// brought), then queues it behind the running task of its type, or
// answers it at once: refused, or failed because its type's queue is
// full. It does not wait for the task to run.
func (r *taskRunner) submit(raw []byte) {
	env, run, err := r.a.acceptTask(r.ctx, raw)
	if err != nil {
		r.answer(r.a.refusalOf(env, err))
		return
	}
	r.enqueue(acceptedTask{env: env, run: run})
}

// enqueue queues t behind the running task of its type, or answers it
// failed if that type's queue is full.
func (r *taskRunner) enqueue(t acceptedTask) {
	env := t.env
	r.mu.Lock()
	q := r.queues[env.TaskType]
	if q == nil {
		// Only types the agent runs get here (built in, or mapped to a
		// handler), so the queues are few.
		q = make(chan acceptedTask, taskQueueLen)
		r.queues[env.TaskType] = q
		r.wg.Add(1)
		go r.work(q)
	}
	r.mu.Unlock()
	select {
	case q <- t:
	default:
		r.a.log.Warn("task not run: its type's queue is full", "task_id", env.TaskID, "task_type", env.TaskType, "queued", taskQueueLen)
		r.answer(&musterv1.TaskResult{TaskId: env.TaskID, State: store.TaskFailed, SignerVersionId: env.SignerVersionID,
			Detail: fmt.Sprintf("not run: the agent runs one %s task at a time and %d more were queued already; send it again later", env.TaskType, taskQueueLen)})
	}
}

// work runs one type's tasks in turn until the agent stops.
func (r *taskRunner) work(q chan acceptedTask) {
	defer r.wg.Done()
	for {
		select {
		case <-r.ctx.Done():
			for {
				select {
				case t := <-q:
					r.a.log.Warn("task not run: the agent is stopping", "task_id", t.env.TaskID, "task_type", t.env.TaskType)
				default:
					return
				}
			}
		case t := <-q:
			r.answer(r.a.runAccepted(r.ctx, t))
		}
	}
}

// wait returns once every running task has ended (the agent's context
// ended, which kills handlers).
func (r *taskRunner) wait() { r.wg.Wait() }

func (r *taskRunner) answer(res *musterv1.TaskResult) {
	r.mu.Lock()
	r.answers = append(r.answers, res)
	r.mu.Unlock()
	select {
	case r.ready <- struct{}{}:
	default:
	}
}

// next takes the oldest answer waiting; nil if none.
func (r *taskRunner) next() *musterv1.TaskResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.answers) == 0 {
		return nil
	}
	res := r.answers[0]
	r.answers[0] = nil
	r.answers = r.answers[1:]
	return res
}

// requeue puts back an answer a stream could not send, first.
func (r *taskRunner) requeue(res *musterv1.TaskResult) {
	r.mu.Lock()
	r.answers = append([]*musterv1.TaskResult{res}, r.answers...)
	r.mu.Unlock()
	select {
	case r.ready <- struct{}{}:
	default:
	}
}

package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/task"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// keptAnswers is how many of its last answers a taskRunner keeps, to send
// again when the authority sends their tasks again (answerAgain). The
// authority sends every unanswered task again on each new stream, a few
// seconds after the one that lost an answer closed: only the last answers
// are asked for. At most about 1 MiB (4 KiB of detail each).
const keptAnswers = 256

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
	// running are the tasks taken and not answered yet; given the last
	// answers given (at most keptAnswers, oldest first in givenOrder).
	running    map[string]bool
	given      map[string]*musterv1.TaskResult
	givenOrder []string
}

func newTaskRunner(ctx context.Context, a *Agent) *taskRunner {
	return &taskRunner{a: a, ctx: ctx, queues: map[string]chan acceptedTask{}, ready: make(chan struct{}, 1),
		running: map[string]bool{}, given: map[string]*musterv1.TaskResult{}}
}

// submit verifies and remembers a task (in the caller, so tasks are taken
// in the order the stream brought them, between the verifier sets it
// brought), then queues it behind the running task of its type, or
// answers it at once: refused, or failed because its type's queue is
// full. It does not wait for the task to run.
func (r *taskRunner) submit(raw []byte) {
	env, run, err := r.a.acceptTask(r.ctx, raw)
	if err != nil {
		if !r.answerAgain(err) {
			r.answer(r.a.refusalOf(env, err))
		}
		return
	}
	r.enqueue(acceptedTask{env: env, run: run})
}

// answerAgain answers a task the authority sent again, which the replay
// window refused (err), as this runner answered it before. The authority
// sends every task it holds no answer to again on each new stream: one
// whose stream closed while the task ran, or whose answer went out on a
// stream that closed before the authority read and recorded it (a stream
// closes each time the certificate it was opened with expires). Answered
// replayed, such a task was recorded refused, its first answer standing,
// and its real answer, later, dropped. Now a task still running is
// answered when it ends, and one answered already gets that answer again
// (the authority keeps the first it records). It reports whether it
// answered; it does not when the task is not one of this runner's (taken
// before the agent restarted, or answered longer ago than the last
// keptAnswers): replayed stands then.
func (r *taskRunner) answerAgain(err error) bool {
	var re *task.RefusalError
	if !errors.As(err, &re) || re.Reason != task.ReasonReplayed {
		return false
	}
	r.mu.Lock()
	running, res := r.running[re.TaskID], r.given[re.TaskID]
	r.mu.Unlock()
	switch {
	case running:
		r.a.log.Info("task sent again while it runs: answered when it ends", "task_id", re.TaskID)
	case res != nil:
		r.a.log.Info("task sent again after it was answered: its answer sent again", "task_id", re.TaskID, "state", res.GetState())
		r.queueAnswer(res)
	default:
		return false
	}
	return true
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
	r.running[env.TaskID] = true
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

// answer queues a task's answer for the stream, and keeps it to send
// again (answerAgain).
func (r *taskRunner) answer(res *musterv1.TaskResult) {
	r.mu.Lock()
	delete(r.running, res.GetTaskId())
	if _, ok := r.given[res.GetTaskId()]; !ok && res.GetTaskId() != "" {
		if len(r.givenOrder) == keptAnswers {
			delete(r.given, r.givenOrder[0])
			r.givenOrder[0] = ""
			r.givenOrder = r.givenOrder[1:]
		}
		r.givenOrder = append(r.givenOrder, res.GetTaskId())
	}
	r.given[res.GetTaskId()] = res
	r.mu.Unlock()
	r.queueAnswer(res)
}

// queueAnswer queues res for the stream.
func (r *taskRunner) queueAnswer(res *musterv1.TaskResult) {
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

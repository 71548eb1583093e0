package authority

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/muster-dev/muster/internal/audit"
)

// errReplaced ends a stream a newer one of the same agent replaced.
var errReplaced = errors.New("authority: replaced by a newer stream of the same agent")

// liveStreams holds the one live stream of each agent on this replica. An
// agent holds one stream; a new one from the same identity (an agent that
// reconnected before its old connection was seen to die, or a copy of its
// key) replaces the old, which is closed and the replacement audited. So
// one identity cannot hold thousands of streams on a replica; a node has
// one current instance (a later join supersedes the earlier, whose
// streams its standing closes), so this is one stream per instance too.
// The zero value is ready; it is safe for concurrent use.
type liveStreams struct {
	mu     sync.Mutex
	byNode map[string]*agentStream
}

// take makes st its node's live stream and returns the one it replaces,
// if any.
func (l *liveStreams) take(st *agentStream) *agentStream {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byNode == nil {
		l.byNode = map[string]*agentStream{}
	}
	old := l.byNode[st.c.ID.Name]
	l.byNode[st.c.ID.Name] = st
	return old
}

// drop forgets st, unless a newer stream replaced it already.
func (l *liveStreams) drop(st *agentStream) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byNode[st.c.ID.Name] == st {
		delete(l.byNode, st.c.ID.Name)
	}
}

// replace makes st its node's live stream, and closes and audits the one
// it replaces. The audit record goes through the refusals' flood guard:
// an identity reconnecting in a loop cannot flood the audit chain.
func (st *agentStream) replaceOld() {
	s := st.a.s
	old := s.live.take(st)
	if old == nil {
		return
	}
	old.replaced(errReplaced)
	reason := fmt.Sprintf("a new stream from %s replaced the stream opened at %s from %s", st.c.Source,
		old.row.ConnectedAt.UTC().Format(time.RFC3339), old.c.Source)
	st.a.streamLog(st.c).Info("agent stream replaced", "previous_source", old.c.Source, "previous_correlation_id", old.c.CorrelationID)
	s.refusals.Record(context.WithoutCancel(st.ctx), audit.Event{Actor: st.c.Actor(), Action: "agent.stream_replace",
		Target: st.c.ID.Name, Result: audit.ResultOK, Reason: reason, Source: st.c.Source, CorrelationID: st.c.CorrelationID})
}

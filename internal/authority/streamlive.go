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

// errStopping ends the streams of an authority that stops.
var errStopping = errors.New("authority: stopping")

// replacedError is the cause a replaced stream's context ends with: one
// value per replacement, so that of the two ways a stream learns it was
// replaced (this replica's newer stream, or the store's row naming a
// newer stream on any replica) only the one that ended it audits it.
type replacedError struct{}

func (*replacedError) Error() string { return errReplaced.Error() }
func (*replacedError) Unwrap() error { return errReplaced }

// endReplaced ends st as replaced, and reports whether this call ended it
// (not an earlier replacement, nor the stream's own end).
func (st *agentStream) endReplaced() bool {
	e := &replacedError{}
	st.replaced(e)
	return context.Cause(st.ctx) == e
}

// liveStreams holds the one live stream of each agent on this replica;
// across replicas, the store's stream row names the live one (supplanted). An
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
	if !old.endReplaced() {
		return // ended already: replaced through the store (supplanted), or gone
	}
	reason := fmt.Sprintf("a new stream from %s replaced the stream opened at %s from %s", st.c.Source,
		old.row.ConnectedAt.UTC().Format(time.RFC3339), old.c.Source)
	st.a.streamLog(st.c).Info("agent stream replaced", "previous_source", old.c.Source, "previous_correlation_id", old.c.CorrelationID)
	s.refusals.Record(context.WithoutCancel(st.ctx), audit.Event{Actor: st.c.Actor(), Action: "agent.stream_replace",
		Target: st.c.ID.Name, Result: audit.ResultOK, Reason: reason, Source: st.c.Source, CorrelationID: st.c.CorrelationID})
}

// supplanted reports whether the node's stream row names another stream
// than st, a newer one on any replica (it recorded the row after st did:
// RecordAgentStream announces ChangeStream, and st is woken by it, or st's
// heartbeat found the row taken). If so st is ended as replaced, audited
// like a replacement on this replica. A row that cannot be read leaves st
// open: the next change or heartbeat checks again.
func (st *agentStream) supplanted() bool {
	s := st.a.s
	row, err := s.store.GetAgentStream(st.ctx, st.row.NodeID)
	if err != nil || row.StreamID == st.row.StreamID {
		return false
	}
	if !st.endReplaced() {
		return st.ctx.Err() != nil && errors.Is(context.Cause(st.ctx), errReplaced)
	}
	reason := fmt.Sprintf("a new stream opened at %s on replica %s replaced the stream opened at %s from %s",
		row.ConnectedAt.UTC().Format(time.RFC3339), row.Replica, st.row.ConnectedAt.UTC().Format(time.RFC3339), st.c.Source)
	st.a.streamLog(st.c).Info("agent stream replaced by a newer stream of the same agent", "replica", row.Replica)
	s.refusals.Record(context.WithoutCancel(st.ctx), audit.Event{Actor: st.c.Actor(), Action: "agent.stream_replace",
		Target: st.c.ID.Name, Result: audit.ResultOK, Reason: reason, Source: st.c.Source, CorrelationID: st.c.CorrelationID})
	return true
}

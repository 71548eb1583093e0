package authority

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/store"
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

// A copy of an agent's data directory (a cloned disk) holds the same
// certificate and key as the agent: the two take turns on the node's one
// stream, each replacing the other when it reconnects, to the same
// replica or to two. A stream replaced by one of another connection
// identity (its source host and certificate serial), which the first
// identity then replaces back, and so on flapAlternations times, each
// within flapWindow of the last, is that copy signal. An agent that merely
// reconnects (a network blip: the same host and certificate, or a new
// certificate after a renewal, which the old one never comes back from)
// replaces its own stream and never alternates. Two copies behind one
// address with the same certificate look like one agent reconnecting: the
// generation and join-state rules catch them at their next renewal or
// refresh.
const (
	flapAlternations = 3
	flapWindow       = 5 * time.Minute
)

// rowHolder is what the node's stream row prev says of its stream: its
// holder and the node's last turn (store.AgentStream.Holder, Turn);
// false if it says nothing (a row written before any release recorded
// the holder). The release before migration 0027, still running during a
// rolling upgrade, writes them into the row's StreamID, after the name
// and a dot (a name of this release has none), and leaves the columns as
// the row it replaced had them: its row is read from its StreamID, so the
// count carries on from it.
func rowHolder(prev store.AgentStream) (string, store.StreamTurn, bool) {
	if _, enc, ok := strings.Cut(prev.StreamID, "."); ok {
		return legacyHolder(enc)
	}
	return prev.Holder, prev.Turn, prev.Holder != ""
}

// legacyHolder decodes what the release before migration 0027 wrote in a
// stream row's StreamID after the dot: base64url JSON of the holder and
// the last turn (At in Unix microseconds). It can go once no release
// before 0027 writes the store.
func legacyHolder(enc string) (string, store.StreamTurn, bool) {
	var h struct {
		Holder string `json:"h"`
		From   string `json:"f"`
		To     string `json:"o"`
		At     int64  `json:"t"`
		Count  int    `json:"n"`
	}
	b, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil || json.Unmarshal(b, &h) != nil || h.Holder == "" {
		return "", store.StreamTurn{}, false
	}
	turn := store.StreamTurn{From: h.From, To: h.To, Count: h.Count}
	if h.At != 0 {
		turn.At = time.UnixMicro(h.At).UTC()
	}
	return h.Holder, turn, true
}

// flapAfter is the turn the row of a stream of holder, opening at now
// (the store clock) over the node's row prev (found: the node had one),
// carries: the last one carried on, or this one if it is one (prev names
// a live stream of another holder), and how many alternations in a row
// between the two it makes (0 for none: the same identity, or the first
// turn between these two). Live is streamLive's rule: a row a killed
// replica left marked connected is a stream gone, and an agent that
// reconnects over it (from another address, or with the certificate a
// renewal gave it since) takes no turn from anyone.
func flapAfter(prev store.AgentStream, found bool, holder string, now time.Time) (store.StreamTurn, int) {
	p, last, ok := rowHolder(prev)
	if !found || !ok {
		return store.StreamTurn{}, 0
	}
	if !streamLive(&prev, now) || p == holder {
		return last, 0
	}
	n := 1
	if last.From == holder && last.To == p && now.Sub(last.At) <= flapWindow {
		// Back to the holder the last turn took the stream from.
		n = last.Count + 1
	}
	return store.StreamTurn{From: p, To: holder, At: now, Count: n}, n - 1
}

// connectionID is what tells two holders of one identity apart on the
// stream: the source host (not its port, which each reconnection
// changes) and the certificate's serial.
func connectionID(c Caller) string {
	host := c.Source
	if h, _, err := net.SplitHostPort(c.Source); err == nil {
		host = h
	}
	serial := ""
	if c.Cert != nil {
		serial = c.Cert.SerialNumber.Text(16)
	}
	return host + " (certificate " + serial + ")"
}

// take makes st its node's live stream and returns the one it replaces,
// if any.
func (l *liveStreams) take(st *agentStream) *agentStream {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byNode == nil {
		l.byNode = map[string]*agentStream{}
	}
	node := st.c.ID.Name
	old := l.byNode[node]
	l.byNode[node] = st
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
// A copy suspicion its row's write found (record) is counted and
// audited here, by the one replica whose write won.
func (st *agentStream) replaceOld() {
	s := st.a.s
	if st.alternations >= flapAlternations {
		st.copySuspected(st.tookFrom, st.alternations)
	}
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

// copySuspected audits and counts a stream that took the node's stream
// back from another connection identity, previous, on any replica,
// alternations times in a row:
// two holders of one identity (copySignal). The authority cannot tell
// which is genuine, so the record names how the operator shuts both out
// and brings the genuine machine back; a bound-keypair copy that
// recovers or refreshes is locked by the join-state and generation rules,
// and a lock closes both streams at once.
func (st *agentStream) copySuspected(previous string, alternations int) {
	s := st.a.s
	node := st.c.ID.Name
	s.streams.copies.Inc()
	if alternations%flapAlternations != 0 {
		// Audited at every flapAlternations-th: the copies keep taking
		// turns until the operator acts, and the record says the same.
		return
	}
	reason := fmt.Sprintf("copy_suspected: node %s's identity is held in two places: streams from %s and %s replaced each other %d times in a row, each within %s (a copy of the agent's data directory, such as a cloned disk); "+
		"shut both out with muster lock create --node %s --reason copied-identity (their streams close at once), find and stop the copy, then muster lock delete ID and join the genuine machine again over a new identity (muster agents show %s shows the stream's source)",
		node, previous, connectionID(st.c), alternations, flapWindow, node, node)
	st.a.streamLog(st.c).Warn("agent streams of two holders of one identity replace each other: a copy", "previous_holder", previous, "alternations", alternations)
	s.refusals.Record(context.WithoutCancel(st.ctx), audit.Event{Actor: st.c.Actor(), Action: "agent.stream_copy_suspected",
		Target: node, Result: audit.ResultOK, Reason: reason, Source: st.c.Source, CorrelationID: st.c.CorrelationID})
}

// streamStaleAfter is how long after its last heartbeat a stream row
// still marked connected counts as connected: agents send one every 30 s
// (internal/agent heartbeatEvery). A replica killed (SIGKILL, a lost
// machine) cannot mark its streams' rows closed: they say connected
// until their agents connect again, which an agent that knew only that
// replica's address never does.
const streamStaleAfter = 2 * time.Minute

// streamLive reports whether row is a stream open now, by the store
// clock now: marked connected, with a heartbeat (or its opening) within
// streamStaleAfter. agents list and show, ca status's counts, root
// standby and the copy signal (flapAfter) read a stream's row through
// it, never its Connected alone.
func streamLive(row *store.AgentStream, now time.Time) bool {
	if row == nil || !row.Connected {
		return false
	}
	last := row.LastSeen
	if row.ConnectedAt.After(last) {
		last = row.ConnectedAt
	}
	return now.Sub(last) <= streamStaleAfter
}

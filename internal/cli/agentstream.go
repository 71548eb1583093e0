package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// streamJSON is an agent's stream as agents list and show print it.
type streamJSON struct {
	Connected   bool            `json:"connected"`
	Stale       bool            `json:"stale,omitempty"`
	Replica     string          `json:"replica"`
	ConnectedAt *time.Time      `json:"connected_at"`
	LastSeen    *time.Time      `json:"last_seen"`
	Heartbeat   json.RawMessage `json:"heartbeat,omitempty"`
}

func streamOf(s *musterv1.AgentStreamStatus) *streamJSON {
	if s == nil {
		return nil
	}
	j := &streamJSON{Connected: s.GetConnected(), Stale: s.GetStale(), Replica: s.GetReplica(), ConnectedAt: timeOf(s.GetConnectedAt()), LastSeen: timeOf(s.GetLastSeen())}
	if hb := s.GetHeartbeat(); hb != "" && json.Valid([]byte(hb)) {
		j.Heartbeat = json.RawMessage(hb)
	}
	return j
}

// staleCause is why a stream row reads "replica gone?" (streamJSON.Stale),
// in agents show and under agents list: the replica is not the only
// suspect, as an outage of the store longer than the staleness limit
// makes every stream read so for a while.
const staleCause = "its row still says connected, with no heartbeat recorded for over 2 minutes: the replica was killed or cut off from the store, " +
	"or the store itself was out for over 2 minutes (then every stream reads so until its agent's next heartbeat, within 30s of the store's return)"

// staleCheck is what to check about a stream row that reads "replica
// gone?", after "check that", ending with the command to run again
// (again).
func staleCheck(replica, again string) string {
	return replica + " runs and reaches the store (its /readyz on the metrics listener answers 200, muster_store_up is 1), " +
		"then run " + again + " again in a minute: an agent still connected reads connected again"
}

// printStream adds the stream of node and its last heartbeat to agents
// show.
func printStream(w io.Writer, node string, s *streamJSON) {
	if s == nil {
		fmt.Fprintln(w, "Stream: never connected")
		return
	}
	switch {
	case s.Connected:
		fmt.Fprintf(w, "Stream: connected to %s since %s, last seen %s\n", s.Replica, fmtTime(s.ConnectedAt), fmtTime(s.LastSeen))
	case s.Stale:
		fmt.Fprintf(w, "Stream: not connected, last seen %s (on %s, replica gone? %s)\nCheck that %s\n",
			fmtTime(s.LastSeen), s.Replica, staleCause, staleCheck("the replica", "muster agents show "+node))
	default:
		fmt.Fprintf(w, "Stream: disconnected, last seen %s (on %s)\n", fmtTime(s.LastSeen), s.Replica)
	}
	var hb struct {
		VerifierSetVersion int64             `json:"verifier_set_version"`
		AcceptedSigners    map[string]string `json:"accepted_signers"`
		IdentityNotAfter   *time.Time        `json:"identity_not_after"`
		StaticVerifiers    int               `json:"static_verifiers"`
		LastRotateTask     string            `json:"last_rotate_task"`
		Failures           map[string]int64  `json:"verification_failures"`
	}
	if len(s.Heartbeat) == 0 || json.Unmarshal(s.Heartbeat, &hb) != nil {
		// A stream's row starts without one (the last stream's report
		// goes with it) until the agent's first heartbeat is recorded:
		// said, rather than leaving the line out as if the agent never
		// reported, with the stream's opening as the last contact.
		if s.Connected {
			fmt.Fprintf(w, "Heartbeat: none yet on this stream (opened %s; an agent sends one as its stream opens, then every 30s)\n", fmtTime(s.ConnectedAt))
		} else {
			fmt.Fprintln(w, "Heartbeat: none on that stream")
		}
		return
	}
	fmt.Fprintf(w, "Heartbeat: verifier set version %d, accepts %s, identity expires %s", hb.VerifierSetVersion, signerStates(hb.AcceptedSigners), fmtTime(hb.IdentityNotAfter))
	if hb.StaticVerifiers > 0 {
		fmt.Fprintf(w, ", static list of %d keys", hb.StaticVerifiers)
	}
	fmt.Fprintln(w)
	if hb.LastRotateTask != "" {
		fmt.Fprintf(w, "Last rotate task: %s\n", hb.LastRotateTask)
	}
	if len(hb.Failures) > 0 {
		var fs []string
		for v, n := range hb.Failures {
			if v == "" {
				v = "unreadable"
			}
			fs = append(fs, fmt.Sprintf("%s: %d", v, n))
		}
		slices.Sort(fs)
		fmt.Fprintf(w, "Task verification failures by signer: %s\n", strings.Join(fs, ", "))
	}
}

// staleNote is what agents list adds on standard error after a table
// with n stale streams (their STREAM column "replica gone?"): why, and
// what to check; "" for none.
func staleNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("note: %d of these streams read \"replica gone?\": %s; check that %s\n", n, staleCause, staleCheck("each replica named", "muster agents list"))
}

// streamColumn is the STREAM column of agents list: "connected via
// REPLICA", "last seen TIME", "last seen TIME via REPLICA, replica
// gone?" for a stream whose replica left it marked connected with no
// heartbeat since (killed), or "-" for an agent that never connected.
func streamColumn(s *streamJSON) string {
	switch {
	case s == nil:
		return "-"
	case s.Connected:
		return "connected via " + s.Replica
	case s.Stale:
		return "last seen " + fmtTime(s.LastSeen) + " via " + s.Replica + ", replica gone?"
	}
	return "last seen " + fmtTime(s.LastSeen)
}

package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

func nodeCases() []testCase {
	return []testCase{
		{"empty", func(t *testing.T, ctx context.Context, s store.Store) {
			_, err := s.GetNode(ctx, "node-1")
			wantErr(t, "GetNode", err, store.ErrNotFound)
			wantErr(t, "DeleteNode", s.DeleteNode(ctx, "node-1", link(record("agent.delete"))), store.ErrNotFound)
			_, err = s.GetInstance(ctx, "i1")
			wantErr(t, "GetInstance", err, store.ErrNotFound)
			_, err = s.GetCertificate(ctx, "0a")
			wantErr(t, "GetCertificate", err, store.ErrNotFound)
			wantEqual(t, "empty store", snapshot(t, ctx, s, "node-1"), state{
				Instances:    map[string][]store.Instance{"node-1": nil},
				Certificates: map[string][]store.Certificate{"node-1": nil},
			})
		}},
		{"list by ID", func(t *testing.T, ctx context.Context, s store.Store) {
			// Joined out of ID order.
			jb, _ := admit(t, ctx, s, "node-b", "i1", at(0))
			jc, _ := admit(t, ctx, s, "node-c", "i2", at(time.Minute))
			ja, _ := admit(t, ctx, s, "node-a", "i3", at(2*time.Minute))
			got, err := s.ListNodes(ctx)
			mustNil(t, "ListNodes", err)
			wantEqual(t, "ListNodes", got, []store.Node{
				wantNode(ja, at(2*time.Minute)), wantNode(jb, at(0)), wantNode(jc, at(time.Minute)),
			})
		}},
		{"lists are per node ID", func(t *testing.T, ctx context.Context, s store.Store) {
			j1, in1 := admit(t, ctx, s, "node-1", "i1", at(0))
			j2, in2 := admit(t, ctx, s, "node-2", "i2", at(0))
			wantEqual(t, "state", snapshot(t, ctx, s, "node-1", "node-2", "node-3"), state{
				Tokens: snapshot(t, ctx, s).Tokens,
				Nodes:  []store.Node{wantNode(j1, at(0)), wantNode(j2, at(0))},
				Instances: map[string][]store.Instance{
					"node-1": {in1}, "node-2": {in2}, "node-3": nil,
				},
				Certificates: map[string][]store.Certificate{
					"node-1": {j1.Certificate}, "node-2": {j2.Certificate}, "node-3": nil,
				},
			})
		}},
		{"delete marks the instance deleted and keeps history", func(t *testing.T, ctx context.Context, s store.Store) {
			j, in := admit(t, ctx, s, "node-1", "i1", at(0))
			r := renewalOf(in, "key-2", at(time.Hour))
			in, err := s.CommitRenewal(ctx, r)
			mustNil(t, "CommitRenewal", err)
			mustNil(t, "DeleteNode", s.DeleteNode(ctx, "node-1", link(record("agent.delete"))))

			_, err = s.GetNode(ctx, "node-1")
			wantErr(t, "GetNode after delete", err, store.ErrNotFound)
			deleted := in
			deleted.State = store.InstanceDeleted
			got, err := s.GetInstance(ctx, "i1")
			mustNil(t, "GetInstance", err)
			wantEqual(t, "GetInstance", got, deleted)
			wantEqual(t, "state after delete", snapshot(t, ctx, s, "node-1"), state{
				Tokens:       snapshot(t, ctx, s).Tokens,
				Instances:    map[string][]store.Instance{"node-1": {deleted}},
				Certificates: map[string][]store.Certificate{"node-1": {j.Certificate, r.Certificate}},
			})
			wantErr(t, "DeleteNode twice", s.DeleteNode(ctx, "node-1", link(record("agent.delete"))), store.ErrNotFound)
		}},
		{"delete of the node created at a time leaves another node joined under its ID since", func(t *testing.T, ctx context.Context, s store.Store) {
			admit(t, ctx, s, "node-1", "i1", at(0))
			first, err := s.GetNode(ctx, "node-1")
			mustNil(t, "GetNode", err)
			wantErr(t, "DeleteNodeCreated of no node", s.DeleteNodeCreated(ctx, "node-2", first.CreatedAt, link(record("agent.delete"))), store.ErrNotFound)
			mustNil(t, "DeleteNode", s.DeleteNode(ctx, "node-1", link(record("agent.delete"))))
			j, in := admit(t, ctx, s, "node-1", "i2", at(time.Hour))
			seq := auditSeq(t, ctx, s)
			wantErr(t, "DeleteNodeCreated of the node deleted", s.DeleteNodeCreated(ctx, "node-1", first.CreatedAt, link(record("agent.delete"))), store.ErrConflict)
			again, err := s.GetNode(ctx, "node-1")
			mustNil(t, "GetNode of the node joined again", err)
			wantEqual(t, "the node joined again", again, wantNode(j, at(time.Hour)))
			got, err := s.GetInstance(ctx, "i2")
			mustNil(t, "GetInstance", err)
			wantEqual(t, "its instance", got, in)
			if after := auditSeq(t, ctx, s); after != seq {
				t.Errorf("the refused delete appended records %d to %d", seq+1, after)
			}
			mustNil(t, "DeleteNodeCreated of the node there", s.DeleteNodeCreated(ctx, "node-1", again.CreatedAt, link(record("agent.delete"))))
			_, err = s.GetNode(ctx, "node-1")
			wantErr(t, "GetNode after DeleteNodeCreated", err, store.ErrNotFound)
			got, err = s.GetInstance(ctx, "i2")
			if mustNil(t, "GetInstance", err); got.State != store.InstanceDeleted {
				t.Errorf("its instance after DeleteNodeCreated: %+v, want it deleted", got)
			}
		}},
		{"an unaudited delete leaves the node", func(t *testing.T, ctx context.Context, s store.Store) {
			admit(t, ctx, s, "node-1", "i1", at(0))
			all := func() any { return snapshot(t, ctx, s, "node-1") }
			wantUnaudited(t, ctx, s, "agent.delete", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				return s.DeleteNode(ctx, "node-1", audit)
			}, all)
			_, err := s.GetNode(ctx, "node-1")
			mustNil(t, "GetNode after the unaudited deletes", err)
			seq := auditSeq(t, ctx, s)
			mustNil(t, "DeleteNode with its record", s.DeleteNode(ctx, "node-1", link(record("agent.delete"))))
			if got := auditSeq(t, ctx, s); got != seq+1 {
				t.Fatalf("audit chain holds %d records after the delete; want %d", got, seq+1)
			}
			// A refused delete (no such node) appends nothing.
			wantErr(t, "DeleteNode twice", s.DeleteNode(ctx, "node-1", link(record("agent.delete"))), store.ErrNotFound)
			if got := auditSeq(t, ctx, s); got != seq+1 {
				t.Fatalf("audit chain holds %d records after a refused delete; want %d", got, seq+1)
			}
		}},
		{"delete frees the node ID", func(t *testing.T, ctx context.Context, s store.Store) {
			j1, in1 := admit(t, ctx, s, "node-1", "i1", at(0))
			mustNil(t, "DeleteNode", s.DeleteNode(ctx, "node-1", link(record("agent.delete"))))
			// Another token, no supersession: the ID is free, so this is
			// a first join, not a supersession.
			insertTokens(t, ctx, s, token("b", 1, time.Time{}, 0))
			j2 := newJoin("b", "node-1", "i2", "key-2", at(time.Hour))
			res := mustJoin(t, ctx, s, j2)
			wantEqual(t, "JoinResult", res, store.JoinResult{Instance: wantInstance(j2, "")})
			n, err := s.GetNode(ctx, "node-1")
			mustNil(t, "GetNode", err)
			wantEqual(t, "GetNode", n, wantNode(j2, at(time.Hour)))
			in1.State = store.InstanceDeleted
			is, err := s.ListInstances(ctx, "node-1")
			mustNil(t, "ListInstances", err)
			wantEqual(t, "ListInstances", is, []store.Instance{in1, res.Instance})
			cs, err := s.ListCertificates(ctx, "node-1")
			mustNil(t, "ListCertificates", err)
			wantEqual(t, "ListCertificates", cs, []store.Certificate{j1.Certificate, j2.Certificate})
		}},
		{"delete removes the node's stream row with it", func(t *testing.T, ctx context.Context, s store.Store) {
			// A row left behind would show the deleted node's last stream
			// (a killed replica's: "replica gone?") and carry its copy
			// turn to the next node joined under the ID, another machine.
			admit(t, ctx, s, "node-1", "i1", at(0))
			admit(t, ctx, s, "node-2", "i2", at(0))
			turn := store.StreamTurn{From: "10.0.0.1 (certificate 0a)", To: "10.0.0.2 (certificate 0a)", At: at(time.Minute), Count: 2}
			for _, n := range []string{"node-1", "node-2"} {
				mustNil(t, "RecordAgentStream "+n, s.RecordAgentStream(ctx, store.AgentStream{NodeID: n, StreamID: "s-" + n, Replica: "a:1", Connected: true,
					ConnectedAt: at(time.Minute), LastSeen: at(time.Minute), Holder: "10.0.0.2 (certificate 0a)", Turn: turn}))
			}
			// Refused deletes leave it: no record, another node created since.
			wantUnaudited(t, ctx, s, "agent.delete", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				return s.DeleteNode(ctx, "node-1", audit)
			}, func() any { r, err := s.GetAgentStream(ctx, "node-1"); mustNil(t, "GetAgentStream", err); return r })
			wantErr(t, "DeleteNodeCreated of another creation", s.DeleteNodeCreated(ctx, "node-1", at(time.Hour), link(record("agent.delete"))), store.ErrConflict)
			_, err := s.GetAgentStream(ctx, "node-1")
			mustNil(t, "GetAgentStream after the refused deletes", err)

			mustNil(t, "DeleteNode", s.DeleteNode(ctx, "node-1", link(record("agent.delete"))))
			_, err = s.GetAgentStream(ctx, "node-1")
			wantErr(t, "GetAgentStream after DeleteNode", err, store.ErrNotFound)
			n2, err := s.GetNode(ctx, "node-2")
			mustNil(t, "GetNode node-2", err)
			mustNil(t, "DeleteNodeCreated", s.DeleteNodeCreated(ctx, "node-2", n2.CreatedAt, link(record("agent.delete"))))
			_, err = s.GetAgentStream(ctx, "node-2")
			wantErr(t, "GetAgentStream after DeleteNodeCreated", err, store.ErrNotFound)

			// The next node under the ID opens as its first stream.
			admit(t, ctx, s, "node-1", "i3", at(2*time.Hour))
			mustNil(t, "TakeAgentStream of the new node", s.TakeAgentStream(ctx, store.AgentStream{NodeID: "node-1", StreamID: "s-new", Replica: "a:1", Connected: true,
				ConnectedAt: at(2 * time.Hour), LastSeen: at(2 * time.Hour), Holder: "10.0.0.9 (certificate 0b)"}, ""))
			got, err := s.GetAgentStream(ctx, "node-1")
			mustNil(t, "GetAgentStream of the new node", err)
			if got.StreamID != "s-new" || got.Turn != (store.StreamTurn{}) {
				t.Errorf("the new node's row: %+v, want stream s-new with no turn", got)
			}
		}},
		{"delete leaves other nodes alone", func(t *testing.T, ctx context.Context, s store.Store) {
			admit(t, ctx, s, "node-1", "i1", at(0))
			j2, in2 := admit(t, ctx, s, "node-2", "i2", at(0))
			mustNil(t, "DeleteNode", s.DeleteNode(ctx, "node-1", link(record("agent.delete"))))
			nodes, err := s.ListNodes(ctx)
			mustNil(t, "ListNodes", err)
			wantEqual(t, "ListNodes", nodes, []store.Node{wantNode(j2, at(0))})
			got, err := s.GetInstance(ctx, "i2")
			mustNil(t, "GetInstance", err)
			wantEqual(t, "GetInstance", got, in2)
		}},
	}
}

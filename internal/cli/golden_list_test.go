package cli

import (
	"bytes"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestGoldenListTables compares the text tables of token list, agents
// list, lock list and signer list, printed from fixed API answers, with
// testdata/NAME.golden (-update rewrites them). The answers go through the
// same conversion as the commands' (tokenOf, agentOf, signersOf), so a
// change of a column, its order or its wording shows here.
func TestGoldenListTables(t *testing.T) {
	at := time.Date(2026, 3, 9, 12, 0, 0, 0, time.UTC)
	ts := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(at.Add(d)) }

	tokens := []*musterv1.Token{
		{Id: "7f3k2a", JoinMethod: "token", State: "active", UsesAllowed: 1, ExpiresAt: ts(time.Hour), CreatedAt: ts(0), CreatedBy: "admin",
			Description: "web pool", Labels: map[string]string{"pool": "web", "env": "prod"}},
		{Id: "b0und1", JoinMethod: "token", State: "used_up", UsesAllowed: 3, UsesCount: 3, NodeId: "db-1", ExpiresAt: ts(-time.Hour), CreatedAt: ts(-2 * time.Hour)},
		{Id: "forevr", JoinMethod: "token", State: "active", CreatedAt: ts(0)},
	}
	agents := []*musterv1.Agent{
		{NodeId: "web-1", JoinMethod: "token", TokenId: "7f3k2a", InstanceId: "01J8Z3AAAAAAAAAAAAAAAAAAAA", Generation: 2, NotAfter: ts(24 * time.Hour),
			Stream: &musterv1.AgentStreamStatus{Connected: true, Replica: "muster-a3f2e1"}},
		{NodeId: "db-1", JoinMethod: "psk", InstanceId: "01J8Z3BBBBBBBBBBBBBBBBBBBB", NotAfter: ts(time.Hour), Locked: "01J8Z3CCCCCCCCCCCCCCCCCCCC",
			Stream: &musterv1.AgentStreamStatus{LastSeen: ts(-time.Minute)}},
		{NodeId: "new-1", JoinMethod: "token", InstanceId: "01J8Z3DDDDDDDDDDDDDDDDDDDD"},
		{NodeId: "app-1", JoinMethod: "psk", InstanceId: "01J8Z3GGGGGGGGGGGGGGGGGGGG", NotAfter: ts(time.Hour),
			Stream: &musterv1.AgentStreamStatus{Stale: true, Replica: "muster-b7c9d0", LastSeen: ts(-10 * time.Minute)}},
		{NodeId: "bk-1", JoinMethod: "bound-keypair", TokenId: "b0und1", InstanceId: "01J8Z3FFFFFFFFFFFFFFFFFFFF", Generation: 1, NotAfter: ts(time.Hour),
			BoundKeypair: &musterv1.BoundKeypairStatus{BoundKeyFingerprint: "SHA256:abc", RecoveriesRemaining: 2, RecoverySequence: 1}},
	}
	locks := []*musterv1.Lock{
		{Id: "01J8Z3CCCCCCCCCCCCCCCCCCCC", Kind: "node", Target: "db-1", Reason: "disk stolen", CreatedBy: "admin", CreatedAt: ts(0)},
		{Id: "01J8Z3EEEEEEEEEEEEEEEEEEEE", Kind: "token", Target: "7f3k2a", CreatedBy: "admin", CreatedAt: ts(0), ExpiresAt: ts(24 * time.Hour)},
	}
	signers := []*musterv1.Signer{
		{VersionId: "v1", State: "grace", PublicKey: "AAAA", PublishedAt: ts(0), RetiresAt: ts(time.Hour), KeyCustody: "sealed"},
		{VersionId: "v2", State: "active", PublicKey: "BBBB", PublishedAt: ts(0), EffectiveAt: ts(10 * time.Minute), Previous: "v1", KeyCustody: "pkcs11:token=muster;object=muster-signer%2Fv2;id=%01%02;type=private"},
	}

	tests := []struct {
		name  string
		print func(*bytes.Buffer) error
	}{
		{"token-list", func(b *bytes.Buffer) error {
			var list []tokenJSON
			for _, tk := range tokens {
				list = append(list, tokenOf(tk))
			}
			return tokenTable(b, list, true)
		}},
		{"agents-list", func(b *bytes.Buffer) error {
			var list []agentJSON
			for _, a := range agents {
				list = append(list, agentOf(a))
			}
			return agentTable(b, list, true)
		}},
		{"lock-list", func(b *bytes.Buffer) error { return printLocks(b, locks) }},
		{"signer-list", func(b *bytes.Buffer) error { printSigners(b, signersOf(signers)); return nil }},
		{"settings-list", func(b *bytes.Buffer) error {
			var list []settingJSON
			for _, s := range []*musterv1.Setting{
				{Key: "ca.draft_ttl", Value: "1h0m0s"},
				{Key: "signer.min_lead_time", Value: "30m0s", Version: 2, UpdatedAt: ts(0), UpdatedBy: "admin:ops"},
			} {
				list = append(list, settingOf(s))
			}
			return printSettings(b, list, "(not in the store yet: the answering replica's)")
		}},
		{"empty-lists", func(b *bytes.Buffer) error {
			if err := tokenTable(b, nil, true); err != nil {
				return err
			}
			if err := agentTable(b, nil, true); err != nil {
				return err
			}
			return printLocks(b, nil)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tt.print(&b); err != nil {
				t.Fatal(err)
			}
			checkGolden(t, tt.name, tt.name, b.String())
		})
	}
}

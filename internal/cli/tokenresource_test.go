package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestTokenResourceRoundTrip: a bound-keypair token as token get -o yaml
// prints it is the resource (kind, metadata, spec, status), and
// parseTokenFile reads its spec back as it was.
func TestTokenResourceRoundTrip(t *testing.T) {
	before := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	tok := &musterv1.Token{Id: "bot-1", JoinMethod: "bound-keypair", NodeId: "node-1", State: "active", CreatedBy: "admin",
		CreatedAt: timestamppb.New(before.Add(-time.Hour)),
		BoundKeypair: &musterv1.BoundKeypairSpec{MustRegisterBefore: timestamppb.New(before), RecoveryLimit: 4,
			RecoveryMode: "relaxed", RotateAfter: timestamppb.New(before.Add(time.Hour))},
		BoundKeypairStatus: &musterv1.BoundKeypairStatus{RegistrationSecret: "s3cret", RecoveryCount: 0, RecoveriesRemaining: -1}}
	var out bytes.Buffer
	if err := (&output{format: "yaml"}).write(&out, resourceOf(tok)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kind: token\n", "metadata:\n  name: bot-1\n", "spec:\n  join_method: bound-keypair\n  node: node-1\n",
		"      must_register_before: \"2030-01-02T03:04:05Z\"\n", "      limit: 4\n      mode: relaxed\n",
		"status:\n  state: active\n", "    registration_secret: s3cret\n", "    last_recovered_at: null\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("token get -o yaml lacks %q:\n%s", want, out.String())
		}
	}
	req, err := parseTokenFile(out.Bytes())
	if err != nil {
		t.Fatalf("apply refuses what get printed: %v\n%s", err, out.String())
	}
	b := req.GetBoundKeypair()
	if req.GetName() != "bot-1" || req.GetNodeId() != "node-1" || b.GetRecoveryLimit() != 4 || b.GetRecoveryMode() != "relaxed" ||
		!b.GetMustRegisterBefore().AsTime().Equal(before) || !b.GetRotateAfter().AsTime().Equal(before.Add(time.Hour)) ||
		b.GetInitialPublicKey() != "" {
		t.Fatalf("read back %+v", req)
	}
	if req.GetSvidUsage() != "" || strings.Contains(out.String(), "svid_usage") {
		t.Errorf("a client-only token's resource names a usage: %q\n%s", req.GetSvidUsage(), out.String())
	}
	// A client,server token's usage survives get then apply.
	tok.SvidUsage = "client,server"
	out.Reset()
	if err := (&output{format: "yaml"}).write(&out, resourceOf(tok)); err != nil {
		t.Fatal(err)
	}
	if req, err := parseTokenFile(out.Bytes()); err != nil || req.GetSvidUsage() != "client,server" {
		t.Fatalf("svid_usage client,server read back as %q (%v):\n%s", req.GetSvidUsage(), err, out.String())
	}
	if resourceOf(&musterv1.Token{Id: "abcdef", JoinMethod: "token"}) != nil {
		t.Error("a join token has a bound-keypair resource")
	}
}

package e2e

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/agent"
	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/joinuri"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// boundJoin runs the bound-keypair stream against the real authority as an
// agent does: init, the challenge signed with the key in adir, the result.
func boundJoin(t *testing.T, e *joinEnv, conn *grpc.ClientConn, adir, name, secret, joinState string) (*musterv1.BoundKeypairResult, error) {
	t.Helper()
	priv, err := agent.LoadBoundKey(agent.Dir(adir))
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := boundkeypair.NewPublicKey(priv.Public().(ed25519.PublicKey))
	_, csr := newCSR(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	init := &musterv1.BoundKeypairInit{Token: name, NodeId: name, Csr: csr, PreviousJoinState: joinState}
	if secret != "" {
		init.RegistrationSecret, init.PublicKey = secret, pub.String()
	}
	return agent.JoinBoundKeypair(ctx, musterv1.NewJoinServiceClient(conn), init, priv, e.td)
}

type botInfo struct {
	URI          string `json:"uri"`
	BoundKeypair struct {
		RegistrationSecret  string `json:"registration_secret"`
		BoundKeyFingerprint string `json:"bound_key_fingerprint"`
		RecoveryCount       int64  `json:"recovery_count"`
		RecoveriesRemaining int64  `json:"recoveries_remaining"`
	} `json:"bound_keypair"`
}

func botOf(t *testing.T, out string) botInfo {
	t.Helper()
	var b botInfo
	if err := json.Unmarshal([]byte(out), &b); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return b
}

// TestBoundKeypairEndToEnd: static binding (keypair create, bot add
// --public-key) and binding with a registration secret, against the built
// binary; recoveries with the join state until the budget is spent; a
// stale join state locks the token.
func TestBoundKeypairEndToEnd(t *testing.T) {
	t.Parallel()
	e := newJoinEnv(t)
	conn := e.dial(t, nil)

	// Static binding.
	adir := filepath.Join(t.TempDir(), "agent")
	pubLine := strings.TrimSpace(mustRun(t, "keypair", "create", "--data", adir))
	keyFile := filepath.Join(t.TempDir(), "bot.pub")
	if err := os.WriteFile(keyFile, []byte(pubLine+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	added := botOf(t, mustRun(t, "bot", "add", "bot-1", "--public-key", keyFile, "--recovery-limit", "2", "--data", e.dir, "-o", "json"))
	pub, _ := boundkeypair.ParsePublicKey(pubLine)
	if added.BoundKeypair.BoundKeyFingerprint != pub.Fingerprint() || added.BoundKeypair.RegistrationSecret != "" {
		t.Fatalf("bot add: %+v", added)
	}
	first, err := boundJoin(t, e, conn, adir, "bot-1", "", "")
	if err != nil {
		t.Fatalf("first join: %v", err)
	}
	second, err := boundJoin(t, e, conn, adir, "bot-1", "", first.JoinState)
	if err != nil {
		t.Fatalf("recovery: %v", err)
	}
	if got := botOf(t, mustRun(t, "token", "get", "bot-1", "--data", e.dir, "-o", "json")); got.BoundKeypair.RecoveryCount != 2 ||
		got.BoundKeypair.RecoveriesRemaining != 0 {
		t.Fatalf("token get after two joins: %+v", got)
	}
	_, err = boundJoin(t, e, conn, adir, "bot-1", "", second.JoinState)
	if s := status.Convert(err); s.Code() != codes.FailedPrecondition || !strings.Contains(s.Message(), "recovery_exhausted") {
		t.Fatalf("past the budget: %v", err)
	}
	// Raising the limit with token apply brings the agent back as it is.
	file := filepath.Join(t.TempDir(), "token.yaml")
	yaml := fmt.Sprintf("kind: token\nmetadata: {name: bot-1}\nspec:\n  join_method: bound-keypair\n  node: bot-1\n"+
		"  bound_keypair:\n    onboarding: {initial_public_key: %q}\n    recovery: {limit: 3, mode: standard}\n", pubLine)
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, "token", "apply", "-f", file, "--data", e.dir); !strings.Contains(out, "updated") {
		t.Fatalf("token apply: %s", out)
	}
	if _, err := boundJoin(t, e, conn, adir, "bot-1", "", second.JoinState); err != nil {
		t.Fatalf("recovery after raising the limit: %v", err)
	}
	if msg := mustFail(t, "token", "apply", "-f", filepath.Join(t.TempDir(), "missing.yaml"), "--data", e.dir); !strings.Contains(msg, "missing.yaml") {
		t.Fatalf("apply of a missing file: %s", msg)
	}
	_, err = boundJoin(t, e, conn, adir, "bot-1", "", first.JoinState)
	if s := status.Convert(err); s.Code() != codes.PermissionDenied || !strings.Contains(s.Message(), "join_state_mismatch") {
		t.Fatalf("stale join state: %v", err)
	}
	if locks := mustRun(t, "lock", "list", "--data", e.dir); !strings.Contains(locks, "bot-1") {
		t.Fatalf("lock list does not show the token's lock:\n%s", locks)
	}

	// Binding with the registration secret, once.
	adir2 := filepath.Join(t.TempDir(), "agent2")
	mustRun(t, "keypair", "create", "--data", adir2)
	reg := botOf(t, mustRun(t, "bot", "add", "bot-2", "--data", e.dir, "-o", "json"))
	secret := reg.BoundKeypair.RegistrationSecret
	if secret == "" {
		t.Fatalf("bot add without a key printed no secret: %+v", reg)
	}
	// The joining URI carries the name, the secret and the pin.
	u, err := joinuri.Parse(reg.URI)
	if err != nil || u.Method != joinuri.MethodBoundKeypair || u.KeypairName != "bot-2" || u.KeypairSecret != secret ||
		u.Address != e.auth.addr || u.Fingerprint == "" {
		t.Fatalf("bot add URI %q: %+v, %v", reg.URI, u, err)
	}
	if _, err := boundJoin(t, e, conn, adir2, "bot-2", secret, ""); err != nil {
		t.Fatalf("registration: %v", err)
	}
	if got := botOf(t, mustRun(t, "token", "get", "bot-2", "--data", e.dir, "-o", "json")); got.BoundKeypair.RegistrationSecret != "" ||
		got.BoundKeypair.BoundKeyFingerprint == "" {
		t.Fatalf("after registration the secret is still shown or no key is bound: %+v", got)
	}
	if msg := mustFail(t, "bot", "add", "bot-2", "--data", e.dir); !strings.Contains(msg, "ALREADY_EXISTS") {
		t.Fatalf("bot add twice: %s", msg)
	}
}

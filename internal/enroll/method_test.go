package enroll

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"errors"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/store"
)

// echoMethod is a join method that proves possession over a challenge
// exchange: the caller must answer the challenge with the same bytes. It
// stands for any method that plugs into the seam (a bound keypair's is the
// real one) and claims a use of a token in the join's write.
type echoMethod struct {
	tokenID string
	key     *ecdsa.PrivateKey
}

type echoPayload struct{ NodeID string }

func (m echoMethod) Attest(ctx context.Context, _ Request, p echoPayload, challenge Challenge) (Admission, error) {
	a := Admission{Actor: "echo:" + p.NodeID, NodeID: p.NodeID}
	nonce := []byte("nonce-" + p.NodeID)
	answer, err := challenge(ctx, nonce)
	if err != nil {
		return a, err
	}
	if !bytes.Equal(answer, nonce) {
		return a, refuse(KindUnauthenticated, "challenge_failed")
	}
	kid, err := keyID(m.key.Public())
	if err != nil {
		return a, err
	}
	a.TokenID, a.Proof, a.Method = m.tokenID, "echo "+m.tokenID, "echo"
	a.PublicKey, a.KeyID, a.Now = m.key.Public(), kid, time.Now()
	return a, nil
}

func TestMethodSeam(t *testing.T) {
	e := newEnv(t, nil)
	tok := e.token(t, 1)
	key, _ := csr(t)
	m := echoMethod{tokenID: tok.ID, key: key}
	ctx := t.Context()

	// A wrong answer is refused with the method's reason, audited under
	// the method's actor, and consumes nothing.
	wrong := func(context.Context, []byte) ([]byte, error) { return []byte("no"), nil }
	_, err := join(ctx, e.svc, m, Request{Source: "test"}, echoPayload{NodeID: "node-1"}, wrong)
	wantRefusal(t, err, KindUnauthenticated, "challenge_failed")
	if n := len(e.audit.refused); n != 1 || e.audit.refused[0].Actor != "echo:node-1" || e.audit.refused[0].Result != audit.ResultDenied {
		t.Fatalf("refusals audited: %+v", e.audit.refused)
	}
	if got, _ := e.st.GetToken(ctx, tok.ID); got.UsesCount != 0 {
		t.Fatalf("a refused join used the token: %d uses", got.UsesCount)
	}

	// A transport failure of the exchange is not a refusal.
	broken := errors.New("stream closed")
	_, err = join(ctx, e.svc, m, Request{}, echoPayload{NodeID: "node-1"}, func(context.Context, []byte) ([]byte, error) { return nil, broken })
	if !errors.Is(err, broken) {
		t.Fatalf("join = %v, want the exchange's error", err)
	}

	// The right answer admits through the common tail: a node, an
	// instance of the method, the token's use claimed in the same write.
	echo := func(_ context.Context, c []byte) ([]byte, error) { return c, nil }
	iss, err := join(ctx, e.svc, m, Request{}, echoPayload{NodeID: "node-1"}, echo)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := e.st.GetInstance(ctx, iss.InstanceID)
	if err != nil || inst.NodeID != "node-1" || inst.JoinMethod != "echo" || inst.TokenID != tok.ID {
		t.Fatalf("instance %+v, %v", inst, err)
	}
	if got, _ := e.st.GetToken(ctx, tok.ID); got.UsesCount != 1 {
		t.Fatalf("token uses %d, want 1", got.UsesCount)
	}

	// The token's single use is the store's claim: a second node with the
	// same method is refused at the write.
	_, err = join(ctx, e.svc, m, Request{}, echoPayload{NodeID: "node-2"}, echo)
	wantRefusal(t, err, KindFailedPrecondition, "join token has no uses left or expired")
	if _, err := e.st.GetNode(ctx, "node-2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("node-2 after a refused join: %v", err)
	}
}

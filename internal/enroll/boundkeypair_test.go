package enroll

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/store"
)

// bkEnv is an enrollment service with the bound-keypair method configured
// and one bot token, "bot-1" for node "node-1".
type bkEnv struct {
	*env
	priv   ed25519.PrivateKey
	pub    boundkeypair.PublicKey
	secret string
}

func newBKEnv(t *testing.T, limit int64, mode string) *bkEnv {
	t.Helper()
	e := newEnv(t, nil)
	var sk seal.StorageKey
	copy(sk[:], "join-state storage key for tests")
	e.svc.cfg.BoundKeypair.JoinStateSealer, _ = sk.Sealer(seal.InfoJoinState)
	e.svc.jsKeys.custody = custody.NewSealedWith(e.svc.cfg.BoundKeypair.JoinStateSealer, "")
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	k, _ := boundkeypair.NewPublicKey(pub)
	b := &bkEnv{env: e, priv: priv, pub: k, secret: "registration-secret-1"}
	ct, nonce, _ := e.seal.Seal([]byte(b.secret), []byte("bot-1"))
	if err := e.st.InsertToken(t.Context(), store.Token{ID: "bot-1", JoinMethod: store.JoinMethodBoundKeypair,
		Ciphertext: []byte{}, Nonce: []byte{}, NodeID: "node-1", CreatedAt: time.Now(),
		BoundKeypair: &store.BoundKeypair{Spec: store.BoundKeypairSpec{RecoveryLimit: limit, RecoveryMode: mode,
			MustRegisterBefore: time.Now().Add(time.Hour)}, SecretCiphertext: ct, SecretNonce: nonce}}, setupLink); err != nil {
		t.Fatal(err)
	}
	return b
}

// answerWith solves challenges with priv.
func answerWith(priv ed25519.PrivateKey) Challenge {
	return func(_ context.Context, b []byte) ([]byte, error) {
		c, err := boundkeypair.ParseChallenge(b)
		if err != nil {
			return nil, err
		}
		s, err := boundkeypair.Answer(priv, c, time.Now())
		return []byte(s), err
	}
}

func (b *bkEnv) register(t *testing.T) (*BoundKeypairResult, []byte) {
	t.Helper()
	_, der := csr(t)
	res, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{Source: "test"}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1",
		CSR: der, PublicKey: b.pub.String(), RegistrationSecret: b.secret}, answerWith(b.priv))
	if err != nil {
		t.Fatalf("registration: %v", err)
	}
	return res, der
}

func (b *bkEnv) recover(t *testing.T, joinState string) (*BoundKeypairResult, error) {
	t.Helper()
	_, der := csr(t)
	return b.svc.RegisterUsingBoundKeypair(t.Context(), Request{Source: "test"}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1",
		CSR: der, JoinState: joinState}, answerWith(b.priv))
}

func (b *bkEnv) status(t *testing.T) store.BoundKeypair {
	t.Helper()
	tok, err := b.st.GetToken(t.Context(), "bot-1")
	if err != nil {
		t.Fatal(err)
	}
	return *tok.BoundKeypair
}

func (b *bkEnv) joinState(t *testing.T, doc string) boundkeypair.JoinState {
	t.Helper()
	js, err := boundkeypair.VerifyJoinState(doc, b.svc.jsKeys.lookup(t.Context()), b.svc.cfg.AuthorityID, "bot-1", "node-1")
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func TestBoundKeypairRegistration(t *testing.T) {
	b := newBKEnv(t, 2, boundkeypair.ModeStandard)
	res, _ := b.register(t)
	st := b.status(t)
	if st.BoundPublicKey != b.pub.String() || st.SecretCiphertext != nil || st.RecoveryCount != 1 || st.RecoverySequence != 1 ||
		st.BoundInstanceID != res.InstanceID {
		t.Fatalf("status after registration: %+v", st)
	}
	js := b.joinState(t, res.JoinState)
	if js.RecoverySequence != 1 || js.InstanceID != res.InstanceID || js.BoundKey != b.pub.Fingerprint() ||
		js.RecoveryLimit != 2 || js.RecoveryMode != boundkeypair.ModeStandard {
		t.Fatalf("join state %+v", js)
	}
	if res.Remaining != 1 {
		t.Fatalf("remaining %d, want 1", res.Remaining)
	}
	inst, _ := b.st.GetInstance(t.Context(), res.InstanceID)
	if inst.JoinMethod != store.JoinMethodBoundKeypair || inst.TokenID != "bot-1" {
		t.Fatalf("instance %+v", inst)
	}
	// The secret is spent: registering again is closed.
	_, der := csr(t)
	_, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1",
		CSR: der, PublicKey: b.pub.String(), RegistrationSecret: b.secret, JoinState: res.JoinState}, answerWith(b.priv))
	if err != nil {
		// With a key bound the secret is ignored and this is a recovery.
		t.Fatalf("a recovery that also sent the spent secret: %v", err)
	}
}

// TestBoundKeypairCertTTL: bound-keypair agents get their own, shorter
// certificate lifetime (DESIGN.md: 1 h by default; they can recover), both
// at the join and at a refresh, whatever the other agents' lifetime is.
func TestBoundKeypairCertTTL(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  time.Duration
		want time.Duration
	}{
		{"default", 0, DefaultBoundKeypairCertTTL},
		{"configured", 10 * time.Minute, 10 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBKEnv(t, 2, boundkeypair.ModeStandard)
			b.svc.cfg.BoundKeypair.CertTTL = tc.set
			res, _ := b.register(t)
			certs, err := ca.ParseCertsPEM(res.ChainPEM)
			if err != nil {
				t.Fatal(err)
			}
			// NotBefore is backdated a minute for clock skew.
			if got := certs[0].NotAfter.Sub(certs[0].NotBefore) - time.Minute; got != tc.want {
				t.Fatalf("certificate lifetime %s, want %s (agents' is %s)", got, tc.want, b.svc.cfg.AgentCertTTL)
			}
		})
	}
}

func TestBoundKeypairRegistrationRefusals(t *testing.T) {
	b := newBKEnv(t, 2, boundkeypair.ModeStandard)
	otherPriv := func() ed25519.PrivateKey { _, p, _ := ed25519.GenerateKey(rand.Reader); return p }()
	_, der := csr(t)
	for _, tc := range []struct {
		name   string
		p      BoundKeypairPayload
		ch     Challenge
		kind   Kind
		reason string
	}{
		{"wrong secret", BoundKeypairPayload{Token: "bot-1", NodeID: "node-1", CSR: der, PublicKey: b.pub.String(), RegistrationSecret: "nope"},
			answerWith(b.priv), KindUnauthenticated, ReasonChallengeFailed},
		{"challenge signed by another key", BoundKeypairPayload{Token: "bot-1", NodeID: "node-1", CSR: der, PublicKey: b.pub.String(),
			RegistrationSecret: b.secret}, answerWith(otherPriv), KindUnauthenticated, ReasonChallengeFailed},
		{"another node", BoundKeypairPayload{Token: "bot-1", NodeID: "node-2", CSR: der, PublicKey: b.pub.String(), RegistrationSecret: b.secret},
			answerWith(b.priv), KindNotFound, "unknown bound-keypair token, or not for this node"},
		{"unknown token", BoundKeypairPayload{Token: "bot-9", NodeID: "node-1", CSR: der}, answerWith(b.priv), KindNotFound,
			"unknown bound-keypair token, or not for this node"},
		{"no CSR", BoundKeypairPayload{Token: "bot-1", NodeID: "node-1"}, answerWith(b.priv), KindInvalid, "csr is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, tc.p, tc.ch)
			wantRefusal(t, err, tc.kind, tc.reason)
			if st := b.status(t); st.BoundPublicKey != "" || st.SecretCiphertext == nil || st.RecoveryCount != 0 {
				t.Fatalf("a refused registration changed the token: %+v", st)
			}
		})
	}
	// Past the window, the registration is closed.
	b.svc.cfg.Now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	_, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1", CSR: der,
		PublicKey: b.pub.String(), RegistrationSecret: b.secret}, answerWith(b.priv))
	wantRefusal(t, err, KindFailedPrecondition, ReasonRegistrationClosed)
	// Token bot-1 is node-1's: muster bot add NAME makes the token of
	// node NAME, so the way out names the node (bot-1 would make a token
	// for a node bot-1, which node-1's agent is refused).
	b.wantAuditedWayOut(t, "a new registration secret: muster token delete bot-1, muster bot add node-1 --recovery-limit 2 (the new token is named after its node: the agent joins with --bound-keypair node-1, not bot-1)")
}

// wantAuditedWayOut checks that the last refusal audited names want, the
// way out an operator runs.
func (b *bkEnv) wantAuditedWayOut(t *testing.T, want string) {
	t.Helper()
	if last := b.audit.lastRefused(t); !strings.Contains(last.Reason, want) {
		t.Errorf("audit reason %q, want it to name %q", last.Reason, want)
	}
}

func TestBoundKeypairRecoveryBudget(t *testing.T) {
	b := newBKEnv(t, 2, boundkeypair.ModeStandard)
	first, _ := b.register(t)
	second, err := b.recover(t, first.JoinState)
	if err != nil {
		t.Fatal(err)
	}
	inst, _ := b.st.GetInstance(t.Context(), second.InstanceID)
	if inst.PreviousID != first.InstanceID {
		t.Fatalf("recovery's instance follows %q, want %q", inst.PreviousID, first.InstanceID)
	}
	if old, _ := b.st.GetInstance(t.Context(), first.InstanceID); old.State != store.InstanceSuperseded {
		t.Fatalf("the recovered instance is %s", old.State)
	}
	if second.Remaining != 0 {
		t.Fatalf("remaining %d, want 0", second.Remaining)
	}
	_, err = b.recover(t, second.JoinState)
	wantRefusal(t, err, KindFailedPrecondition, ReasonRecoveryExhausted)
	b.wantAuditedWayOut(t, "raise the limit: muster token get bot-1 -o yaml > token.yaml, edit spec.bound_keypair.recovery.limit, muster token apply -f token.yaml")

	// Raising the limit brings the agent back with no change on its side.
	spec := b.status(t).Spec
	spec.RecoveryLimit = 3
	if _, err := b.st.UpdateBoundKeypairSpec(t.Context(), "bot-1", spec, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := b.recover(t, second.JoinState); err != nil {
		t.Fatalf("after raising the limit: %v", err)
	}
}

func TestBoundKeypairStaleJoinStateLocks(t *testing.T) {
	b := newBKEnv(t, 5, boundkeypair.ModeStandard)
	first, _ := b.register(t)
	second, err := b.recover(t, first.JoinState) // the keypair's other holder
	if err != nil {
		t.Fatal(err)
	}
	// A holder with the first join state, past the retry window by key
	// (a different CSR key), is stale.
	_, err = b.recover(t, first.JoinState)
	wantRefusal(t, err, KindPermissionDenied, ReasonJoinStateMismatch)
	if _, err := b.st.FindAnyLock(t.Context(), []store.LockTarget{{Kind: store.LockToken, Target: "bot-1"}}); err != nil {
		t.Fatalf("the token is not locked: %v", err)
	}
	// Both holders are refused from now on.
	_, err = b.recover(t, second.JoinState)
	wantRefusal(t, err, KindPermissionDenied, ReasonLocked)
	if st := b.status(t); st.RecoverySequence != 2 {
		t.Fatalf("sequence %d after refusals, want 2", st.RecoverySequence)
	}
}

func TestBoundKeypairMissingOrForgedJoinState(t *testing.T) {
	b := newBKEnv(t, 5, boundkeypair.ModeStandard)
	first, _ := b.register(t)
	_, err := b.recover(t, "")
	wantRefusal(t, err, KindPermissionDenied, ReasonJoinStateMismatch)
	forger, _ := boundkeypair.NewSigningKey()
	forged, _ := forger.Sign(b.joinState(t, first.JoinState))
	_, err = b.recover(t, forged)
	wantRefusal(t, err, KindPermissionDenied, ReasonJoinStateMismatch)
	if _, err := b.st.FindAnyLock(t.Context(), []store.LockTarget{{Kind: store.LockToken, Target: "bot-1"}}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a missing or forged join state locked the token: %v", err)
	}
	if st := b.status(t); st.RecoverySequence != 1 || st.RecoveryCount != 1 {
		t.Fatalf("refusals consumed: %+v", st)
	}
}

func TestBoundKeypairLostReplyIsRetried(t *testing.T) {
	b := newBKEnv(t, 5, boundkeypair.ModeStandard)
	first, _ := b.register(t)
	_, der := csr(t)
	p := BoundKeypairPayload{Token: "bot-1", NodeID: "node-1", CSR: der, JoinState: first.JoinState}
	got, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, p, answerWith(b.priv))
	if err != nil {
		t.Fatal(err)
	}
	// The reply was lost: the agent sends the same request again.
	again, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, p, answerWith(b.priv))
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if !again.Retry || again.InstanceID != got.InstanceID || string(again.ChainPEM) != string(got.ChainPEM) {
		t.Fatalf("retry answered %+v, want the first answer", again.Issued)
	}
	if b.joinState(t, again.JoinState).RecoverySequence != 2 {
		t.Fatal("the retry's join state is not the recovery's")
	}
	if st := b.status(t); st.RecoveryCount != 2 || st.RecoverySequence != 2 {
		t.Fatalf("the retry consumed a recovery: %+v", st)
	}
}

// TestBoundKeypairRecoveryWithTheJoinsKey: a recovery that presents the
// current join state but the certificate key of the join before it is
// answered by the write as a repeat of that join; nothing is consumed, so
// the join state it carries must be the token's as it stands, or every
// later recovery would be refused as ahead of the store.
func TestBoundKeypairRecoveryWithTheJoinsKey(t *testing.T) {
	b := newBKEnv(t, 5, boundkeypair.ModeStandard)
	first, der := b.register(t)
	again, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1",
		CSR: der, JoinState: first.JoinState}, answerWith(b.priv))
	if err != nil {
		t.Fatal(err)
	}
	if !again.Retry || again.InstanceID != first.InstanceID {
		t.Fatalf("answered %+v, want the join's answer again", again.Issued)
	}
	st := b.status(t)
	if got := b.joinState(t, again.JoinState).RecoverySequence; got != st.RecoverySequence {
		t.Fatalf("join state at sequence %d, the token's is %d", got, st.RecoverySequence)
	}
	if again.Remaining != first.Remaining {
		t.Fatalf("remaining %d after a repeat, want %d", again.Remaining, first.Remaining)
	}
	if _, err := b.recover(t, again.JoinState); err != nil {
		t.Fatalf("the next recovery: %v", err)
	}
}

func TestBoundKeypairRefreshConsumesNothing(t *testing.T) {
	b := newBKEnv(t, 1, boundkeypair.ModeStandard)
	first, _ := b.register(t)
	leaf, err := ca.ParseCertsPEM(first.ChainPEM)
	if err != nil {
		t.Fatal(err)
	}
	_, der := csr(t)
	res, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1",
		CSR: der, JoinState: first.JoinState, Cert: leaf[0]}, answerWith(b.priv))
	if err != nil {
		t.Fatalf("refresh with the budget spent: %v", err)
	}
	if res.InstanceID != first.InstanceID || res.Generation != 1 {
		t.Fatalf("refresh made instance %s generation %d, want %s generation 1", res.InstanceID, res.Generation, first.InstanceID)
	}
	if st := b.status(t); st.RecoveryCount != 1 || st.RecoverySequence != 1 {
		t.Fatalf("a refresh consumed: %+v", st)
	}
	if b.joinState(t, res.JoinState).RecoverySequence != 1 {
		t.Fatal("the refresh's join state moved the sequence")
	}
}

func TestBoundKeypairModes(t *testing.T) {
	for _, tc := range []struct {
		mode      string
		joinState bool
	}{{boundkeypair.ModeRelaxed, true}, {boundkeypair.ModeInsecure, false}} {
		t.Run(tc.mode, func(t *testing.T) {
			b := newBKEnv(t, 1, tc.mode)
			res, _ := b.register(t)
			for i := range 3 {
				doc := ""
				if tc.joinState {
					doc = res.JoinState
				}
				var err error
				if res, err = b.recover(t, doc); err != nil {
					t.Fatalf("recovery %d past the limit: %v", i+1, err)
				}
			}
			if st := b.status(t); st.RecoveryCount != 0 || st.RecoverySequence != 4 {
				t.Fatalf("status %+v, want uncounted recoveries", st)
			}
		})
	}
}

// TestBoundKeypairSpentSecretWithAnotherKey: a second machine given the
// used registration secret, with a key of its own, is told the
// registration is closed (DESIGN.md's registration_closed), not sent to
// fail a challenge meant for the bound key.
func TestBoundKeypairSpentSecretWithAnotherKey(t *testing.T) {
	b := newBKEnv(t, 2, boundkeypair.ModeStandard)
	b.register(t)
	otherPriv, other := newKey(t)
	_, der := csr(t)
	_, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1",
		CSR: der, PublicKey: other.String(), RegistrationSecret: b.secret}, answerWith(otherPriv))
	wantRefusal(t, err, KindFailedPrecondition, ReasonRegistrationClosed)
	if st := b.status(t); st.BoundPublicKey != b.pub.String() || st.RecoveryCount != 1 {
		t.Fatalf("a refused registration changed the token: %+v", st)
	}
}

// TestBoundKeypairPlainRenewalRefused: a bound-keypair instance cannot
// renew over mTLS alone (RequestCertificate): a copied certificate key
// would skip the challenge and outlive the token.
func TestBoundKeypairPlainRenewalRefused(t *testing.T) {
	b := newBKEnv(t, 2, boundkeypair.ModeStandard)
	first, _ := b.register(t)
	leaf, err := ca.ParseCertsPEM(first.ChainPEM)
	if err != nil {
		t.Fatal(err)
	}
	_, der := csr(t)
	_, err = b.svc.Renew(t.Context(), Request{}, leaf[0], der)
	wantRefusal(t, err, KindFailedPrecondition, ReasonChallengeRequired)
	if inst, _ := b.st.GetInstance(t.Context(), first.InstanceID); inst.Generation != 0 {
		t.Fatalf("the refused renewal advanced the instance to generation %d", inst.Generation)
	}
}

// TestBoundKeypairRefreshEndsWithTheToken: a refresh whose token is
// deleted — before it, or while its challenge is out — is refused as an
// unknown token, and the instance is not renewed.
func TestBoundKeypairRefreshEndsWithTheToken(t *testing.T) {
	for _, during := range []bool{false, true} {
		t.Run(map[bool]string{false: "deleted before", true: "deleted during the exchange"}[during], func(t *testing.T) {
			b := newBKEnv(t, 2, boundkeypair.ModeStandard)
			first, _ := b.register(t)
			leaf, err := ca.ParseCertsPEM(first.ChainPEM)
			if err != nil {
				t.Fatal(err)
			}
			answer := answerWith(b.priv)
			ch := func(ctx context.Context, c []byte) ([]byte, error) {
				if during {
					if err := b.st.DeleteToken(ctx, "bot-1", setupLink); err != nil {
						t.Fatal(err)
					}
				}
				return answer(ctx, c)
			}
			if !during {
				if err := b.st.DeleteToken(t.Context(), "bot-1", setupLink); err != nil {
					t.Fatal(err)
				}
			}
			_, der := csr(t)
			_, err = b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1",
				CSR: der, JoinState: first.JoinState, Cert: leaf[0]}, ch)
			wantRefusal(t, err, KindNotFound, ReasonUnknownBoundToken)
			// The deleted token's settings (a limit of 2) as flags, from
			// the join state (before) or the refresh's read (during).
			b.wantAuditedWayOut(t, "muster bot add node-1 --recovery-limit 2 (the new token is named after its node: the agent joins with --bound-keypair node-1, not bot-1), then on the machine muster agent join --force --data ADIR --bound-keypair node-1 --registration-secret-file FILE")
			if inst, _ := b.st.GetInstance(t.Context(), first.InstanceID); inst.Generation != 0 {
				t.Fatalf("the refused refresh advanced the instance to generation %d", inst.Generation)
			}
		})
	}
}

// TestBoundKeypairJoinTokenAsNameNotRecorded: a join token pasted as the
// bound-keypair token's name is refused as malformed, with the way out,
// and its secret is in no audit record (it was the actor and the detail
// of a not-found refusal).
func TestBoundKeypairJoinTokenAsNameNotRecorded(t *testing.T) {
	b := newBKEnv(t, 1, boundkeypair.ModeStandard)
	_, der := csr(t)
	const pasted = "abc123.secretsecretsecr"
	_, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{Source: "test"},
		BoundKeypairPayload{Token: pasted, NodeID: "node-1", CSR: der}, answerWith(b.priv))
	wantRefusal(t, err, KindInvalid, reasonJoinTokenAsName)
	if !strings.Contains(err.Error(), "muster agent join --token") || strings.Contains(err.Error(), "secretsecret") {
		t.Errorf("refusal %q: want the way out, never the secret", err)
	}
	if len(b.audit.refused) == 0 {
		t.Fatal("the refusal was not audited")
	}
	for _, e := range append(b.audit.refused, b.audit.events...) {
		if strings.Contains(fmt.Sprintf("%+v", e), "secretsecret") {
			t.Errorf("audit record holds the pasted secret: %+v", e)
		}
	}
}

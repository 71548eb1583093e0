package enroll

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/store"
)

// signedFor is a document this authority signed for bot-1 on node-1 naming
// key at seq (epoch ""), issued at iat: what an agent that rotated or
// registered after the backup holds.
func (b *bkEnv) signedFor(t *testing.T, key boundkeypair.PublicKey, seq int64, iat time.Time) string {
	t.Helper()
	k, err := b.svc.joinStateKeys().current(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	doc, err := k.Sign(boundkeypair.JoinState{Issuer: b.svc.cfg.AuthorityID, Token: "bot-1", NodeID: "node-1", IssuedAt: iat.Truncate(time.Second),
		InstanceID: "i-lost", BoundKey: key.Fingerprint(), RecoverySequence: seq, RecoveryLimit: 5, RecoveryMode: boundkeypair.ModeStandard})
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

func newKey(t *testing.T) (ed25519.PrivateKey, boundkeypair.PublicKey) {
	t.Helper()
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	k, err := boundkeypair.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return priv, k
}

// offer is a join offering key (answering with priv) and presenting doc.
func (b *bkEnv) offer(t *testing.T, priv ed25519.PrivateKey, key boundkeypair.PublicKey, doc string) (*BoundKeypairResult, error) {
	t.Helper()
	_, der := csr(t)
	return b.svc.RegisterUsingBoundKeypair(t.Context(), Request{Source: "test"}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1",
		CSR: der, JoinState: doc, PublicKey: key.String()}, answerWith(priv))
}

func (b *bkEnv) openWindow(t *testing.T, id string) {
	t.Helper()
	if _, err := b.st.OpenResync(t.Context(), store.ResyncOpen{ID: id, For: time.Hour, OpenedBy: "admin:test", Reason: "restore"}, setupEpochLink); err != nil {
		t.Fatal(err)
	}
}

// TestBoundKeypairResyncRebindsRotatedKey: the store was restored from
// before the agent rotated its key (in a refresh, so at the same
// sequence). Without a window the token's old key is challenged and the
// agent is refused, with no lock; inside one the key its document names
// is challenged, and the resync rebinds the token to it in its write,
// audited with both fingerprints; its lost reply is answered again; the
// agent then goes on with it, and the old key's holder is refused.
func TestBoundKeypairResyncRebindsRotatedKey(t *testing.T) {
	b := newBKEnv(t, 5, boundkeypair.ModeStandard)
	first, _ := b.register(t)
	oldFP := b.pub.Fingerprint()
	priv, key := newKey(t)
	doc := b.signedFor(t, key, 1, time.Now().Add(boundkeypair.Leeway+2*time.Second))

	_, err := b.offer(t, priv, key, doc)
	wantRefusal(t, err, KindUnauthenticated, ReasonChallengeFailed)
	wantRestoreHint(t, err, true)
	if b.locked(t) || b.status(t).BoundPublicKey != b.pub.String() {
		t.Fatalf("no window: locked %v, token %+v", b.locked(t), b.status(t))
	}
	// A document from before the token's last rotation would not be
	// rebound by a window: its refusal does not point to one.
	_, err = b.offer(t, priv, key, b.signedFor(t, key, 1, time.Now().Add(-time.Hour)))
	wantRefusal(t, err, KindUnauthenticated, ReasonChallengeFailed)
	wantRestoreHint(t, err, false)

	b.openWindow(t, "ep-1")
	_, der := csr(t)
	p := BoundKeypairPayload{Token: "bot-1", NodeID: "node-1", CSR: der, JoinState: doc, PublicKey: key.String()}
	res, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{Source: "test"}, p, answerWith(priv))
	if err != nil {
		t.Fatalf("inside the window: %v", err)
	}
	st := b.status(t)
	js := b.joinState(t, res.JoinState)
	if st.BoundPublicKey != key.String() || st.LastRotatedAt.IsZero() || st.RecoverySequence != 2 || st.Epoch != "ep-1" ||
		st.RecoveryCount != 1 || js.BoundKey != key.Fingerprint() || res.BoundKey != key.Fingerprint() {
		t.Fatalf("after the rebind: token %+v, document %+v", st, js)
	}
	var audited bool
	for _, e := range b.audit.events {
		audited = audited || e.Action == "token.resync" && strings.Contains(e.Reason, "rebound from "+oldFP+" to "+key.Fingerprint())
	}
	if !audited {
		t.Fatalf("no token.resync record with both keys in %+v", b.audit.events)
	}

	// The reply was lost: the same request again gets the same answer,
	// naming the key the rebind bound.
	again, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{Source: "test"}, p, answerWith(priv))
	if err != nil || !again.Retry || again.InstanceID != res.InstanceID {
		t.Fatalf("the rebind's retry: %+v, %v", again, err)
	}
	if js := b.joinState(t, again.JoinState); js.BoundKey != key.Fingerprint() || js.RecoverySequence != 2 || js.Epoch != "ep-1" {
		t.Fatalf("the retry's document: %+v", js)
	}

	// The agent goes on with its key and new document.
	if _, err := b.offer(t, priv, key, res.JoinState); err != nil {
		t.Fatalf("a recovery after the rebind: %v", err)
	}
	// The old key's holder, with the pre-restore document, no longer
	// has its key challenged.
	_, err = b.offer(t, b.priv, b.pub, first.JoinState)
	wantRefusal(t, err, KindUnauthenticated, ReasonChallengeFailed)
}

// TestBoundKeypairResyncRebindsRegistration: the store was restored from
// before the agent registered with the secret; inside a window its
// document binds its key, with no secret presented.
func TestBoundKeypairResyncRebindsRegistration(t *testing.T) {
	b := newBKEnv(t, 5, boundkeypair.ModeStandard)
	doc := b.signedFor(t, b.pub, 1, time.Now().Add(boundkeypair.Leeway+2*time.Second))
	_, err := b.offer(t, b.priv, b.pub, doc)
	wantRefusal(t, err, KindInvalid, "")
	wantRestoreHint(t, err, true)
	b.openWindow(t, "ep-1")
	res, err := b.offer(t, b.priv, b.pub, doc)
	if err != nil {
		t.Fatalf("inside the window: %v", err)
	}
	st := b.status(t)
	if st.BoundPublicKey != b.pub.String() || st.RecoverySequence != 2 || st.Epoch != "ep-1" || st.RecoveryCount != 0 ||
		st.BoundInstanceID != res.InstanceID || st.SecretCiphertext != nil {
		t.Fatalf("after the rebind: %+v", st)
	}
	for _, e := range b.audit.events {
		if e.Action == "token.resync" && !strings.Contains(e.Reason, "rebound from none to "+b.pub.Fingerprint()) {
			t.Fatalf("token.resync record: %q", e.Reason)
		}
	}
}

// TestBoundKeypairResyncRebindRefusals: inside a window, a document from
// before the token's creation (a deleted namesake's), from before its last
// rotation (naming a retired key), naming a locked key, or behind the
// token, does not rebind; behind locks.
func TestBoundKeypairResyncRebindRefusals(t *testing.T) {
	t.Run("before the token's creation", func(t *testing.T) {
		b := newBKEnv(t, 5, boundkeypair.ModeStandard)
		b.register(t)
		b.openWindow(t, "ep-1")
		priv, key := newKey(t)
		_, err := b.offer(t, priv, key, b.signedFor(t, key, 4, time.Now().Add(-time.Hour)))
		wantRefusal(t, err, KindUnauthenticated, ReasonChallengeFailed)
		if st := b.status(t); st.BoundPublicKey != b.pub.String() || b.locked(t) {
			t.Fatalf("token %+v, locked %v", st, b.locked(t))
		}
	})
	t.Run("before the last rotation: a retired key", func(t *testing.T) {
		b := newBKEnv(t, 5, boundkeypair.ModeStandard)
		// The registration's document (issued to the second) must be
		// after the token's creation, so only the rotation refuses it.
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(1100 * time.Millisecond)))
		first, _ := b.register(t)
		retired, retiredPub := b.priv, b.pub
		// Rotate to a new key in a recovery: both challenges.
		next, nextPub := newKey(t)
		_, der := csr(t)
		var n int
		_, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{Source: "test"}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1",
			CSR: der, JoinState: first.JoinState, NewPublicKey: nextPub.String()}, func(ctx context.Context, c []byte) ([]byte, error) {
			n++
			if n == 1 {
				return answerWith(retired)(ctx, c)
			}
			return answerWith(next)(ctx, c)
		})
		if err != nil || b.status(t).BoundPublicKey != nextPub.String() {
			t.Fatalf("rotation: %v", err)
		}
		b.openWindow(t, "ep-1")
		// The registration's document naming the retired key, as if
		// ahead, issued after the creation but before the rotation.
		_, err = b.offer(t, retired, retiredPub, b.signedAt(t, first.JoinState, 7, ""))
		wantRefusal(t, err, KindUnauthenticated, ReasonChallengeFailed)
		if ref := (*Refusal)(nil); !errors.As(err, &ref) || !strings.Contains(ref.Detail, "not after the token's last rotation") {
			t.Fatalf("the refusal's audit detail does not say why there was no rebind: %v", err)
		}
		if st := b.status(t); st.BoundPublicKey != nextPub.String() || st.RecoverySequence != 2 || b.locked(t) {
			t.Fatalf("token %+v, locked %v", st, b.locked(t))
		}
	})
	t.Run("a locked key", func(t *testing.T) {
		b := newBKEnv(t, 5, boundkeypair.ModeStandard)
		b.register(t)
		b.openWindow(t, "ep-1")
		priv, key := newKey(t)
		if err := b.st.InsertLock(t.Context(), store.Lock{ID: "l1", Kind: store.LockPublicKey, Target: key.Fingerprint(), CreatedAt: time.Now()}, setupLink); err != nil {
			t.Fatal(err)
		}
		_, err := b.offer(t, priv, key, b.signedFor(t, key, 4, time.Now().Add(boundkeypair.Leeway+2*time.Second)))
		wantRefusal(t, err, KindPermissionDenied, ReasonLocked)
		if st := b.status(t); st.BoundPublicKey != b.pub.String() {
			t.Fatalf("token %+v", st)
		}
	})
	t.Run("behind: locks", func(t *testing.T) {
		b := newBKEnv(t, 5, boundkeypair.ModeStandard)
		first, _ := b.register(t)
		if _, err := b.recover(t, first.JoinState); err != nil {
			t.Fatal(err)
		}
		b.openWindow(t, "ep-1")
		priv, key := newKey(t)
		_, err := b.offer(t, priv, key, b.signedFor(t, key, 1, time.Now().Add(boundkeypair.Leeway+2*time.Second)))
		wantRefusal(t, err, KindPermissionDenied, ReasonJoinStateMismatch)
		if st := b.status(t); st.BoundPublicKey != b.pub.String() || !b.locked(t) {
			t.Fatalf("token %+v, locked %v", st, b.locked(t))
		}
	})
}

// wantRestoreHint checks whether a refusal outside a window tells the
// operator (in its audit detail) that a resync window would rebind.
func wantRestoreHint(t *testing.T, err error, want bool) {
	t.Helper()
	var ref *Refusal
	if !errors.As(err, &ref) {
		t.Fatalf("err = %v, want a refusal", err)
	}
	if got := strings.Contains(ref.Detail, "muster bound-keypair resync open"); got != want {
		t.Fatalf("refusal detail %q: names the resync window %v, want %v", ref.Detail, got, want)
	}
}

package boundkeypair

import (
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/seal"
)

func keySet(ks ...SigningKey) func(string) (ed25519.PublicKey, bool) {
	return func(kid string) (ed25519.PublicKey, bool) {
		for _, k := range ks {
			if k.ID == kid {
				return k.Public(), true
			}
		}
		return nil, false
	}
}

func sampleState() JoinState {
	return JoinState{Issuer: "prod-a3f2e1", Token: "bot-1", NodeID: "node-1", IssuedAt: time.Unix(1_800_000_000, 0),
		InstanceID: "6f1c0f7e-0000-4000-8000-000000000001", BoundKey: "SHA256:abc", RecoverySequence: 3,
		RecoveryLimit: 5, RecoveryMode: ModeStandard, Epoch: "ep-2b7c", TokenCreated: time.UnixMicro(1_799_999_000_123_456).UTC()}
}

func TestJoinStateRoundTripAndOldKeys(t *testing.T) {
	old, _ := NewSigningKey()
	cur, _ := NewSigningKey()
	doc, err := old.Sign(sampleState())
	if err != nil {
		t.Fatal(err)
	}
	// Signed by a key since replaced: still verifies while the key is kept.
	got, err := VerifyJoinState(doc, keySet(cur, old), "prod-a3f2e1", "bot-1", "node-1")
	if err != nil {
		t.Fatal(err)
	}
	if got != sampleState() {
		t.Fatalf("got %+v, want %+v", got, sampleState())
	}
	if _, err := VerifyJoinState(doc, keySet(cur), "prod-a3f2e1", "bot-1", "node-1"); !errors.Is(err, ErrJoinStateInvalid) {
		t.Fatalf("a dropped key still verifies: %v", err)
	}
}

func TestJoinStateRefusals(t *testing.T) {
	k, _ := NewSigningKey()
	forger, _ := NewSigningKey()
	doc, _ := k.Sign(sampleState())
	forged, _ := SigningKey{ID: k.ID, Private: forger.Private}.Sign(sampleState())
	c, _ := NewChallenge("prod-a3f2e1", time.Now())
	answer, _ := Answer(k.Private.(ed25519.PrivateKey), c, time.Now()) // right key, wrong typ
	for _, tc := range []struct {
		name, doc, iss, token, node, reason string
	}{
		{"forged", forged, "prod-a3f2e1", "bot-1", "node-1", "signature"},
		{"another authority", doc, "other-b4c5d6", "bot-1", "node-1", "authority"},
		{"another token", doc, "prod-a3f2e1", "bot-2", "node-1", "token"},
		{"another node", doc, "prod-a3f2e1", "bot-1", "node-2", "node"},
		{"not a join state", answer, "prod-a3f2e1", "bot-1", "node-1", "type"},
		{"garbage", "a.b.c", "prod-a3f2e1", "bot-1", "node-1", "EdDSA"},
		{"too large", strings.Repeat("a", MaxMessageBytes+1), "prod-a3f2e1", "bot-1", "node-1", "too large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := VerifyJoinState(tc.doc, keySet(k), tc.iss, tc.token, tc.node)
			if !errors.Is(err, ErrJoinStateInvalid) || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("VerifyJoinState = %v, want join_state_mismatch naming %q", err, tc.reason)
			}
		})
	}
}

func TestSigningKeySealedAtRest(t *testing.T) {
	var sk seal.StorageKey
	copy(sk[:], "a storage key of thirty-two bytes")
	s, _ := sk.Sealer(seal.InfoJoinState)
	other, _ := sk.Sealer(seal.InfoToken)
	k, _ := NewSigningKey()
	ct, nonce, err := k.Seal(s)
	if err != nil {
		t.Fatal(err)
	}
	got, err := OpenSigningKey(s, k.ID, ct, nonce)
	if err != nil || !got.Private.(ed25519.PrivateKey).Equal(k.Private) {
		t.Fatalf("OpenSigningKey: %v", err)
	}
	if _, err := OpenSigningKey(other, k.ID, ct, nonce); err == nil {
		t.Error("a sealer of another purpose opened the key")
	}
	if _, err := OpenSigningKey(s, "js-0000000000000000", ct, nonce); err == nil {
		t.Error("the key opened under another ID")
	}
}

// seedJoinStates seeds f with a join state document signed by the key it
// returns, that document cut in half, and an unsigned one.
func seedJoinStates(f *testing.F) SigningKey {
	f.Helper()
	k := SigningKey{Private: ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))}
	k.ID = KeyID(k.Public())
	doc, _ := k.Sign(sampleState())
	f.Add(doc)
	f.Add(doc[:len(doc)/2])
	f.Add("eyJhbGciOiJub25lIn0.e30.")
	return k
}

// FuzzVerifyJoinState: documents come from agents, so from anyone. Nothing
// but a document the key signed, for this token and node, is accepted.
func FuzzVerifyJoinState(f *testing.F) {
	k := seedJoinStates(f)
	f.Fuzz(func(t *testing.T, doc string) {
		got, err := VerifyJoinState(doc, keySet(k), "prod-a3f2e1", "bot-1", "node-1")
		if err != nil {
			if !errors.Is(err, ErrJoinStateInvalid) {
				t.Fatalf("refusal %v does not wrap ErrJoinStateInvalid", err)
			}
			return
		}
		if got.Issuer != "prod-a3f2e1" || got.Token != "bot-1" || got.NodeID != "node-1" || got.RecoverySequence < 0 {
			t.Fatalf("accepted %+v", got)
		}
	})
}

// FuzzSettings: the agent reads its join state file, which anything on
// the machine may have written: Settings never panics and gives only a
// known mode and a limit of zero or more.
func FuzzSettings(f *testing.F) {
	seedJoinStates(f)
	f.Fuzz(func(t *testing.T, doc string) {
		limit, mode, ok := Settings(doc)
		if ok && (limit < 0 || (mode != ModeStandard && mode != ModeRelaxed && mode != ModeInsecure)) {
			t.Fatalf("Settings(%q) = %d, %q", doc, limit, mode)
		}
	})
}

func TestSettingsOfASignedDocument(t *testing.T) {
	k := SigningKey{Private: ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))}
	s := sampleState()
	s.RecoveryLimit, s.RecoveryMode = 4, ModeRelaxed
	doc, err := k.Sign(s)
	if err != nil {
		t.Fatal(err)
	}
	if limit, mode, ok := Settings(doc); !ok || limit != 4 || mode != ModeRelaxed {
		t.Errorf("Settings = %d, %q, %v; want 4, relaxed, true", limit, mode, ok)
	}
	if got := BotAddFlags(4, ModeRelaxed, true); got != " --recovery-limit 4 --recovery-mode relaxed --svid-usage client,server" {
		t.Errorf("BotAddFlags = %q", got)
	}
}

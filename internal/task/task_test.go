package task

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/muster-dev/muster/internal/signer"
)

var t0 = time.Date(2026, 3, 9, 12, 0, 0, 0, time.UTC)

// keyring is a Keys with fixed states, standing in for an agent's trust.
type keyring struct {
	keys   map[string]ed25519.PublicKey
	states map[string]signer.State
	static []ed25519.PublicKey
}

func (k keyring) Verifier(id string, _ time.Time) (ed25519.PublicKey, signer.State, bool) {
	st := k.states[id]
	if !st.Trusted() {
		return nil, st, false
	}
	return k.keys[id], st, true
}
func (k keyring) StaticKeys() []ed25519.PublicKey { return k.static }
func (k keyring) StateAt(id string, _ time.Time) (signer.SetKey, signer.State, bool) {
	st, ok := k.states[id]
	return signer.SetKey{VersionID: id}, st, ok
}

type fixture struct {
	privs map[string]ed25519.PrivateKey
	ring  keyring
}

func newFixture(t testing.TB) *fixture {
	f := &fixture{privs: map[string]ed25519.PrivateKey{}, ring: keyring{keys: map[string]ed25519.PublicKey{}, states: map[string]signer.State{}}}
	for id, st := range map[string]signer.State{"v1": signer.Grace, "v2": signer.Active, "v3": signer.Staged, "v0": signer.Retired, "vx": signer.Revoked} {
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		f.privs[id], f.ring.keys[id], f.ring.states[id] = priv, pub, st
	}
	return f
}

func envelope(typ string) Envelope {
	return Envelope{
		TaskID: uuid.NewString(), TaskType: typ, Target: Target{NodeIDs: []string{"web-1"}},
		Params: map[string]string{}, IssuedAt: t0, ExpiresAt: t0.Add(DefaultExpires), SignerVersionID: "v2",
	}
}

func (f *fixture) sign(t testing.TB, e Envelope) []byte {
	t.Helper()
	priv := f.privs[e.SignerVersionID]
	if priv == nil {
		_, priv, _ = ed25519.GenerateKey(rand.Reader)
	}
	raw, err := e.Sign(func(msg []byte) ([]byte, error) { return ed25519.Sign(priv, msg), nil })
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func (f *fixture) verifier(now time.Time) *Verifier {
	return &Verifier{NodeID: "web-1", Labels: map[string]string{"role": "web"}, Keys: f.ring, Window: NewWindow(nil), Now: func() time.Time { return now }}
}

func TestVerify(t *testing.T) {
	f := newFixture(t)
	with := func(fn func(*Envelope)) Envelope { e := envelope(TypeReport); fn(&e); return e }
	unsigned := func(e Envelope) []byte {
		doc, _ := e.Canonical()
		raw, _ := json.Marshal(signed{Envelope: doc})
		return raw
	}
	// reencoded pretty-prints the envelope, as a relay re-encoding JSON
	// would: the signature still covers its canonical form.
	reencoded := func(raw []byte) []byte {
		var w signed
		if err := json.Unmarshal(raw, &w); err != nil {
			t.Fatal(err)
		}
		var e map[string]any
		_ = json.Unmarshal(w.Envelope, &e)
		w.Envelope, _ = json.MarshalIndent(e, "", "  ")
		out, _ := json.Marshal(w)
		return out
	}
	tampered := func(raw []byte) []byte {
		return []byte(strings.Replace(string(raw), `"node.report"`, `"node.renew_now"`, 1))
	}
	for name, tc := range map[string]struct {
		raw    []byte
		now    time.Time
		want   Reason
		signer string
	}{
		"active signer":          {raw: f.sign(t, envelope(TypeReport))},
		"re-encoded envelope":    {raw: reencoded(f.sign(t, envelope(TypeReport)))},
		"staged signer":          {raw: f.sign(t, with(func(e *Envelope) { e.SignerVersionID = "v3" }))},
		"grace signer":           {raw: f.sign(t, with(func(e *Envelope) { e.SignerVersionID = "v1" }))},
		"label target":           {raw: f.sign(t, with(func(e *Envelope) { e.Target = Target{Labels: map[string]string{"role": "web"}} }))},
		"all":                    {raw: f.sign(t, with(func(e *Envelope) { e.Target = Target{All: true} }))},
		"expiry within skew":     {raw: f.sign(t, envelope(TypeReport)), now: t0.Add(DefaultExpires + signer.Skew)},
		"unsigned":               {raw: unsigned(envelope(TypeReport)), want: ReasonUnsigned, signer: "v2"},
		"retired signer":         {raw: f.sign(t, with(func(e *Envelope) { e.SignerVersionID = "v0" })), want: ReasonUnknownSigner, signer: "v0"},
		"revoked signer":         {raw: f.sign(t, with(func(e *Envelope) { e.SignerVersionID = "vx" })), want: ReasonUnknownSigner, signer: "vx"},
		"unknown signer":         {raw: f.sign(t, with(func(e *Envelope) { e.SignerVersionID = "v9" })), want: ReasonUnknownSigner, signer: "v9"},
		"edited after signing":   {raw: tampered(f.sign(t, envelope(TypeReport))), want: ReasonBadSignature, signer: "v2"},
		"expired":                {raw: f.sign(t, envelope(TypeReport)), now: t0.Add(DefaultExpires + signer.Skew + time.Second), want: ReasonExpired, signer: "v2"},
		"issued in the future":   {raw: f.sign(t, envelope(TypeReport)), now: t0.Add(-signer.Skew - time.Second), want: ReasonNotYetValid, signer: "v2"},
		"other node":             {raw: f.sign(t, with(func(e *Envelope) { e.Target = Target{NodeIDs: []string{"db-1"}} })), want: ReasonMistargeted, signer: "v2"},
		"other label":            {raw: f.sign(t, with(func(e *Envelope) { e.Target = Target{Labels: map[string]string{"role": "db"}} })), want: ReasonMistargeted, signer: "v2"},
		"not JSON":               {raw: []byte("{"), want: ReasonMalformed},
		"unknown envelope field": {raw: []byte(`{"envelope":{"task_id":"x","extra":1},"signature":""}`), want: ReasonMalformed},
	} {
		t.Run(name, func(t *testing.T) {
			now := tc.now
			if now.IsZero() {
				now = t0.Add(time.Minute)
			}
			env, err := f.verifier(now).Verify(tc.raw)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				if env.TaskType != TypeReport {
					t.Fatalf("envelope = %+v", env)
				}
				return
			}
			var re *RefusalError
			if !errors.As(err, &re) || re.Reason != tc.want || re.SignerVersionID != tc.signer {
				t.Fatalf("Verify = %v, want refusal %s by signer %q", err, tc.want, tc.signer)
			}
		})
	}
}

func TestReplayWindow(t *testing.T) {
	f := newFixture(t)
	raw := f.sign(t, envelope(TypeReport))
	v := f.verifier(t0.Add(time.Minute))
	if _, err := v.Verify(raw); err != nil {
		t.Fatal(err)
	}
	// The window survives persistence: a restarted agent still refuses it.
	data, _ := json.Marshal(v.Window.Entries())
	var entries map[string]time.Time
	if err := json.Unmarshal(data, &entries); err != nil {
		t.Fatal(err)
	}
	v.Window = NewWindow(entries)
	var re *RefusalError
	if _, err := v.Verify(raw); !errors.As(err, &re) || re.Reason != ReasonReplayed {
		t.Fatalf("replay: %v", err)
	}

	w := NewWindow(nil)
	for i := 0; i < MaxWindow; i++ {
		if err := w.Remember(uuid.NewString(), t0.Add(time.Duration(i%2)*time.Hour), t0); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Remember("x", t0, t0); !errors.Is(err, ErrWindowFull) {
		t.Fatalf("full window: %v", err)
	}
	// Once half the entries have expired they make room.
	if err := w.Remember("x", t0, t0.Add(signer.Skew+time.Second)); err != nil {
		t.Fatalf("after expiry: %v", err)
	}
	if n := len(w.Entries()); n != MaxWindow/2+1 {
		t.Fatalf("entries = %d", n)
	}
}

func TestStaticKeys(t *testing.T) {
	f := newFixture(t)
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	f.privs["legacy"] = priv
	e := envelope(TypeReport)
	e.SignerVersionID = "legacy"
	raw := f.sign(t, e)
	v := f.verifier(t0)
	var re *RefusalError
	if _, err := v.Verify(raw); !errors.As(err, &re) || re.Reason != ReasonUnknownSigner {
		t.Fatalf("without static list: %v", err)
	}
	f.ring.static = []ed25519.PublicKey{pub}
	if _, err := f.verifier(t0).Verify(raw); err != nil {
		t.Fatalf("static list: %v", err)
	}
}

func TestCheck(t *testing.T) {
	for name, fn := range map[string]func(*Envelope){
		"task id":        func(e *Envelope) { e.TaskID = "1" },
		"type":           func(e *Envelope) { e.TaskType = "Rotate Key" },
		"signer":         func(e *Envelope) { e.SignerVersionID = "" },
		"two targets":    func(e *Envelope) { e.Target.All = true },
		"no target":      func(e *Envelope) { e.Target = Target{} },
		"bad node":       func(e *Envelope) { e.Target.NodeIDs = []string{"Web_1"} },
		"lifetime":       func(e *Envelope) { e.ExpiresAt = e.IssuedAt.Add(MaxLifetime + time.Second) },
		"expiry first":   func(e *Envelope) { e.ExpiresAt = e.IssuedAt },
		"long param":     func(e *Envelope) { e.Params["k"] = strings.Repeat("x", MaxParamValue+1) },
		"invalid utf-8":  func(e *Envelope) { e.Params["k"] = "\xff" },
		"empty param":    func(e *Envelope) { e.Params[""] = "v" },
		"bad label name": func(e *Envelope) { e.Target = Target{Labels: map[string]string{"a b": "c"}} },
	} {
		e := envelope(TypeReport)
		fn(&e)
		if err := e.Check(); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
		if _, err := e.Sign(func([]byte) ([]byte, error) { return make([]byte, 64), nil }); err == nil {
			t.Errorf("%s: signed", name)
		}
	}
}

func FuzzDecode(f *testing.F) {
	fx := newFixture(f)
	f.Add(fx.sign(f, envelope(TypeReport)))
	e := envelope(TypeRotateSigningKey)
	e.Target = Target{Labels: map[string]string{"a": "b"}}
	e.Params = RotateParams("v3", fx.ring.keys["v3"], t0.Add(time.Hour), t0.Add(2*time.Hour))
	f.Add(fx.sign(f, e))
	f.Add([]byte(`{"envelope":{},"signature":""}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		env, err := Decode(data)
		if err != nil {
			return
		}
		if err := env.Check(); err != nil {
			t.Fatalf("decoded an envelope that fails its check: %v", err)
		}
		// Whatever decodes re-encodes to the same canonical bytes.
		a, err := env.Canonical()
		if err != nil {
			t.Fatal(err)
		}
		var again Envelope
		err = signer.DecodeStrict(a, &again)
		if err != nil {
			t.Fatalf("canonical form does not decode: %v", err)
		}
		b, _ := again.Canonical()
		if string(a) != string(b) {
			t.Fatalf("canonical form not stable:\n%s\n%s", a, b)
		}
		_, _ = fx.verifier(t0).Verify(data)
	})
}

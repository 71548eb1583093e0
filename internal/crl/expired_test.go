package crl

import (
	"context"
	"crypto"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/store"
)

// destroyedKey is a key custody no longer holds: every signature fails,
// as a PKCS#11 token's does once the key's object is destroyed.
type destroyedKey struct {
	pub   crypto.PublicKey
	signs atomic.Int64
}

func (k *destroyedKey) Public() crypto.PublicKey { return k.pub }

func (k *destroyedKey) Sign(io.Reader, []byte, crypto.SignerOpts) ([]byte, error) {
	k.signs.Add(1)
	return nil, errors.New("custody: the key's private object is not in the PKCS#11 token")
}

// TestPublishSkipsExpiredIssuer: an intermediate past its not-after (by
// the store clock) is retired by the leader, which destroys its key at
// once; a replica that has not read the retirement yet still lists it
// among its issuers. Its list is not signed again (the pass failed on the
// destroyed key, logged as an ERROR), it is still served until the
// replica drops it, and it leaves the statuses (the metrics).
func TestPublishSkipsExpiredIssuer(t *testing.T) {
	ctx := context.Background()
	h, st, issuers := setup(t)
	agent := *h.Issuer(ca.RoleAgent).Cert
	agent.NotAfter = st.now.Add(40 * time.Minute)
	key := &destroyedKey{pub: agent.PublicKey}
	destroyed := false
	withExpiring := func() []Issuer {
		out := issuers()
		for i := range out {
			if out[i].Role == string(ca.RoleAgent) {
				out[i].Cert = &agent
				if destroyed {
					out[i].Signer = key
				}
			}
		}
		return out
	}
	p := New(Config{Store: st, Issuers: withExpiring, Validity: time.Hour})
	if _, err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	name := Issuer{Role: string(ca.RoleAgent), Cert: &agent}.Name()
	before, err := st.GetCRL(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	// At its not-after: retired, its key destroyed, the replica not told
	// yet. Past half the validity, every other list is due again.
	destroyed = true
	st.mu.Lock()
	st.now = agent.NotAfter
	st.mu.Unlock()
	if _, err := p.Publish(ctx); err != nil {
		t.Fatalf("a pass with an expired intermediate whose key is destroyed: %v", err)
	}
	if n := key.signs.Load(); n != 0 {
		t.Errorf("the expired intermediate's destroyed key was asked for %d signatures", n)
	}
	if after, err := p.Get(ctx, name); err != nil || after.Number != before.Number {
		t.Errorf("the expired intermediate's list: number %d (%v), want %d served as it was", after.Number, err, before.Number)
	}
	if server, _ := st.GetCRL(ctx, Issuer{Role: string(ca.RoleServer), Cert: h.Issuer(ca.RoleServer).Cert}.Name()); server.Number != st.now.Unix() {
		t.Errorf("the server intermediate's list is number %d, want %d (signed again)", server.Number, st.now.Unix())
	}
	for _, s := range p.Statuses() {
		if s.Issuer.Name() == name {
			t.Errorf("the expired intermediate's list is still in the statuses: %+v", s)
		}
	}
}

// TestPublishSkipsRetiredIssuer: an intermediate retired before its
// not-after (its last leaf expired) has its key destroyed by the leader at
// once; a replica that has not read the retirement yet still lists it,
// and its pass fails to sign with the destroyed key. The pass re-reads the
// intermediate's state, finds it retired and goes on without an error (no
// ERROR logged by Run, no retry in 5 s), the stored list is served as it
// was, and it leaves the statuses. Before, the pass returned the key's
// error, which Run logged as an ERROR.
func TestPublishSkipsRetiredIssuer(t *testing.T) {
	ctx := context.Background()
	h, st, issuers := setup(t)
	agent := h.Issuer(ca.RoleAgent).Cert
	serial := agent.SerialNumber.Text(16)
	st.cas = []store.CACert{{Role: string(ca.RoleAgent), Serial: serial, State: store.CARetiring}}
	key := &destroyedKey{pub: agent.PublicKey}
	destroyed := false
	withRetired := func() []Issuer {
		out := issuers()
		for i := range out {
			if out[i].Role == string(ca.RoleAgent) && destroyed {
				out[i].Signer = key
			}
		}
		return out
	}
	var logs syncBuffer
	p := New(Config{Store: st, Issuers: withRetired, Validity: time.Hour, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if _, err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	name := Issuer{Role: string(ca.RoleAgent), Cert: agent}.Name()
	before, err := st.GetCRL(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	// Retired well before its not-after, its key destroyed, this replica
	// not told yet; past half the validity every list is due again.
	destroyed = true
	st.mu.Lock()
	st.cas[0].State = store.CARetired
	st.now = st.now.Add(40 * time.Minute)
	st.mu.Unlock()
	if _, err := p.Publish(ctx); err != nil {
		t.Fatalf("a pass with a retired intermediate whose key is destroyed: %v", err)
	}
	if n := key.signs.Load(); n != 1 {
		t.Errorf("the destroyed key was asked for %d signatures, want 1", n)
	}
	if after, err := p.Get(ctx, name); err != nil || after.Number != before.Number || after.NextUpdate != before.NextUpdate {
		t.Errorf("the retired intermediate's list: number %d (%v), want %d served as it was", after.Number, err, before.Number)
	}
	if server, _ := st.GetCRL(ctx, Issuer{Role: string(ca.RoleServer), Cert: h.Issuer(ca.RoleServer).Cert}.Name()); server.Number != st.now.Unix() {
		t.Errorf("the server intermediate's list is number %d, want %d (signed again)", server.Number, st.now.Unix())
	}
	for _, s := range p.Statuses() {
		if s.Issuer.Name() == name {
			t.Errorf("the retired intermediate's list is still in the statuses: %+v", s)
		}
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("an ERROR was logged:\n%s", logs.String())
	}

	// Not retired: a key that fails to sign is still an error.
	st.mu.Lock()
	st.cas[0].State = store.CARetiring
	st.now = st.now.Add(40 * time.Minute)
	st.mu.Unlock()
	if _, err := p.Publish(ctx); err == nil {
		t.Error("a pass whose retiring intermediate's key fails to sign succeeded")
	}
}

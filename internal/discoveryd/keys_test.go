package discoveryd

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/referral"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

func jwksIDs(t *testing.T, data []byte) []string {
	t.Helper()
	keys, err := referral.ParseJWKS(data)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for id := range keys {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func sorted(ids ...string) []string {
	slices.Sort(ids)
	return ids
}

func TestKeyRotation(t *testing.T) {
	e := start(t, generous, func(s *Server) { s.keys.signDelay = 0 })
	a := newAuthority(t, "prod")
	e.register(a, 1, openPolicy())
	ticket := func() string {
		resp, err := e.client.RequestReferralTicket(ctxT(t), &musterv1.RequestReferralTicketRequest{AuthorityId: a.id, NodeId: "web-1"})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetTicket()
	}
	first, _ := e.srv.keys.activeSince()
	if got := jwksIDs(t, e.jwks()); !slices.Equal(got, []string{first}) {
		t.Fatalf("JWKS at start = %v, want the first key %s", got, first)
	}
	old := ticket()

	// Not due: nothing changes.
	e.srv.maintain(ctxT(t))
	if id, _ := e.srv.keys.activeSince(); id != first {
		t.Fatalf("key rotated before it was due: %s", id)
	}

	// Due: the scheduled rotation keeps the old key published.
	e.srv.cfg.KeyRotation = time.Nanosecond
	e.srv.maintain(ctxT(t))
	e.srv.cfg.KeyRotation = DefaultKeyRotation
	second, _ := e.srv.keys.activeSince()
	if second == first {
		t.Fatal("maintain did not rotate a key past its rotation period")
	}
	if got := jwksIDs(t, e.jwks()); !slices.Equal(got, sorted(first, second)) {
		t.Errorf("JWKS during the overlap = %v, want %s and %s", got, first, second)
	}
	if kid, _, _ := ticketClaims(t, e.jwks(), ticket()); kid != second {
		t.Errorf("new ticket signed by %s, want %s", kid, second)
	}
	if _, err := e.verifier(a).Verify(ctxT(t), old, "web-1"); err != nil {
		t.Errorf("a ticket of the retired key is refused during the overlap: %v", err)
	}
	keys, err := e.st.ListTicketKeys(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if k.ID == first {
			if k.Status != store.TicketKeyRetired || k.PublishUntil.Sub(k.RetiredAt) != KeyOverlap {
				t.Errorf("retired key %+v, want published %s past its retirement", k, KeyOverlap)
			}
		}
	}
	if got := counter(e.srv.metrics.rotations); got != 1 {
		t.Errorf("rotations metric = %v, want 1", got)
	}

	// A rotation by another process (muster discovery rotate-key) is
	// picked up within seconds.
	r, err := RotateKey(ctxT(t), e.dir, e.st, false)
	if err != nil {
		t.Fatal(err)
	}
	if r.From != second || r.To == second || r.PublishUntil.IsZero() {
		t.Fatalf("RotateKey = %+v, want from %s", r, second)
	}
	deadline := time.Now().Add(3 * keyReload)
	for {
		tk := ticket()
		kid, _, _ := ticketClaims(t, e.jwks(), tk)
		if kid == r.To {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tickets still signed by %s %s after the rotation to %s", kid, 3*keyReload, r.To)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got := jwksIDs(t, e.jwks()); !slices.Equal(got, sorted(first, second, r.To)) {
		t.Errorf("JWKS = %v, want all three keys while they overlap", got)
	}

	// Once its publication ends, a retired key leaves the JWKS and the
	// store.
	sealer, _ := e.srv.id.StorageKey.Sealer(seal.InfoDiscoveryKey)
	last, err := rotate(ctxT(t), e.st, sealer, r.To, 0)
	if err != nil {
		t.Fatal(err)
	}
	e.srv.maintain(ctxT(t))
	keys, err = e.st.ListTicketKeys(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if k.ID == r.To {
			t.Errorf("key %s, published until its retirement, was not deleted", r.To)
		}
	}
	if got := jwksIDs(t, e.jwks()); !slices.Equal(got, sorted(first, second, last.To)) {
		t.Errorf("JWKS = %v, want %s gone", got, r.To)
	}
}

func TestNewKeySignsOnceEveryReplicaPublishesIt(t *testing.T) {
	e := start(t, generous)
	a := newAuthority(t, "prod")
	e.register(a, 1, openPolicy())
	first, _ := e.srv.keys.activeSince()
	r, err := RotateKey(ctxT(t), e.dir, e.st, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.srv.keys.reload(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if id, _ := e.srv.keys.activeSince(); id != r.To {
		t.Fatalf("active key %s, want %s", id, r.To)
	}
	resp, err := e.client.RequestReferralTicket(ctxT(t), &musterv1.RequestReferralTicketRequest{AuthorityId: a.id, NodeId: "web-1"})
	if err != nil {
		t.Fatal(err)
	}
	jwks := e.jwks()
	if got := jwksIDs(t, jwks); !slices.Equal(got, sorted(first, r.To)) {
		t.Errorf("JWKS = %v, want the new key published at once beside %s", got, first)
	}
	if kid, _, _ := ticketClaims(t, jwks, resp.GetTicket()); kid != first {
		t.Errorf("ticket signed by %s within %s of the rotation, want the previous key %s", kid, e.srv.keys.signDelay, first)
	}
	// Past the delay the new key signs.
	e.srv.keys.signDelay = 0
	if err := e.srv.keys.reload(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	resp, err = e.client.RequestReferralTicket(ctxT(t), &musterv1.RequestReferralTicketRequest{AuthorityId: a.id, NodeId: "web-1"})
	if err != nil {
		t.Fatal(err)
	}
	if kid, _, _ := ticketClaims(t, e.jwks(), resp.GetTicket()); kid != r.To {
		t.Errorf("ticket signed by %s, want the new key %s", kid, r.To)
	}
}

// shiftedClock is a store whose clock reads later by `by`: the keyring
// as it reloads that long after a rotation.
type shiftedClock struct {
	keyStore
	by time.Duration
}

func (s shiftedClock) Now(ctx context.Context) (time.Time, error) {
	now, err := s.keyStore.Now(ctx)
	return now.Add(s.by), err
}

// TestNewKeySignsOnceAStaleFetchMayBeRepeated: a replica serves a JWKS
// without the new key for up to keyReload after a rotation; an authority
// that fetched it then fetches again on the new key ID only
// referral.RefetchAfter later, and refuses the key's tickets meanwhile
// (PERMISSION_DENIED, which stops an agent). So no replica may sign with
// the new key before both have passed. (It once signed after 10 s, while
// such an authority could not fetch it before 15 s.)
func TestNewKeySignsOnceAStaleFetchMayBeRepeated(t *testing.T) {
	e := start(t, generous)
	first, _ := e.srv.keys.activeSince()
	r, err := RotateKey(ctxT(t), e.dir, e.st, false)
	if err != nil {
		t.Fatal(err)
	}
	refetch := keyReload + referral.RefetchAfter
	for _, tc := range []struct {
		after time.Duration
		want  string
	}{
		{0, first},
		{keyReload, first},
		{refetch - time.Second, first},
		{refetch, r.To},
	} {
		k := newKeyring(shiftedClock{e.st, tc.after}, e.srv.sealer, e.srv.log)
		if err := k.reload(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		if k.signer.id != tc.want {
			t.Errorf("%s after the rotation a replica signs with %s, want %s (new key %s; an authority that fetched the JWKS "+
				"without it up to %s after the rotation fetches it only %s later)", tc.after, k.signer.id, tc.want, r.To, keyReload, referral.RefetchAfter)
		}
	}
}

// TestRevokedKeyLeavesASlowReplicasJWKS: a key revoked by rotate-key
// --revoke-previous is published until the store clock's now; a replica
// whose own clock is behind the store's by some seconds must not keep
// publishing it until its clock catches up (it judged the key's times by
// its own clock).
func TestRevokedKeyLeavesASlowReplicasJWKS(t *testing.T) {
	e := start(t, generous)
	first, _ := e.srv.keys.activeSince()
	r, err := RotateKey(ctxT(t), e.dir, e.st, true)
	if err != nil {
		t.Fatal(err)
	}
	k := newKeyring(e.st, e.srv.sealer, e.srv.log)
	k.now = func() time.Time { return time.Now().Add(-30 * time.Second) }
	if err := k.reload(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if got := jwksIDs(t, k.jwks); !slices.Equal(got, []string{r.To}) {
		t.Errorf("a replica 30s behind the store publishes %v after %s was revoked, want only %s", got, first, r.To)
	}
	if k.signer.id != r.To {
		t.Errorf("it signs with %s, want %s", k.signer.id, r.To)
	}
}

func TestRotateConflicts(t *testing.T) {
	e := start(t)
	sealer, _ := e.srv.id.StorageKey.Sealer(seal.InfoDiscoveryKey)
	cur, _ := e.srv.keys.activeSince()
	if _, err := rotate(ctxT(t), e.st, sealer, "", 0); !errors.Is(err, ErrRotated) {
		t.Errorf("installing a first key over an active one: %v, want ErrRotated", err)
	}
	if _, err := rotate(ctxT(t), e.st, sealer, cur, KeyOverlap); err != nil {
		t.Fatal(err)
	}
	if _, err := rotate(ctxT(t), e.st, sealer, cur, KeyOverlap); !errors.Is(err, ErrRotated) {
		t.Errorf("a second rotation from the same key: %v, want ErrRotated", err)
	}
}

func TestTicketKeySealing(t *testing.T) {
	e := start(t)
	keys, err := e.st.ListTicketKeys(ctxT(t))
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys %v, %v", keys, err)
	}
	k := keys[0]
	if k.ID != KeyID(k.PublicKey) {
		t.Errorf("key ID %s, want %s", k.ID, KeyID(k.PublicKey))
	}
	sealer, _ := e.srv.id.StorageKey.Sealer(seal.InfoDiscoveryKey)
	if _, err := openTicketKey(sealer, k); err != nil {
		t.Fatal(err)
	}
	moved := k
	moved.ID = "0000000000000000"
	if _, err := openTicketKey(sealer, moved); err == nil {
		t.Error("a ciphertext moved to another key ID opens")
	}
	var other seal.StorageKey
	other[0] = 1
	wrong, _ := other.Sealer(seal.InfoDiscoveryKey)
	if _, err := openTicketKey(wrong, k); err == nil {
		t.Error("a ticket key opens under another storage key")
	}
	psk, _ := e.srv.id.StorageKey.Sealer(seal.InfoPSK)
	if _, err := openTicketKey(psk, k); err == nil {
		t.Error("a ticket key opens under another purpose")
	}
}

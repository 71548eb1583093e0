package enroll

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/referral"
)

const testIssuer = "https://discovery.test:7450"

// keySource is a fixed set of ticket keys, or an error.
type keySource struct {
	keys map[string]ed25519.PublicKey
	err  error
}

func (k keySource) TicketKey(_ context.Context, kid string) (ed25519.PublicKey, error) {
	if k.err != nil {
		return nil, k.err
	}
	if pub, ok := k.keys[kid]; ok {
		return pub, nil
	}
	return nil, referral.ErrUnknownKey
}

// ticketEnv is a PSK env whose service enforces referral tickets.
type ticketEnv struct {
	*pskEnv
	key     ed25519.PrivateKey
	src     *keySource
	mu      sync.Mutex
	tickets []string
}

func newTicketEnv(t testing.TB) *ticketEnv {
	t.Helper()
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	e := &ticketEnv{pskEnv: newPSKEnv(t), key: priv, src: &keySource{keys: map[string]ed25519.PublicKey{"k1": pub}}}
	e.svc.cfg.Tickets = &referral.Verifier{Keys: e.src, Issuer: testIssuer, AuthorityID: e.svc.cfg.AuthorityID, Now: time.Now}
	e.svc.cfg.TicketObserver = func(r string) { e.mu.Lock(); e.tickets = append(e.tickets, r); e.mu.Unlock() }
	return e
}

// ticket issues a ticket for node, issued at iat.
func (e *ticketEnv) ticket(t testing.TB, node string, iat time.Time) (string, string) {
	t.Helper()
	jti := referral.NewID()
	tok, err := referral.Issue(e.key, "k1", referral.Claims{Issuer: testIssuer, AuthorityID: e.svc.cfg.AuthorityID, NodeID: node,
		ID: jti, IssuedAt: iat, Expiry: iat.Add(referral.TTL)})
	if err != nil {
		t.Fatal(err)
	}
	return tok, jti
}

func (e *ticketEnv) lastTicketResult() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.tickets) == 0 {
		return ""
	}
	return e.tickets[len(e.tickets)-1]
}

// TestTicketChecks: with a discovery configured, each case fails at the
// check it names, in DESIGN.md's order, and the observer hears the result.
func TestTicketChecks(t *testing.T) {
	e := newTicketEnv(t)
	key, _ := e.active(t)
	good := key.Reveal()
	now := time.Now()
	other, _ := e.ticket(t, "someone-else", now)
	expired, _ := e.ticket(t, "n1", now.Add(-10*time.Minute))
	valid, validJTI := e.ticket(t, "n1", now)

	tests := []struct {
		name, psk, ticket string
		kind              Kind
		reason            string
		result            string
	}{
		{"missing ticket, checked before the PSK", "", "", KindPermissionDenied, ReasonTicketMissing, TicketResultMissing},
		{"garbage", good, "not.a.ticket", KindPermissionDenied, "referral ticket is malformed", TicketResultInvalid},
		{"for another node", good, other, KindPermissionDenied, "referral ticket names another node", TicketResultInvalid},
		{"expired", good, expired, KindPermissionDenied, "referral ticket has expired: ask the discovery service for a new one; " +
			"if it was new, discovery's clock is more than 2m0s behind this authority's: set both right (NTP)", TicketResultExpired},
		{"valid ticket, missing PSK", "", valid, KindPermissionDenied, ReasonPSKMissing, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.svc.BootstrapWithPSK(t.Context(), Request{}, tt.psk, tt.ticket, nodeCSR(t, "n1"))
			wantRefusal(t, err, tt.kind, tt.reason)
			if tt.result != "" && e.lastTicketResult() != tt.result {
				t.Errorf("ticket result %q, want %q", e.lastTicketResult(), tt.result)
			}
			if used, _ := e.st.TicketUsed(t.Context(), validJTI); used {
				t.Fatal("a refusal recorded the ticket's use")
			}
		})
	}
	// Refusals consumed nothing: the valid ticket still admits n1.
	iss, err := e.svc.BootstrapWithPSK(t.Context(), Request{}, good, valid, nodeCSR(t, "n1"))
	if err != nil || iss.TicketID == "" {
		t.Fatalf("join with a valid ticket: %v", err)
	}
	if e.lastTicketResult() != TicketResultOK {
		t.Errorf("ticket result %q, want ok", e.lastTicketResult())
	}
	if used, err := e.st.TicketUsed(t.Context(), iss.TicketID); err != nil || !used {
		t.Fatalf("the ticket's use was not recorded: %v %v", used, err)
	}
}

// TestTicketSingleUse: a ticket admits one join; the same ticket for a
// retry of that join gets the same certificate, for any other join it is
// refused as used.
func TestTicketSingleUse(t *testing.T) {
	e := newTicketEnv(t)
	key, _ := e.active(t)
	tok, _ := e.ticket(t, "n1", time.Now())
	csr := nodeCSR(t, "n1")
	first, err := e.svc.BootstrapWithPSK(t.Context(), Request{}, key.Reveal(), tok, csr)
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.svc.BootstrapWithPSK(t.Context(), Request{}, key.Reveal(), tok, csr)
	if err != nil || !again.Retry || again.InstanceID != first.InstanceID || again.TicketID != "" {
		t.Fatalf("retry with the same ticket: %v, %+v", err, again)
	}
	// After the node is deleted, the ticket cannot admit it again.
	if err := e.st.DeleteNode(t.Context(), "n1", setupLink); err != nil {
		t.Fatal(err)
	}
	_, err = e.svc.BootstrapWithPSK(t.Context(), Request{}, key.Reveal(), tok, nodeCSR(t, "n1"))
	wantRefusal(t, err, KindPermissionDenied, ReasonTicketUsed)
	if e.lastTicketResult() != TicketResultReplayed {
		t.Errorf("ticket result %q, want replayed", e.lastTicketResult())
	}
}

// TestTicketReplayRace: the store decides single use; of concurrent joins
// with one ticket (after the node is freed each time) exactly one wins.
func TestTicketReplayRace(t *testing.T) {
	e := newTicketEnv(t)
	key, _ := e.active(t)
	tok, _ := e.ticket(t, "n1", time.Now())
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			_, errs[i] = e.svc.BootstrapWithPSK(context.Background(), Request{}, key.Reveal(), tok, nodeCSR(t, "n1"))
		})
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		var ref *Refusal
		switch {
		case err == nil:
			ok++
		case errors.As(err, &ref) && (ref.Kind == KindAlreadyExists || ref.Reason == ReasonTicketUsed):
		default:
			t.Errorf("unexpected: %v", err)
		}
	}
	if ok != 1 {
		t.Fatalf("%d joins succeeded with one ticket, want 1", ok)
	}
}

// TestPSKOptionalWindow: during the migration window a valid ticket alone
// admits, recorded as such; after it the PSK is required again.
func TestPSKOptionalWindow(t *testing.T) {
	e := newTicketEnv(t)
	e.active(t)
	e.svc.cfg.PSKOptionalUntil = time.Now().Add(time.Hour)
	tok, _ := e.ticket(t, "n1", time.Now())
	iss, err := e.svc.BootstrapWithPSK(t.Context(), Request{}, "", tok, nodeCSR(t, "n1"))
	if err != nil {
		t.Fatal(err)
	}
	inst, err := e.st.GetInstance(t.Context(), iss.InstanceID)
	if err != nil || inst.TokenID != CredentialTicketOnly {
		t.Fatalf("instance credential %q, want %q (%v)", inst.TokenID, CredentialTicketOnly, err)
	}
	e.svc.cfg.PSKOptionalUntil = time.Now().Add(-time.Second)
	tok2, _ := e.ticket(t, "n2", time.Now())
	_, err = e.svc.BootstrapWithPSK(t.Context(), Request{}, "", tok2, nodeCSR(t, "n2"))
	wantRefusal(t, err, KindPermissionDenied, ReasonPSKMissing)
	// A wrong PSK is refused even inside the window.
	e.svc.cfg.PSKOptionalUntil = time.Now().Add(time.Hour)
	wrong := "muster-psk:" + "ab00000000000000000000000000000000000000000000000000000000000000"
	_, err = e.svc.BootstrapWithPSK(t.Context(), Request{}, wrong, tok2, nodeCSR(t, "n2"))
	wantRefusal(t, err, KindPermissionDenied, ReasonPSKMismatch)
}

// TestTicketKeysUnavailable: when discovery's keys cannot be fetched the
// agent is told to retry (UNAVAILABLE), not that its ticket is bad.
func TestTicketKeysUnavailable(t *testing.T) {
	e := newTicketEnv(t)
	key, _ := e.active(t)
	tok, _ := e.ticket(t, "n1", time.Now())
	e.src.err = errors.New("connection refused")
	_, err := e.svc.BootstrapWithPSK(t.Context(), Request{}, key.Reveal(), tok, nodeCSR(t, "n1"))
	wantRefusal(t, err, KindUnavailable, reasonTicketKeys)
}

// TestTicketKeyNotFetchedYet: a ticket signed by a key the authority has
// not fetched, while a fetch is not due (one was made seconds ago, maybe
// from a discovery replica that had not yet published the key), is not
// refused as invalid, which would stop the agent, but UNAVAILABLE: the
// agent retries, and by then the key is fetched.
func TestTicketKeyNotFetchedYet(t *testing.T) {
	e := newTicketEnv(t)
	key, _ := e.active(t)
	tok, _ := e.ticket(t, "n1", time.Now())
	e.src.err = referral.ErrKeyNotFetched
	_, err := e.svc.BootstrapWithPSK(t.Context(), Request{}, key.Reveal(), tok, nodeCSR(t, "n1"))
	wantRefusal(t, err, KindUnavailable, ReasonTicketKeyNotFetched)
}

// TestTicketKeyUnknown: a ticket signed by a key discovery no longer
// publishes (revoked seconds after it signed) is refused with its own
// reason, which tells the agent a fresh ticket may pass, and the audit
// detail names the key; nothing is consumed.
func TestTicketKeyUnknown(t *testing.T) {
	e := newTicketEnv(t)
	key, _ := e.active(t)
	tok, jti := e.ticket(t, "n1", time.Now())
	e.src.err = referral.ErrUnknownKey
	_, err := e.svc.BootstrapWithPSK(t.Context(), Request{}, key.Reveal(), tok, nodeCSR(t, "n1"))
	wantRefusal(t, err, KindPermissionDenied, ReasonTicketKeyUnknown)
	var ref *Refusal
	if !errors.As(err, &ref) || !strings.Contains(ref.Detail, "which the discovery does not publish") {
		t.Errorf("refusal detail %q, want the verifier's reason naming the key", ref.Detail)
	}
	if e.lastTicketResult() != TicketResultInvalid {
		t.Errorf("ticket result %q, want invalid", e.lastTicketResult())
	}
	if used, _ := e.st.TicketUsed(t.Context(), jti); used {
		t.Error("a refusal recorded the ticket's use")
	}
}

package enroll

import (
	"context"
	"crypto"
	"crypto/x509"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/store"
)

// Method is one join method, in the shape of SPIRE's node attestor: it
// verifies the caller's proof, possibly over a challenge exchange, and
// says which node joins and what the join must claim in the store. What
// follows a verified proof (node reservation, instance, certificate,
// issuance record, audit, metrics) is common and never re-implemented by a
// method. P is the method's own request payload; each method carries its
// own configuration.
type Method[P any] interface {
	// Attest verifies payload. It returns a *Refusal for every answer the
	// caller may see, and fills the Admission's Actor and NodeID as far as
	// it got, even with a refusal, so the audit record says who was
	// refused. An Admission with Retry set is a repeat of a join already
	// answered: it is handed back as it is.
	Attest(ctx context.Context, r Request, payload P, challenge Challenge) (Admission, error)
}

// Challenge sends a challenge to the caller and returns its answer, for a
// method that proves possession over an exchange; single-message methods
// are given nil and never call it.
type Challenge func(ctx context.Context, challenge []byte) ([]byte, error)

// Admission is a join whose proof a Method has verified: what every method
// hands to the common tail (admit).
type Admission struct {
	// Actor names the proof's holder in the audit trail ("token:ID",
	// "psk:ID"); "" stays "anonymous".
	Actor  string
	NodeID string
	// TokenID is the token whose use this is; Credential, for a method
	// without a token, the ID of what proved the join (a PSK's). Either is
	// recorded as the instance's TokenID.
	TokenID    string
	Credential string
	// Proof names the proof in the audit record ("token ID", "psk ID
	// (active)"), never a secret.
	Proof        string
	Method       string
	MaySupersede bool
	// ServerAuth, from the token's svid_usage, lets the new instance's
	// certificates serve TLS too; renewals keep what the instance's
	// certificate says, bound-keypair refreshes take the token's usage
	// as it is then (held.serverAuth).
	ServerAuth bool
	// PublicKey is the key to certify; nil asks the authority to mint one.
	PublicKey crypto.PublicKey
	KeyID     []byte
	Now       time.Time
	// Ticket is the referral ticket whose single use the join records.
	Ticket *store.TicketUse
	// Claims are the method's further conditions, won in the join's (or,
	// with Refresh, the renewal's) write.
	Claims []store.Claim
	// LockTargets are the targets whose locks the method checked: a lock
	// created on one since refuses the join in its write
	// (store.Join.LockTargets).
	LockTargets []store.LockTarget
	// Retry, if set, is the answer already issued to this same request.
	Retry *Issued
	// Refresh, if set, is the caller's certificate of the instance it
	// keeps: the tail renews that instance for CSR (generation rule and
	// all) instead of making a new one.
	Refresh *x509.Certificate
	CSR     []byte
	// nodeFree says the method's read found no node with NodeID; the
	// join's write then takes it as free (store.Join.NodeFreeAtRead) and
	// checks it rather than reading the node again.
	nodeFree bool
	// held, with Refresh, is the certificate record and instance the
	// method read, whose locks it checked: the renewal starts from them.
	held *held
	// botAddFlags, for a bound-keypair token, are the muster bot add
	// flags of its settings, for a way out that adds it again.
	botAddFlags string
	// refreshing says the join is a refresh, refused or not: the caller
	// presented a valid certificate (before the store is read), the
	// certificate of its current instance (after), with a join state
	// the recovery rules do not take as a recovery (once judged: a
	// resync is one). Its record is an agent.refresh, as the refresh's
	// own is.
	refreshing bool
}

// actionRefresh is the audit action of a bound-keypair refresh, answered
// or refused; agent.join is every other join's, a recovery's included.
const actionRefresh = "agent.refresh"

// join runs one join through method m and the common tail, and audits the
// outcome.
func join[P any](ctx context.Context, s *Service, m Method[P], r Request, payload P, challenge Challenge) (*Issued, error) {
	a, err := m.Attest(ctx, r, payload, challenge)
	ev := audit.Event{Actor: "anonymous", Action: "agent.join", Target: a.NodeID, Source: r.Source, CorrelationID: r.CorrelationID}
	if a.Actor != "" {
		ev.Actor = a.Actor
	}
	var iss *Issued
	switch {
	case err != nil:
		if a.refreshing {
			ev.Action = actionRefresh
		}
		// A node ID of a join token's exact form, refused, is most likely
		// a token given as the node (--node and --token swapped): its
		// secret stays out of the record.
		if tok, perr := jointoken.Parse(ev.Target); perr == nil {
			ev.Target = tok.ID + ".REDACTED"
		}
	case a.Retry != nil:
		iss = a.Retry
		ev.Reason = retryReason(iss.InstanceID, iss.serial)
	case a.Refresh != nil:
		ev.Action = actionRefresh
		iss, err = s.renew(ctx, a.Refresh, a.CSR, a.Claims, &ev, a.held)
	default:
		iss, err = s.admit(ctx, a, &ev)
		if err == nil && a.Ticket != nil && !iss.Retry {
			s.observeTicket(TicketResultOK)
			iss.TicketID = a.Ticket.ID
		}
	}
	return s.finish(ctx, ev, iss, err)
}

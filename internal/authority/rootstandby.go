package authority

import (
	"context"
	"crypto/x509"
	"fmt"
	"strings"
	"time"

	"github.com/muster-dev/muster/internal/ca"
)

// standbyListedNodes bounds the nodes a refused standby names.
const standbyListedNodes = 5

// connectedLeftBehind refuses standby while an agent connected now holds
// a certificate (its instance's latest, still valid) that keep, the new
// root, did not sign: standby would refuse it its next renewal, and the
// agent would stop for good (a rollback to update_servers trusts it
// again, but only an agent started again by hand renews). A running agent
// renews at half its certificate's life, so with the default 24 h
// certificates an operator who takes update_servers and standby one after
// the other strands the whole connected fleet; node.renew_now moves them
// under the new root at once.
//
// Agents away (seen before, their stream gone or its row stale:
// streamLive) with such a certificate are refused too, unless leaveAway
// (muster ca root next-phase --leave-away): back after standby, each
// would be refused its renewal and stop until joined again by hand, and
// nothing the authority does reaches them before. The refusal names them,
// how to bring them back first, and the override.
//
// Only instances last issued before the newest of keep's agent
// intermediates became active, plus retireMargin (a replica may sign
// with the one before until it reads the change), are read further:
// their chain says which intermediate signed them.
func (s *Server) connectedLeftBehind(ctx context.Context, keep *x509.Certificate, leaveAway bool) (left behindAgents, _ error) {
	if keep == nil {
		return left, nil
	}
	rows, err := s.store.ListCACerts(ctx)
	if err != nil {
		return left, err
	}
	var since time.Time // the latest a certificate under an older agent intermediate may have been issued
	for _, r := range rows {
		if r.Role != string(ca.RoleAgent) || r.ActivatedAt.IsZero() {
			continue
		}
		if c, err := s.caCerts.parse(r.Serial, r.CertDER); err == nil && s.caCerts.signedBy(c, keep) && r.ActivatedAt.After(since) {
			since = r.ActivatedAt
		}
	}
	if since.IsZero() {
		return left, nil // readyToDrop refuses: no agent intermediate under keep is active
	}
	since = since.Add(retireMargin)
	now, err := s.store.Now(ctx)
	if err != nil {
		return left, err
	}
	var connected, away behindAgents
	after := ""
	for {
		page, err := s.store.ListAgentsPage(ctx, after, caStatusPage)
		if err != nil {
			return left, err
		}
		for _, r := range page {
			// An agent never seen on a stream is not one this check can
			// say anything about (a join whose agent never ran).
			if r.Stream == nil || r.Instance.ID == "" || !r.NotAfter.After(now) || !r.Instance.LastIssuedAt.Before(since) {
				continue
			}
			live := streamLive(r.Stream, now)
			under, err := s.instanceUnder(ctx, r.Instance.ID, keep)
			if err != nil {
				return left, err
			}
			if under {
				continue
			}
			if live {
				connected.add(r.Node.ID, r.NotAfter)
			} else {
				away.add(r.Node.ID, r.NotAfter)
			}
		}
		if len(page) < caStatusPage {
			break
		}
		after = page[len(page)-1].Node.ID
	}
	switch {
	case connected.n > 0:
		also := ""
		if away.n > 0 {
			also = fmt.Sprintf(" (%d more %s away: %s; see below once these have renewed)", away.n, plural(away.n, "agent is", "agents are"), away.names())
		}
		return left, rootRule(fmt.Sprintf("standby stops trusting the old root, and %d connected %s (%s) still %s a certificate under it%s: each would be refused its next renewal and stop, and only a restart by hand brings it back, even after a rollback; "+
			"have them renew under the new root now: muster task send --type node.renew_now --all, then run muster ca root next-phase again (or run it again after %s, when those certificates have ended, every running agent having renewed by then)",
			connected.n, plural(connected.n, "agent", "agents"), connected.names(), plural(connected.n, "holds", "hold"), also, connected.until.UTC().Format(time.RFC3339)))
	case away.n > 0 && !leaveAway:
		return left, rootRule(fmt.Sprintf("standby stops trusting the old root, and %d %s seen before but away now (%s) still %s a valid certificate under it: back after standby, each would be refused its renewal and stop until joined again by hand (muster agent join --force on its machine); "+
			"start them so that they renew under the new root (muster agents show NODE shows their latest certificate), then run muster ca root next-phase again; or run it again after %s, when those certificates have ended; "+
			"for a machine gone for good, delete its node: muster agents delete NODE; "+
			"or go on without them: muster ca root next-phase --leave-away",
			away.n, plural(away.n, "agent", "agents"), away.names(), plural(away.n, "holds", "hold"), away.until.UTC().Format(time.RFC3339)))
	}
	// With --leave-away, the agents away are left behind: the caller
	// records them, since nothing else will say why they are refused
	// their renewal when back.
	return away, nil
}

// leftAwayReason is the audit reason of a standby step taken with
// --leave-away: how many agents away it left behind, and the first.
func leftAwayReason(left behindAgents) string {
	if left.n == 0 {
		return "--leave-away: no agent away under the old root was left behind"
	}
	return fmt.Sprintf("--leave-away: %d %s away under the old root left behind (%s), each refused its renewal when back until joined again by hand",
		left.n, plural(left.n, "agent", "agents"), left.names())
}

// behindAgents counts the agents standby would leave behind, naming the
// first standbyListedNodes, and the latest their certificates end.
type behindAgents struct {
	n     int
	first []string
	until time.Time
}

func (b *behindAgents) add(node string, notAfter time.Time) {
	if b.n++; len(b.first) < standbyListedNodes {
		b.first = append(b.first, node)
	}
	if notAfter.After(b.until) {
		b.until = notAfter
	}
}

func (b *behindAgents) names() string {
	names := strings.Join(b.first, ", ")
	if b.n > len(b.first) {
		names += fmt.Sprintf(" and %d more", b.n-len(b.first))
	}
	return names
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// instanceUnder reports whether the latest certificate of instance id
// chains to root: the agent intermediate that signed it is signed by
// root. A chain that does not parse counts as not under it. The
// signatures are checked without the cache: these certificates are
// parsed afresh for this one question.
func (s *Server) instanceUnder(ctx context.Context, id string, root *x509.Certificate) (bool, error) {
	in, err := s.store.GetInstance(ctx, id)
	if err != nil {
		return false, err
	}
	certs, err := ca.ParseCertsPEM(in.LastChainPEM)
	if err != nil || len(certs) == 0 {
		return false, nil
	}
	leaf := certs[0]
	for _, c := range append(certs[1:], s.ca.Accepted(ca.RoleAgent)...) {
		if leaf.CheckSignatureFrom(c) == nil {
			return c.CheckSignatureFrom(root) == nil, nil
		}
	}
	return false, nil
}

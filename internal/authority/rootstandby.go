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
// under the new root at once. Agents away (not connected, or their
// stream's row stale: streamLive) are not waited for: the docs name
// their way back.
//
// Only instances last issued before the newest of keep's agent
// intermediates became active, plus retireMargin (a replica may sign
// with the one before until it reads the change), are read further:
// their chain says which intermediate signed them.
func (s *Server) connectedLeftBehind(ctx context.Context, keep *x509.Certificate) error {
	if keep == nil {
		return nil
	}
	rows, err := s.store.ListCACerts(ctx)
	if err != nil {
		return err
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
		return nil // readyToDrop refuses: no agent intermediate under keep is active
	}
	since = since.Add(retireMargin)
	now, err := s.store.Now(ctx)
	if err != nil {
		return err
	}
	var (
		behind []string
		n      int
		until  time.Time
	)
	after := ""
	for {
		page, err := s.store.ListAgentsPage(ctx, after, caStatusPage)
		if err != nil {
			return err
		}
		for _, r := range page {
			if !streamLive(r.Stream, now) || r.Instance.ID == "" || !r.NotAfter.After(now) || !r.Instance.LastIssuedAt.Before(since) {
				continue
			}
			under, err := s.instanceUnder(ctx, r.Instance.ID, keep)
			if err != nil {
				return err
			}
			if under {
				continue
			}
			if n++; len(behind) < standbyListedNodes {
				behind = append(behind, r.Node.ID)
			}
			if r.NotAfter.After(until) {
				until = r.NotAfter
			}
		}
		if len(page) < caStatusPage {
			break
		}
		after = page[len(page)-1].Node.ID
	}
	if n == 0 {
		return nil
	}
	names := strings.Join(behind, ", ")
	if n > len(behind) {
		names += fmt.Sprintf(" and %d more", n-len(behind))
	}
	agents, hold := "agents", "hold"
	if n == 1 {
		agents, hold = "agent", "holds"
	}
	return rootRule(fmt.Sprintf("standby stops trusting the old root, and %d connected %s (%s) still %s a certificate under it: each would be refused its next renewal and stop, and only a restart by hand brings it back, even after a rollback; "+
		"have them renew under the new root now: muster task send --type node.renew_now --all, then run muster ca root next-phase again (or run it again after %s, when those certificates have ended, every running agent having renewed by then)",
		n, agents, names, hold, until.UTC().Format(time.RFC3339)))
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

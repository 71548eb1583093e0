package agent

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/errinfo"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/spiffeid"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// Renew asks the authority, over mTLS with the current certificate, to
// certify a new key as the next generation of this instance. The new key
// is the pending key of an earlier attempt if there is one (its reply may
// have been lost, and the authority answers the same key with the
// certificate it already issued), else a new one, persisted before the
// request. An expired certificate is refused without asking
// (*ExpiredError). A bound-keypair agent renews as agent run does, by
// repeating the challenge (Rebind): the authority refuses it a plain
// renewal. Errors are *OpError.
func (a *Agent) Renew(ctx context.Context) (*State, error) {
	if st, err := a.dir.ReadState(); err == nil && st.JoinMethod == JoinMethodBoundKeypair {
		return a.Rebind(ctx)
	}
	st, err := a.renew(ctx)
	a.identityWritten()
	a.metrics.renewal(err)
	if err != nil {
		return nil, &OpError{Op: "renewal", Err: err}
	}
	a.authorityAnswered()
	a.log.Info("renewed", "node", st.NodeID, "instance", st.InstanceID, "generation", st.Generation,
		"serial", st.Serial, "not_after", st.NotAfter)
	a.metrics.observe(st)
	return st, nil
}

// renew holds the data directory's lock only while it reads and writes
// files, not across the request: a slow or unreachable authority does not
// hold up `muster agent trust refresh`, a task's record or another
// command. The write is conditional on what was read: the identity's
// serial, generation and instance unchanged. A renewal or join that wrote
// in between wins and this one keeps nothing of its answer (it returns the
// identity on disk); two renewals never interleave their writes.
func (a *Agent) renew(ctx context.Context) (*State, error) {
	// Taking the lock creates the directory; a renewal of a directory
	// that holds no identity (a mistyped --data) must fail leaving none.
	if !a.dir.HasIdentity() {
		return nil, fmt.Errorf("%w: %s", ErrNoIdentity, a.dir)
	}
	st, id, key, err := a.renewStart(ctx)
	if err != nil {
		return nil, err
	}
	authorityID, err := spiffeid.New(st.TrustDomain, spiffeid.RoleAuthority, st.AuthorityID)
	if err != nil {
		return nil, fmt.Errorf("state.json: %w", err)
	}
	agentID, err := spiffeid.New(st.TrustDomain, spiffeid.RoleAgent, st.NodeID)
	if err != nil {
		return nil, fmt.Errorf("state.json: %w", err)
	}
	csr, err := csrFor(key)
	if err != nil {
		return nil, err
	}
	conn, err := dial(a.address(st), identity.ClientTLS(id, id.RootPool(), identity.MatchID(authorityID)))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	resp, err := musterv1.NewCertificateServiceClient(conn).RequestCertificate(cctx, &musterv1.RequestCertificateRequest{Csr: csr})
	if err != nil {
		return nil, standingHint(untrustedAuthorityHint(err, st, a.dir), st, a.dir)
	}
	unlock, err := a.dir.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	// Read again: the stream and tasks write state.json (the verifier
	// set, the replay window, a trust bundle and its roots) while the
	// request is out, and another renewal may have written a new identity.
	// With fix: a forced join (another process) that stopped after its
	// certificate meanwhile is finished here as at a start (agent.yaml,
	// the trust bundle, state.json); read without it, its state was
	// written alone below, and the next start, finding state.json and
	// the certificate agreeing, dropped state.next.json and with it the
	// join's authority and pins.
	cur, curID, err := a.load(true)
	if err != nil {
		return nil, err
	}
	// A reply's ca_certificate_pem is never a reason to trust another
	// root; its trust bundle is taken by trustbundle.Take's rule (a new
	// root only through a cross-certificate from a root trusted now), and
	// the new certificate must chain to the roots trusted after it.
	// The bundle is written only once the certificate verified.
	plan := a.planBundle(cur, curID, resp.GetTrustBundle())
	roots := plan.roots
	chain, err := verifyIssued(resp.GetCertificateChainPem(), key, roots, agentID, a.now())
	if err != nil {
		return nil, err
	}
	if issued := serialOf(chain[0]); cur.Serial == issued {
		// A renewal with the same pending key wrote this answer first.
		if err := a.writeBundle(cur, curID, plan); err != nil {
			return nil, err
		}
		return cur, a.dir.writeState(cur)
	}
	if cur.Serial != st.Serial || cur.Generation != st.Generation || cur.InstanceID != st.InstanceID {
		// Written in between: what is on disk is newer than what this
		// renewal started from, and its answer must not go over it. Its
		// key, if still pending, is dropped, or the next renewal would
		// send it again and be answered this same certificate.
		if p, err := a.dir.pendingKey(false); err == nil && p != nil && identity.SamePublicKey(p.Public(), key.Public()) {
			if err := a.dir.removePendingKey(); err != nil {
				return nil, err
			}
		}
		a.log.Info("renewal answer not kept: the identity was written by another renewal or join while it was in flight",
			"started_from_generation", st.Generation, "on_disk_generation", cur.Generation, "answered_generation", resp.GetGeneration())
		if err := a.writeBundle(cur, curID, plan); err != nil {
			return nil, err
		}
		return cur, a.dir.writeState(cur)
	}
	// The bundle first, as a bound refresh writes it (rebind): a crash
	// between leaves the current identity beside roots that verify it.
	renewedID := &identity.Identity{Chain: chain, Key: key, Roots: roots}
	if err := a.writeBundle(cur, curID, plan); err != nil {
		return nil, err
	}
	renewStep("bundle")
	if err := a.dir.writeIdentity(renewedID, false); err != nil {
		return nil, err
	}
	renewed := a.now().UTC()
	cur.Generation = resp.GetGeneration()
	cur.LastRenewal = &renewed
	cur.NotAfter = chain[0].NotAfter.UTC()
	cur.Serial = serialOf(chain[0])
	if iid := resp.GetInstanceId(); iid != "" {
		cur.InstanceID = iid
	}
	a.takeVerifierSet(ctx, cur, resp.GetVerifierSet(), false, conn)
	if err := a.dir.writeState(cur); err != nil {
		return nil, err
	}
	if err := a.dir.removePendingKey(); err != nil {
		return nil, err
	}
	return cur, nil
}

// renewStart reads, under the data directory's lock, what a renewal
// needs: the state, the identity (unexpired) and the key to certify (the
// pending key of an earlier attempt, else a new one, persisted).
func (a *Agent) renewStart(ctx context.Context) (*State, *identity.Identity, crypto.Signer, error) {
	unlock, err := a.dir.lock(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	defer unlock()
	st, id, err := a.load(true)
	if err != nil {
		return nil, nil, nil, err
	}
	if now := a.now(); !now.Before(id.Leaf().NotAfter) {
		return nil, nil, nil, &ExpiredError{NotAfter: id.Leaf().NotAfter, Dir: a.dir, Node: st.NodeID}
	}
	key, err := a.dir.pendingKey(true)
	if err != nil {
		return nil, nil, nil, err
	}
	return st, id, key, nil
}

// address is where renewals go: the API address recorded at the join (the
// one the authority advertised, authenticated by the join's answer), else
// MUSTER_AUTHORITY, else agent.yaml's. The latter two name where to join,
// which may be the bootstrap-only listener that serves no renewals, so
// they only stand in for an agent that recorded no address.
func (a *Agent) address(st *State) string {
	if st.Authority != "" {
		return st.Authority
	}
	if a.authority != "" {
		return a.authority
	}
	if cfg, err := a.dir.ReadConfig(); err == nil && cfg.Authority != "" {
		return cfg.Authority
	}
	return ""
}

// load reads the state and identity and checks they describe the same
// node. With fix (the directory locked) it also finishes what a crash left
// half done and drops a token left in agent.yaml after a join.
func (a *Agent) load(fix bool) (*State, *identity.Identity, error) {
	st, err := a.dir.ReadState()
	if err != nil {
		return nil, nil, err
	}
	id, err := a.dir.LoadIdentity()
	if err != nil {
		return nil, nil, err
	}
	got, err := spiffeid.FromCertificate(id.Leaf())
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", a.dir.CertFile(), err)
	}
	serial := serialOf(id.Leaf())
	// A join (with --force over an identity) that crashed between its
	// certificate and state.json left the state it was to write in
	// state.next.json: that, not the old instance's, describes the
	// certificate; and what agent.yaml was to say, which may not be
	// written yet either (the authority's address and pins).
	next, nerr := a.dir.readNextState()
	if nerr != nil && !errors.Is(nerr, ErrNoIdentity) && st.Serial != serial {
		// A certificate state.json does not record is a renewal's or the
		// join's whose state this file held: which, and so which
		// instance, generation and authority it is, cannot be told.
		// Taken as a renewal's, the old instance's state would stand
		// beside the join's certificate; the file is kept, and a join
		// again writes it anew.
		return nil, nil, fmt.Errorf("%w: %s is not the certificate state.json records, and a join may have left its state in that file, which cannot be read: join again over this identity: %s",
			nerr, a.dir.CertFile(), RejoinCommand(a.dir, st.NodeID))
	}
	joined := st.Serial != serial && nerr == nil && next.Serial == serial
	if joined {
		st = next.State
	}
	if got.Role != spiffeid.RoleAgent || got.Name != st.NodeID || got.TrustDomain != st.TrustDomain {
		return nil, nil, fmt.Errorf("%s is %s, but state.json records node %s of trust domain %s: join again with --force",
			a.dir.CertFile(), got, st.NodeID, st.TrustDomain)
	}
	if !fix {
		return st, id, nil
	}
	if err := a.dir.repair(id); err != nil {
		return nil, nil, err
	}
	switch {
	case joined:
		// agent.yaml first, as the join writes it: a crash here again
		// leaves state.next.json to finish from.
		cfg, err := a.dir.ReadConfig()
		if err != nil {
			return nil, nil, fmt.Errorf("finishing a join interrupted before agent.yaml was written: %w", err)
		}
		joinCfg := next.Config
		if joinCfg == nil {
			// Written by an agent before state.next.json carried what
			// agent.yaml was to say: the state says most of it, and the
			// roots written with the certificate the pin. Keeping the old
			// agent.yaml would leave the old authority's address and pin
			// beside the new certificate for good.
			joinCfg = joinConfigOf(st, id.Roots, cfg.CAFingerprint)
		}
		joinCfg.apply(&cfg)
		if err := a.dir.WriteConfig(cfg); err != nil {
			return nil, nil, err
		}
		// The join's trust bundle, which it may not have written (or
		// written without state.json recording it): taken as the join
		// takes it, over the roots written with the certificate.
		roots, err := a.takeBundle(st, id, next.Bundle.proto())
		if err != nil {
			return nil, nil, fmt.Errorf("finishing a join interrupted before its trust bundle was written: %w", err)
		}
		id.Roots = roots
		if err := a.dir.writeState(st); err != nil {
			return nil, nil, err
		}
		a.log.Info("finished a join interrupted before state.json was written", "instance", st.InstanceID)
	case st.Serial != serial:
		// A renewal wrote the certificate but not the state: the
		// certificate is the truth (the generation catches up with the
		// next renewal's answer).
		st.Serial, st.NotAfter = serial, id.Leaf().NotAfter.UTC()
		if err := a.dir.writeState(st); err != nil {
			return nil, nil, err
		}
	}
	if nerr == nil {
		if err := a.dir.removeNextState(); err != nil {
			return nil, nil, err
		}
	}
	if cfg, err := a.dir.ReadConfig(); err == nil && (cfg.Token != "" || cfg.PSK != "" || cfg.RegistrationSecret != "") {
		cfg.Token, cfg.PSK, cfg.RegistrationSecret = "", "", ""
		if err := a.dir.WriteConfig(cfg); err != nil {
			return nil, nil, err
		}
		a.log.Info("removed the join secret from agent.yaml: the agent has joined")
	}
	return st, id, nil
}

// renewStep marks where a renewal or a bound refresh stands between its
// writes; tests set it to stop there, as a crash would.
var renewStep = func(string) {}

// standingHint adds to a renewal refused for the node's standing (locked,
// copy_detected, deleted, superseded, or certificate_unknown: a store
// restored from a backup older than this agent's last renewal) the way out: what the operator runs
// on the authority, or the join that makes this machine the node again.
// The refusal itself says only the reason word: the lock's ID and why are
// in the authority's audit record of the renewal.
func standingHint(err error, st *State, dir Dir) error {
	if st.JoinMethod == JoinMethodBoundKeypair {
		return boundStandingHint(err, st, dir)
	}
	rejoin := RejoinCommand(dir, st.NodeID)
	var hint string
	switch errinfo.Reason(err) {
	case "locked":
		hint = fmt.Sprintf("on the authority, muster lock list names the lock and why (muster audit list --action agent.renew): muster lock delete ID lifts it, and agent run asks again by itself when the lock ends (its TTL) and %s for one without a TTL, with no restart; a copy_detected lock (a copy of this identity, or this directory restored from an older backup) stays, and this machine joins again: %s", every(lockedRecheck), rejoin)
	case "copy_detected":
		hint = fmt.Sprintf("this identity was presented after a newer one was issued (a copy of it, or this directory restored from an older backup): the instance is locked; if this machine is the node, join again: %s", rejoin)
	case "deleted":
		hint = fmt.Sprintf("the node was deleted on the authority; to enroll this machine again: %s", rejoin)
	case "certificate_unknown":
		hint = fmt.Sprintf("the authority has no record of this certificate (its store was restored from a backup taken before this agent's last renewal, or it is another authority): join again over this identity: %s (docs/high-availability.md, \"Backup and restore\")", rejoin)
	case "superseded":
		hint = fmt.Sprintf("a newer join replaced this instance (muster agents show %s names it); if this machine should be the node, join again: %s", st.NodeID, rejoin)
	default:
		return ownDir(err, dir)
	}
	return withHint(err, hint)
}

// boundStandingHint is standingHint for a bound-keypair agent, whose
// stream alone meets these refusals: its refresh repeats the challenge
// with the bound key (a recovery where the authority no longer knows its
// instance or certificate), and that answer, not a join with a join token
// (which would make the node a token node beside its bound-keypair token),
// is what brings it back or names the way out.
func boundStandingHint(err error, st *State, dir Dir) error {
	switch errinfo.Reason(err) {
	case "locked", "copy_detected":
		return boundRefusalHint(err, st, dir)
	case "deleted", "certificate_unknown", "superseded":
		return withHint(err, fmt.Sprintf("a bound-keypair agent comes back by its refresh, which repeats the challenge with its bound key (a recovery if the authority no longer knows this instance or certificate) and names the way out if refused: agent run refreshes at the next renewal time; muster agent renew --data %s refreshes now",
			shellword.Quote(string(dir))))
	}
	return ownDir(err, dir)
}

// ownDir puts this agent's data directory into the join command a refusal
// names for an agent whose directory the authority cannot know (--data
// ADIR: a certificate under a root it no longer trusts), so the command
// printed can be pasted as it is.
func ownDir(err error, dir Dir) error {
	const placeholder = "--data ADIR "
	s, ok := status.FromError(err)
	if !ok || !strings.Contains(s.Message(), placeholder) {
		return err
	}
	p := s.Proto()
	p.Message = strings.ReplaceAll(p.Message, placeholder, "--data "+shellword.Quote(string(dir))+" ")
	return status.FromProto(p).Err()
}

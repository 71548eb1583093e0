package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
)

// notCarried is an identity of the store kept aside that reapply leaves,
// why, and the command that brings its agent back.
type notCarried struct {
	Node     string `json:"node"`
	Instance string `json:"instance"`
	Why      string `json:"why"`
	Command  string `json:"command"`
}

func printNotCarried(w io.Writer, ns []notCarried) {
	if len(ns) == 0 {
		return
	}
	fmt.Fprintln(w, "Identities not carried (their agents join again):")
	for _, n := range ns {
		fmt.Fprintf(w, "  node %s, instance %s: %s: %s\n", n.Node, n.Instance, n.Why, n.Command)
	}
}

// rejoinCommand is the way back of an agent whose identity the restored
// store does not know: a token for its node ID, whose joining URI its
// agent joins again with (rejoinHow).
func rejoinCommand(node string) string {
	return "muster token create --node " + shellword.Quote(node)
}

// rejoinHow is what the agent of node does with the token rejoinCommand
// makes.
func rejoinHow(node string) string {
	return "; its agent joins again: muster agent join --force --data ADIR --node " + shellword.Quote(node) + " with the joining URI of"
}

// planCerts carries forward the identities the agents hold that the
// restored store lacks: an instance renewed since the backup (the store
// kept aside holds it at a higher generation) and a node joined since
// (the restored store holds neither its node nor its instance), each with
// its last certificate, so its agent renews by itself instead of being
// refused certificate_unknown. Only a certificate this authority issued
// is carried: its chain must verify against an agent CA the restored
// store knows, it must not have expired, and it must name the node and
// key its record says. What the restored store says otherwise (the node
// deleted there, its ID held by another node) wins: the identity is
// listed, not carried. A locked one is carried, saying so, for the CRL
// to name its certificate.
func (p *reapplyPlanner) planCerts(ctx context.Context, res *reapplyResult) error {
	res.NotCarried = []notCarried{}
	now, err := p.st.Now(ctx)
	if err != nil {
		return err
	}
	cas, err := p.agentCAs(ctx)
	if err != nil {
		return err
	}
	nodes, err := p.from.ListNodes(ctx)
	if err != nil {
		return fmt.Errorf("reading the nodes of the store kept aside: %w", err)
	}
	for _, fn := range nodes {
		in, err := p.from.GetInstance(ctx, fn.InstanceID)
		if err != nil {
			return fmt.Errorf("reading the instances of the store kept aside: %w", err)
		}
		if in.State != store.InstanceCurrent {
			continue
		}
		skip := func(why, command string) {
			if command == rejoinCommand(fn.ID) {
				why += rejoinHow(fn.ID)
			}
			res.NotCarried = append(res.NotCarried, notCarried{Node: fn.ID, Instance: in.ID, Why: why, Command: command})
		}
		c := store.CarriedIdentity{Instance: in}
		held, err := p.st.GetInstance(ctx, in.ID)
		switch {
		case err == nil:
			if held.Generation >= in.Generation {
				continue // the restored store is as far: nothing to carry
			}
			if held.State != store.InstanceCurrent {
				skip(fmt.Sprintf("the restored store holds its instance %s (its node deleted or joined again before the backup)", held.State), rejoinCommand(fn.ID))
				continue
			}
			c.Held = &held
		case !errors.Is(err, store.ErrNotFound):
			return err
		default:
			switch n, err := p.st.GetNode(ctx, fn.ID); {
			case err == nil && n.CreatedAt.Equal(p.deleting[fn.ID]) && !n.CreatedAt.Equal(fn.CreatedAt):
				// Deleted again by a step before this one, which frees its
				// ID for the node joined under it since.
			case err == nil:
				why := "the restored store holds node ID " + fn.ID + " as another node (instance " + n.InstanceID + ")"
				if n.CreatedAt.Equal(fn.CreatedAt) {
					// Re-provisioned since: a join bound to the node
					// superseded the instance the restored store holds,
					// which planRetired supersedes there too.
					why = "re-provisioned since the backup (instance " + n.InstanceID + " superseded by " + in.ID +
						"): the restored store holds the old instance, superseded by a step above, and does not carry the new one"
				}
				skip(why, rejoinCommand(fn.ID))
				continue
			case !errors.Is(err, store.ErrNotFound):
				return err
			}
			c.Node = fn
		}
		if in.JoinMethod == store.JoinMethodBoundKeypair {
			// Its join state (key, recovery sequence, epoch) lives beside
			// the instance: carried with it (planJoinStates), its agent
			// refreshes by itself. Where it is not, the instance is not
			// either: its agent recovers through a resync window, or,
			// its key rotated since, the token is made anew.
			js, err := p.joinState(ctx, in.TokenID)
			if err != nil {
				return err
			}
			if js.why != "" {
				rotated, err := p.keyRotatedSince(ctx, in.TokenID)
				if err != nil {
					return err
				}
				if rotated != "" {
					skip("a bound-keypair instance whose join state is not carried ("+js.why+"); "+rotated, "muster token delete "+shellword.Quote(in.TokenID))
					continue
				}
				skip("a bound-keypair instance whose join state is not carried ("+js.why+")", `muster bound-keypair resync open --for 24h --reason "restored the store from a backup"`)
				continue
			}
		}
		cert, err := p.from.GetCertificate(ctx, in.LastSerial)
		if err != nil {
			return fmt.Errorf("reading certificate %s of the store kept aside: %w", in.LastSerial, err)
		}
		c.Certificate = cert
		if err := checkCarried(c, cas, now); err != nil {
			skip("not carried: "+err.Error(), rejoinCommand(fn.ID))
			continue
		}
		// A locked identity is carried too: the CRL names only the
		// certificates the store records for what a lock targets, so
		// left behind, the certificate issued since the backup would go
		// unrevoked until it expires. Its agent stays out all the same:
		// a renewal checks the locks whatever record it finds.
		why, err := p.lockedIn(ctx, store.RenewalLockTargets(cert, in, nil))
		if err != nil {
			return err
		}
		what := fmt.Sprintf("node %s, instance %s: certificate %s, generation %d, until %s", fn.ID, in.ID, cert.Serial, in.Generation, cert.NotAfter.UTC().Format(time.RFC3339))
		if c.Held == nil {
			what += " (joined since the backup)"
		} else {
			what += fmt.Sprintf(" (the restored store holds generation %d)", c.Held.Generation)
		}
		if why != "" {
			what += "; " + why + ": its agent stays out while the lock holds; the CRL names its certificate"
		}
		r, _ := p.last("agent.renew", func(r store.AuditRecord) bool { return r.Target == fn.ID })
		if j, ok := p.last("agent.join", func(r store.AuditRecord) bool { return r.Target == fn.ID }); ok && j.Seq > r.Seq {
			r = j
		}
		if f, ok := p.last("agent.refresh", func(r store.AuditRecord) bool { return r.Target == fn.ID }); ok && f.Seq > r.Seq {
			r = f
		}
		res.Steps = append(res.Steps, reapplyStep{Seq: r.Seq, Action: cmpOr(r.Action, "agent.renew"), What: "carry " + what, target: fn.ID,
			write: func(ctx context.Context, st store.Store, build func(store.AuditHead) (store.AuditRecord, error)) error {
				return st.CarryIdentity(ctx, c, build)
			}})
	}
	return nil
}

// planRetired carries forward the instances the store kept aside holds
// deleted or superseded where the restored store holds them current,
// at an older generation, or not at all: a node deleted since, or one
// re-provisioned since (its old instance superseded or deleted). Each is
// written as the store kept aside holds it, with the certificate records
// it got since the backup: the restored store refuses it as that store
// did (an old instance left current would renew again), and the CRL names
// every unexpired certificate of a deleted node, those issued since the
// backup too. It runs after the node deletions re-applied, which delete
// the instance as the backup held it, and before the identities carried,
// which may supersede it. Only records are written, no chain checked:
// carrying them takes an identity out, never lets one in.
func (p *reapplyPlanner) planRetired(ctx context.Context, res *reapplyResult) error {
	ids := map[string]bool{}
	var order []string
	add := func(id string) {
		if !ids[id] {
			ids[id] = true
			order = append(order, id)
		}
	}
	for _, st := range []store.Store{p.st, p.from} {
		nodes, err := st.ListNodes(ctx)
		if err != nil {
			return err
		}
		for _, n := range nodes {
			add(n.ID)
		}
	}
	for _, r := range p.lost {
		if r.Action == "agent.delete" && r.Result == audit.ResultOK {
			add(r.Target)
		}
	}
	slices.Sort(order)
	for _, id := range order {
		ins, err := p.from.ListInstances(ctx, id)
		if err != nil {
			return fmt.Errorf("reading the instances of the store kept aside: %w", err)
		}
		var certs []store.Certificate
		for _, fi := range ins {
			if fi.State == store.InstanceCurrent {
				continue
			}
			r := store.RetiredIdentity{Instance: fi}
			held, err := p.st.GetInstance(ctx, fi.ID)
			switch {
			case err == nil:
				if held.Generation > fi.Generation || held.Generation == fi.Generation && held.State == fi.State {
					continue // the restored store is as far
				}
				if _, ok := p.deleting[id]; ok && held.Generation == fi.Generation && fi.State == store.InstanceDeleted {
					continue // the node deletion re-applied deletes it: nothing more to write
				}
				r.Held = &held
			case !errors.Is(err, store.ErrNotFound):
				return err
			}
			if certs == nil {
				if certs, err = p.from.ListCertificates(ctx, id); err != nil {
					return fmt.Errorf("reading the certificates of the store kept aside: %w", err)
				}
			}
			for _, c := range certs {
				if c.InstanceID != fi.ID {
					continue
				}
				switch _, err := p.st.GetCertificate(ctx, c.Serial); {
				case errors.Is(err, store.ErrNotFound):
					r.Certificates = append(r.Certificates, c)
				case err != nil:
					return err
				}
				if c.Serial == fi.LastSerial {
					r.Last = c
				}
			}
			if err := r.Check(); err != nil {
				return fmt.Errorf("the store kept aside's instance %s: %w", fi.ID, err)
			}
			what := fmt.Sprintf("%s instance %s of node %s at generation %d", fi.State, fi.ID, id, fi.Generation)
			if r.Held == nil {
				what += " (made since the backup)"
			} else {
				what += fmt.Sprintf(" (the restored store holds it %s at generation %d)", r.Held.State, r.Held.Generation)
			}
			if n := len(r.Certificates); n > 0 {
				what += fmt.Sprintf(", with its %d certificate(s) issued since", n)
				if fi.State == store.InstanceDeleted {
					what += " (the CRL names those unexpired)"
				}
			}
			action := "agent.delete"
			if fi.State == store.InstanceSuperseded {
				action = "agent.join"
			}
			rec, _ := p.last(action, func(r store.AuditRecord) bool { return r.Target == id })
			res.Steps = append(res.Steps, reapplyStep{Seq: rec.Seq, Action: action, What: "retire " + what, target: id,
				write: func(ctx context.Context, st store.Store, build func(store.AuditHead) (store.AuditRecord, error)) error {
					return st.RetireIdentity(ctx, r, build)
				},
				// RetireIdentity refuses alike an earlier run's write, a
				// held instance moved since it was read and a certificate
				// recorded since: only the first leaves the instance
				// retired (left current, it would renew again).
				inPlace: func(ctx context.Context, st store.Store) (bool, error) {
					in, err := st.GetInstance(ctx, fi.ID)
					switch {
					case errors.Is(err, store.ErrNotFound):
						return false, nil
					case err != nil:
						return false, err
					case in.Generation < fi.Generation || in.Generation == fi.Generation && (in.State != fi.State || in.LastSerial != fi.LastSerial):
						return false, nil
					}
					for _, c := range r.Certificates {
						switch _, err := st.GetCertificate(ctx, c.Serial); {
						case errors.Is(err, store.ErrNotFound):
							return false, nil
						case err != nil:
							return false, err
						}
					}
					return true, nil
				}})
		}
	}
	return nil
}

// keyRotatedSince says how the bound key of bound-keypair token id moved
// since the backup ("" if it did not): the restored store binds the
// key the agent rotated away, which works there again, outside a resync
// window, for whoever holds it. Deleting the token ends refreshes with
// either key; the agent joins again under a token made anew.
func (p *reapplyPlanner) keyRotatedSince(ctx context.Context, id string) (string, error) {
	held, err := p.st.GetToken(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	had, err := p.from.GetToken(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading the tokens of the store kept aside: %w", err)
	}
	if held.BoundKeypair == nil || had.BoundKeypair == nil || held.BoundKeypair.BoundPublicKey == "" ||
		held.BoundKeypair.BoundPublicKey == had.BoundKeypair.BoundPublicKey {
		return "", nil
	}
	return fmt.Sprintf("its bound key was rotated since the backup (the store kept aside binds %s, the restored store %s again, "+
		"which lets the old key refresh): once the authority runs, delete the token, then muster bot add %s, and the agent joins again "+
		"with its new registration secret (muster agent join --force --data ADIR --bound-keypair %s --registration-secret-file F)",
		had.BoundKeypair.BoundPublicKey, held.BoundKeypair.BoundPublicKey, shellword.Quote(id), shellword.Quote(id)), nil
}

// agentCAs are the agent intermediates the restored store knows and
// trusts (all but the retired): the ones a carried leaf must chain to.
func (p *reapplyPlanner) agentCAs(ctx context.Context) ([]*x509.Certificate, error) {
	certs, err := p.st.ListCACerts(ctx)
	if err != nil {
		return nil, err
	}
	var cas []*x509.Certificate
	for _, c := range certs {
		if c.Role != string(ca.RoleAgent) || c.State == store.CARetired {
			continue
		}
		x, err := x509.ParseCertificate(c.CertDER)
		if err != nil {
			return nil, fmt.Errorf("CA certificate %s of the restored store: %w", c.Serial, err)
		}
		cas = append(cas, x)
	}
	return cas, nil
}

// checkCarried says why c's certificate is not one to carry: its chain's
// leaf is not the record's (serial, key, node), it has expired, or no
// agent CA of the restored store signed it.
func checkCarried(c store.CarriedIdentity, cas []*x509.Certificate, now time.Time) error {
	if err := c.Check(); err != nil {
		return err
	}
	in, rec := c.Instance, c.Certificate
	b, _ := pem.Decode(in.LastChainPEM)
	if b == nil || b.Type != "CERTIFICATE" {
		return fmt.Errorf("instance %s holds no certificate chain", in.ID)
	}
	leaf, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return fmt.Errorf("certificate %s: %w", rec.Serial, err)
	}
	id, err := spiffeid.FromCertificate(leaf)
	key := sha256.Sum256(leaf.RawSubjectPublicKeyInfo)
	switch {
	case leaf.SerialNumber.Text(16) != rec.Serial:
		return fmt.Errorf("instance %s's chain holds certificate %s, not %s", in.ID, leaf.SerialNumber.Text(16), rec.Serial)
	case err != nil || id.Role != spiffeid.RoleAgent || id.Name != rec.NodeID:
		return fmt.Errorf("certificate %s does not name agent %s", rec.Serial, rec.NodeID)
	case !bytes.Equal(key[:], rec.PublicKey) || !bytes.Equal(key[:], in.LastPublicKey):
		return fmt.Errorf("certificate %s certifies another key than its record", rec.Serial)
	case !rec.NotAfter.Equal(leaf.NotAfter) || !rec.NotBefore.IsZero() && !rec.NotBefore.Equal(leaf.NotBefore):
		// The record's dates are what the restored store writes, and
		// what its CRL and renewal windows go by.
		return fmt.Errorf("certificate %s's record says valid %s to %s, the certificate %s to %s", rec.Serial,
			rec.NotBefore.UTC().Format(time.RFC3339), rec.NotAfter.UTC().Format(time.RFC3339),
			leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339))
	case !now.Before(leaf.NotAfter):
		return fmt.Errorf("certificate %s expired at %s", rec.Serial, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	for _, issuer := range cas {
		if leaf.CheckSignatureFrom(issuer) == nil && now.Before(issuer.NotAfter) {
			return nil
		}
	}
	return fmt.Errorf("certificate %s is signed by no agent CA the restored store knows (its issuer was prepared since the backup, and redoing the step makes another: its agent joins again, docs/ca-lifecycle.md \"Restore from backup\")", rec.Serial)
}

// lockedIn names the lock in force on targets in the restored store or
// the store kept aside (whose locks reapply makes again), if any.
func (p *reapplyPlanner) lockedIn(ctx context.Context, targets []store.LockTarget) (string, error) {
	for _, s := range []struct {
		st    store.Store
		where string
	}{{p.st, "the restored store"}, {p.from, "the store kept aside"}} {
		l, err := s.st.FindAnyLock(ctx, targets)
		switch {
		case err == nil:
			return fmt.Sprintf("locked in %s (lock %s on %s %s)", s.where, l.ID, l.Kind, l.Target), nil
		case !errors.Is(err, store.ErrNotFound):
			return "", err
		}
	}
	return "", nil
}

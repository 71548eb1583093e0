package sqlite

import (
	"context"
	"fmt"

	"github.com/muster-dev/muster/internal/store"
)

// LoadSeed writes a batch of fixture rows in one transaction, each table
// through one prepared statement. A token whose ID is taken already is
// skipped (IDs are short and random: at a million tokens a few collide);
// inserted[i] says whether b.Tokens[i] was written. The instances, nodes
// and certificates must not collide. Nothing is checked or audited: see
// store.Seed.
func (s *SQLite) LoadSeed(ctx context.Context, b store.Seed) (inserted []bool, err error) {
	inserted = make([]bool, len(b.Tokens))
	err = s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		tokens, err := tx.PrepareContext(ctx, `INSERT INTO tokens (`+tokenColumns+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING`)
		if err != nil {
			return wrap("seed: prepare tokens", err)
		}
		defer tokens.Close()
		for i, t := range b.Tokens {
			labels, err := labelsArg(t.Labels)
			if err != nil {
				return fmt.Errorf("sqlite: seed token: %w", err)
			}
			res, err := tokens.ExecContext(ctx, t.ID, t.JoinMethod, t.Ciphertext, t.Nonce, t.UsesAllowed, t.UsesCount,
				timeArg(t.ExpiresAt), t.NodeID, t.Description, labels, t.CreatedBy, timeArg(t.CreatedAt), timeArg(t.LastUsedAt), t.SVIDUsageOrDefault())
			if err != nil {
				return wrap("seed token", err)
			}
			n, err := res.RowsAffected()
			if err != nil {
				return wrap("seed token", err)
			}
			inserted[i] = n == 1
		}
		instances, err := tx.PrepareContext(ctx, `INSERT INTO instances (`+instanceColumns+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
		if err != nil {
			return wrap("seed: prepare instances", err)
		}
		defer instances.Close()
		for _, in := range b.Instances {
			if _, err := instances.ExecContext(ctx, in.ID, in.NodeID, in.JoinMethod, in.TokenID, in.PreviousID, in.State, in.Generation,
				timeArg(in.CreatedAt), in.LastSerial, in.LastPublicKey, in.LastChainPEM, timeArg(in.LastIssuedAt)); err != nil {
				return wrap("seed instance", err)
			}
		}
		nodes, err := tx.PrepareContext(ctx, `INSERT INTO nodes (`+nodeColumns+`) VALUES (?, ?, ?, ?, ?, ?)`)
		if err != nil {
			return wrap("seed: prepare nodes", err)
		}
		defer nodes.Close()
		for _, n := range b.Nodes {
			if _, err := nodes.ExecContext(ctx, n.ID, n.JoinMethod, n.TokenID, n.InstanceID, timeArg(n.CreatedAt), timeArg(n.UpdatedAt)); err != nil {
				return wrap("seed node", err)
			}
		}
		certs, err := tx.PrepareContext(ctx, `INSERT INTO certificates (`+certificateColumns+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
		if err != nil {
			return wrap("seed: prepare certificates", err)
		}
		defer certs.Close()
		for _, c := range b.Certificates {
			if _, err := certs.ExecContext(ctx, c.Serial, c.NodeID, c.InstanceID, c.Generation, c.JoinMethod, c.TokenID, c.PublicKey,
				timeArg(c.NotBefore), timeArg(c.NotAfter), timeArg(c.IssuedAt)); err != nil {
				return wrap("seed certificate", err)
			}
		}
		// Each instance's latest certificate's expiry, as a join keeps it
		// (the counts of muster_agent_certificates).
		expiry, err := tx.PrepareContext(ctx, `UPDATE instances SET last_not_after = ?, last_expiring_at = ? WHERE id = ? AND last_serial = ?`)
		if err != nil {
			return wrap("seed: prepare instance expiry", err)
		}
		defer expiry.Close()
		for _, c := range b.Certificates {
			if _, err := expiry.ExecContext(ctx, timeArg(c.NotAfter), timeArg(store.ExpiringAt(c)), c.InstanceID, c.Serial); err != nil {
				return wrap("seed instance expiry", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return inserted, nil
}

package postgres

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

// LoadSeed writes a batch of fixture rows in one transaction with COPY.
// Tokens are copied into a temporary table first and moved with ON
// CONFLICT DO NOTHING, so a token whose ID is taken already is skipped
// (IDs are short and random: at a million tokens a few collide);
// inserted[i] says whether b.Tokens[i] was written. The instances, nodes
// and certificates are copied straight into their tables and must not
// collide. Nothing is checked or audited: see store.Seed.
func (s *Store) LoadSeed(ctx context.Context, b store.Seed) (inserted []bool, err error) {
	// A bulk load: bounded by longRequestTimeout, not the store's
	// request timeout.
	ctx = long(ctx)
	inserted = make([]bool, len(b.Tokens))
	err = s.inTx(ctx, "seed", func(tx pgx.Tx) error {
		if len(b.Tokens) > 0 {
			if _, err := tx.Exec(ctx, `CREATE TEMPORARY TABLE seed_tokens (LIKE tokens) ON COMMIT DROP`); err != nil {
				return wrap("seed: temporary table", err)
			}
			rows := make([][]any, len(b.Tokens))
			for i, t := range b.Tokens {
				labels, err := labelsArg(t.Labels)
				if err != nil {
					return fmt.Errorf("postgres: seed token: %w", err)
				}
				rows[i] = []any{t.ID, t.JoinMethod, t.Ciphertext, t.Nonce, t.UsesAllowed, t.UsesCount, timeArg(t.ExpiresAt),
					t.NodeID, t.Description, labels, t.CreatedBy, timeArg(t.CreatedAt), timeArg(t.LastUsedAt), t.SVIDUsageOrDefault()}
			}
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{"seed_tokens"}, columns(tokenColumns), pgx.CopyFromRows(rows)); err != nil {
				return wrap("seed tokens", err)
			}
			got, err := tx.Query(ctx, `INSERT INTO tokens (`+tokenColumns+`) SELECT `+tokenColumns+` FROM seed_tokens ON CONFLICT (id) DO NOTHING RETURNING id`)
			if err != nil {
				return wrap("seed tokens", err)
			}
			ids, err := pgx.CollectRows(got, pgx.RowTo[string])
			if err != nil {
				return wrap("seed tokens", err)
			}
			written := make(map[string]bool, len(ids))
			for _, id := range ids {
				written[id] = true
			}
			for i, t := range b.Tokens {
				inserted[i] = written[t.ID]
			}
		}
		copyRows := func(table, cols string, n int, row func(i int) []any) error {
			if n == 0 {
				return nil
			}
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{table}, columns(cols), pgx.CopyFromSlice(n, func(i int) ([]any, error) { return row(i), nil })); err != nil {
				return wrap("seed "+table, err)
			}
			return nil
		}
		if err := copyRows("instances", instanceColumns, len(b.Instances), func(i int) []any {
			return instanceArgs(b.Instances[i])
		}); err != nil {
			return err
		}
		if err := copyRows("nodes", nodeColumns, len(b.Nodes), func(i int) []any {
			n := b.Nodes[i]
			return []any{n.ID, n.JoinMethod, n.TokenID, n.InstanceID, timeArg(n.CreatedAt), timeArg(n.UpdatedAt)}
		}); err != nil {
			return err
		}
		if err := copyRows("certificates", certificateColumns, len(b.Certificates), func(i int) []any {
			return certificateArgs(b.Certificates[i])
		}); err != nil {
			return err
		}
		if len(b.Instances) == 0 {
			return nil
		}
		// Each instance's latest certificate's expiry, as a join keeps it
		// (the counts of muster_agent_certificates): store.ExpiringAt, the
		// one definition, as the SQLite store's seed does.
		n := len(b.Certificates)
		instances, serials := make([]string, n), make([]string, n)
		notAfter, expiringAt := make([]int64, n), make([]int64, n)
		for i, c := range b.Certificates {
			instances[i], serials[i] = c.InstanceID, c.Serial
			notAfter[i], expiringAt[i] = store.StoredTime(c.NotAfter).UnixMicro(), store.ExpiringAt(c).UnixMicro()
		}
		if _, err := tx.Exec(ctx, `UPDATE instances i SET last_not_after = c.not_after, last_expiring_at = c.expiring_at
			FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS c(instance_id, serial, not_after, expiring_at)
			WHERE i.id = c.instance_id AND i.last_serial = c.serial`, instances, serials, notAfter, expiringAt); err != nil {
			return wrap("seed instance expiry", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return inserted, nil
}

// columns splits a column list as the queries write it.
func columns(list string) []string {
	var out []string
	for _, c := range strings.Split(list, ",") {
		out = append(out, strings.TrimSpace(c))
	}
	return out
}

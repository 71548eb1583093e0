package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

const (
	nodeColumns     = `id, join_method, token_id, instance_id, created_at, updated_at`
	instanceColumns = `id, node_id, join_method, token_id, previous_id, state, generation, created_at,
	last_serial, last_public_key, last_chain_pem, last_issued_at`
	certificateColumns = `serial, node_id, instance_id, generation, join_method, token_id, public_key,
	not_before, not_after, issued_at`
)

// scanner is a *sql.Row or *sql.Rows.
type scanner interface{ Scan(...any) error }

const nodeQuery = `SELECT ` + nodeColumns + ` FROM nodes WHERE id = ?`

// GetNode returns a node; ErrNotFound if no node holds the ID.
func (s *SQLite) GetNode(ctx context.Context, id string) (store.Node, error) {
	n, err := scanNode(s.r.lookup(ctx, nodeQuery, id))
	if err != nil {
		return store.Node{}, wrap("get node "+id, err)
	}
	return n, nil
}

// ListNodes returns every node, ordered by ID.
func (s *SQLite) ListNodes(ctx context.Context) ([]store.Node, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+nodeColumns+` FROM nodes ORDER BY id`)
	if err != nil {
		return nil, wrap("list nodes", err)
	}
	return collect(rows, "list nodes", scanNode)
}

// DeleteNode removes a node and its stream row and marks its current
// instance deleted, and appends its audit record, as one write of a
// group-committed transaction, freeing the node ID; ErrNotFound if no
// node holds the ID.
// A record that cannot be built or appended leaves the node as it was.
// The instances and certificates of the ID are kept as its history.
func (s *SQLite) DeleteNode(ctx context.Context, id string, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	return s.deleteNode(ctx, id, time.Time{}, audit)
}

// DeleteNodeCreated is DeleteNode of the node id created at created only;
// ErrConflict, nothing written, if the node holding id was created at
// another time.
func (s *SQLite) DeleteNodeCreated(ctx context.Context, id string, created time.Time, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if created.IsZero() {
		return fmt.Errorf("sqlite: delete node %s: no creation time to match", id)
	}
	return s.deleteNode(ctx, id, created, audit)
}

// deleteNode deletes node id, created at created unless that is zero.
func (s *SQLite) deleteNode(ctx context.Context, id string, created time.Time, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("sqlite: delete node %s: no audit record: a node is never deleted unaudited", id)
	}
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		var instanceID string
		err := tx.QueryRowContext(ctx, `DELETE FROM nodes WHERE id = ? AND (?2 IS NULL OR created_at = ?2) RETURNING instance_id`,
			id, timeArg(created)).Scan(&instanceID)
		if errors.Is(err, sql.ErrNoRows) && !created.IsZero() {
			var other int64
			if tx.QueryRowContext(ctx, `SELECT created_at FROM nodes WHERE id = ?`, id).Scan(&other) == nil {
				return fmt.Errorf("sqlite: delete node %s: %w: the node holding the ID was created at %s, not %s (deleted and joined again since)",
					id, store.ErrConflict, time.UnixMicro(other).UTC().Format(time.RFC3339Nano), created.UTC().Format(time.RFC3339Nano))
			}
		}
		if err != nil {
			return wrap("delete node "+id, err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE instances SET state = 'deleted'
			WHERE id = ? AND state = 'current'`, instanceID); err != nil {
			return wrap("delete node "+id, err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM agent_streams WHERE node_id = ?`, id); err != nil {
			return wrap("delete node "+id, err)
		}
		return appendAuditOf(ctx, tx, "delete node "+id, audit)
	})
	if err != nil {
		return err
	}
	s.hub.announce(store.ChangeStanding, id)
	return nil
}

// GetInstance returns an instance, whatever its state; ErrNotFound.
func (s *SQLite) GetInstance(ctx context.Context, id string) (store.Instance, error) {
	in, err := scanInstance(s.r.lookup(ctx, `SELECT `+instanceColumns+` FROM instances WHERE id = ?`, id))
	if err != nil {
		return store.Instance{}, wrap("get instance "+id, err)
	}
	return in, nil
}

// ListInstances returns every instance that held the node ID, including
// those of deleted nodes, oldest first (ties by ID). An ID never used
// yields none and no error.
func (s *SQLite) ListInstances(ctx context.Context, nodeID string) ([]store.Instance, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+instanceColumns+` FROM instances
		WHERE node_id = ? ORDER BY created_at, id`, nodeID)
	if err != nil {
		return nil, wrap("list instances", err)
	}
	return collect(rows, "list instances", scanInstance)
}

// GetCertificate returns the record of a serial; ErrNotFound.
func (s *SQLite) GetCertificate(ctx context.Context, serial string) (store.Certificate, error) {
	c, err := scanCertificate(s.r.lookup(ctx, `SELECT `+certificateColumns+` FROM certificates
		WHERE serial = ?`, serial))
	if err != nil {
		return store.Certificate{}, wrap("get certificate "+serial, err)
	}
	return c, nil
}

// ListCertificates returns every certificate issued under the node ID,
// including to deleted nodes that held it, oldest first (ties by serial).
func (s *SQLite) ListCertificates(ctx context.Context, nodeID string) ([]store.Certificate, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+certificateColumns+` FROM certificates
		WHERE node_id = ? ORDER BY issued_at, serial`, nodeID)
	if err != nil {
		return nil, wrap("list certificates", err)
	}
	return collect(rows, "list certificates", scanCertificate)
}

// collect scans every row and closes rows.
func collect[T any](rows *sql.Rows, op string, scan func(scanner) (T, error)) ([]T, error) {
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, wrap(op, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(op, err)
	}
	return out, nil
}

// CarryIdentity writes an identity the restored store lacks (see
// store.JoinStore), with its record, in one transaction: an advance of
// the instance as read, or the node, instance and certificate of a join
// since the backup.
func (s *SQLite) CarryIdentity(ctx context.Context, c store.CarriedIdentity, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	in, cert := c.Instance, c.Certificate
	op := "carry identity of instance " + in.ID
	if audit == nil {
		return fmt.Errorf("sqlite: %s: no audit record: an identity is never carried unaudited", op)
	}
	if err := c.Check(); err != nil {
		return fmt.Errorf("sqlite: %s: %w", op, err)
	}
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		if c.Held != nil {
			r, err := tx.ExecContext(ctx, `UPDATE instances
				SET generation = ?1, last_serial = ?2, last_public_key = ?3, last_chain_pem = ?4, last_issued_at = ?5,
					last_not_after = ?6, last_expiring_at = ?7
				WHERE id = ?8 AND state = 'current' AND generation = ?9 AND last_serial = ?10 AND ?1 > generation`,
				in.Generation, in.LastSerial, in.LastPublicKey, in.LastChainPEM, timeArg(in.LastIssuedAt),
				timeArg(cert.NotAfter), timeArg(store.ExpiringAt(cert)), in.ID, c.Held.Generation, c.Held.LastSerial)
			if err != nil {
				return wrap(op, err)
			}
			if err := instanceMoved(ctx, tx, op, r, in.ID,
				fmt.Sprintf("current at generation %d, serial %s as read", c.Held.Generation, c.Held.LastSerial)); err != nil {
				return err
			}
		} else {
			in.State = store.InstanceCurrent
			if _, err := tx.ExecContext(ctx, `INSERT INTO instances (`+instanceColumns+`, last_not_after, last_expiring_at)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
				in.ID, in.NodeID, in.JoinMethod, in.TokenID, in.PreviousID, in.State, in.Generation,
				timeArg(in.CreatedAt), in.LastSerial, in.LastPublicKey, in.LastChainPEM, timeArg(in.LastIssuedAt),
				timeArg(cert.NotAfter), timeArg(store.ExpiringAt(cert))); err != nil {
				return wrap(op+": insert instance", err)
			}
			n := c.Node
			if _, err := tx.ExecContext(ctx, `INSERT INTO nodes (`+nodeColumns+`) VALUES (?, ?, ?, ?, ?, ?)`,
				in.NodeID, in.JoinMethod, in.TokenID, in.ID, timeArg(n.CreatedAt), timeArg(n.UpdatedAt)); err != nil {
				return wrap(op+": insert node "+in.NodeID, err)
			}
		}
		if err := insertCertificate(ctx, tx, cert); err != nil {
			return wrap(op+": insert certificate "+cert.Serial, err)
		}
		return appendAuditOf(ctx, tx, op, audit)
	})
	if err != nil {
		return err
	}
	s.hub.announce(store.ChangeStanding, in.NodeID)
	return nil
}

// RetireIdentity writes an instance the store kept aside holds deleted
// or superseded, and its certificate records the restored store lacks
// (see store.JoinStore), with its record, in one transaction.
func (s *SQLite) RetireIdentity(ctx context.Context, r store.RetiredIdentity, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	in := r.Instance
	op := "retire instance " + in.ID
	if audit == nil {
		return fmt.Errorf("sqlite: %s: no audit record: an identity is never retired unaudited", op)
	}
	if err := r.Check(); err != nil {
		return fmt.Errorf("sqlite: %s: %w", op, err)
	}
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		if r.Held != nil {
			res, err := tx.ExecContext(ctx, `UPDATE instances
				SET state = ?1, generation = ?2, last_serial = ?3, last_public_key = ?4, last_chain_pem = ?5, last_issued_at = ?6,
					last_not_after = ?7, last_expiring_at = ?8
				WHERE id = ?9 AND generation = ?10 AND last_serial = ?11 AND ?2 >= generation AND (?2 > generation OR state <> ?1)`,
				in.State, in.Generation, in.LastSerial, in.LastPublicKey, in.LastChainPEM, timeArg(in.LastIssuedAt),
				timeArg(r.Last.NotAfter), timeArg(store.ExpiringAt(r.Last)), in.ID, r.Held.Generation, r.Held.LastSerial)
			if err != nil {
				return wrap(op, err)
			}
			if err := instanceMoved(ctx, tx, op, res, in.ID,
				fmt.Sprintf("at generation %d, serial %s as read, or %s already", r.Held.Generation, r.Held.LastSerial, in.State)); err != nil {
				return err
			}
		} else if _, err := tx.ExecContext(ctx, `INSERT INTO instances (`+instanceColumns+`, last_not_after, last_expiring_at)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			in.ID, in.NodeID, in.JoinMethod, in.TokenID, in.PreviousID, in.State, in.Generation,
			timeArg(in.CreatedAt), in.LastSerial, in.LastPublicKey, in.LastChainPEM, timeArg(in.LastIssuedAt),
			timeArg(r.Last.NotAfter), timeArg(store.ExpiringAt(r.Last))); err != nil {
			return wrap(op+": insert instance", err)
		}
		for _, c := range r.Certificates {
			if err := insertCertificate(ctx, tx, c); err != nil {
				return wrap(op+": insert certificate "+c.Serial, err)
			}
		}
		return appendAuditOf(ctx, tx, op, audit)
	})
	if err != nil {
		return err
	}
	s.hub.announce(store.ChangeStanding, in.NodeID)
	return nil
}

// instanceMoved is nil if res moved instance id; else ErrConflict saying
// what the instance is now beside as, what the write expected of it.
func instanceMoved(ctx context.Context, tx *writeTx, op string, res sql.Result, id, as string) error {
	n, err := res.RowsAffected()
	if err != nil {
		return wrap(op, err)
	}
	if n > 0 {
		return nil
	}
	var gen int64
	var state, serial string
	if err := tx.QueryRowContext(ctx, `SELECT generation, state, last_serial FROM instances WHERE id = ?`, id).Scan(&gen, &state, &serial); err != nil {
		return wrap(op, err)
	}
	return fmt.Errorf("sqlite: %s: %w: it is %s at generation %d, serial %s, not %s", op, store.ErrConflict, state, gen, serial, as)
}

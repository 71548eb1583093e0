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

// DeleteNode removes a node and marks its current instance deleted, and
// appends its audit record, as one write of a group-committed
// transaction, freeing the node ID; ErrNotFound if no node holds the ID.
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

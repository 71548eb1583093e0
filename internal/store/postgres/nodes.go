package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

const (
	nodeColumns     = `id, join_method, token_id, instance_id, created_at, updated_at`
	instanceColumns = `id, node_id, join_method, token_id, previous_id, state, generation, created_at,
	last_serial, last_public_key, last_chain_pem, last_issued_at`
	certificateColumns = `serial, node_id, instance_id, generation, join_method, token_id, public_key,
	not_before, not_after, issued_at`
)

// GetNode returns a node; ErrNotFound if no node holds the ID.
func (s *Store) GetNode(ctx context.Context, id string) (store.Node, error) {
	n, err := scanNode(s.pool.QueryRow(ctx, `SELECT `+nodeColumns+` FROM nodes WHERE id = $1`, id))
	if err != nil {
		return store.Node{}, wrap("get node "+id, err)
	}
	return n, nil
}

// ListNodes returns every node, ordered by ID.
func (s *Store) ListNodes(ctx context.Context) ([]store.Node, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+nodeColumns+` FROM nodes ORDER BY id`)
	if err != nil {
		return nil, wrap("list nodes", err)
	}
	return collect(rows, "list nodes", scanNode)
}

// DeleteNode removes a node and its stream row and marks its current
// instance deleted, with its audit record, in one transaction, freeing
// the node ID; ErrNotFound
// if no node holds the ID, and a record that cannot be built or appended
// leaves the node. It takes the node ID's advisory lock, like CommitJoin,
// so a join of the same ID sees the node either whole or gone; under it
// the instance is marked before the node row goes, so the whole delete
// travels in one batch with the record's. The instances and certificates
// of the ID are kept as its history.
func (s *Store) DeleteNode(ctx context.Context, id string, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	return s.deleteNode(ctx, id, time.Time{}, audit)
}

// DeleteNodeCreated is DeleteNode of the node id created at created only;
// ErrConflict, nothing written, if the node holding id was created at
// another time.
func (s *Store) DeleteNodeCreated(ctx context.Context, id string, created time.Time, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if created.IsZero() {
		return fmt.Errorf("postgres: delete node %s: no creation time to match", id)
	}
	return s.deleteNode(ctx, id, created, audit)
}

// deleteNode deletes node id, created at created unless that is zero
// (NULL: any).
func (s *Store) deleteNode(ctx context.Context, id string, created time.Time, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("postgres: delete node %s: no audit record: a node is never deleted unaudited", id)
	}
	op := "delete node " + id
	at := timeArg(created)
	return s.inPipe(ctx, op, func(p *pipe) error {
		p.exec(nodeLockQuery, []any{nodeLockClass, id}, wrapped(op+": lock"))
		p.exec(`UPDATE instances SET state = 'deleted'
			WHERE id = (SELECT instance_id FROM nodes WHERE id = $1 AND ($2::bigint IS NULL OR created_at = $2)) AND state = 'current'`,
			[]any{id, at}, wrapped(op))
		// One row: when the node holding the ID was created (NULL: none
		// does), and whether it went.
		p.row(`WITH held AS (SELECT created_at FROM nodes WHERE id = $1),
				gone AS (DELETE FROM nodes WHERE id = $1 AND ($2::bigint IS NULL OR created_at = $2) RETURNING 1)
			SELECT (SELECT created_at FROM held), EXISTS (SELECT 1 FROM gone)`, []any{id, at}, func(r pgx.Row) error {
			var held *int64
			var deleted bool
			if err := r.Scan(&held, &deleted); err != nil {
				return wrap(op, err)
			}
			switch {
			case deleted:
				return nil
			case held == nil:
				return wrap(op, pgx.ErrNoRows)
			}
			return fmt.Errorf("postgres: %s: %w: the node holding the ID was created at %s, not %s (deleted and joined again since)",
				op, store.ErrConflict, timeCol(held).Format(time.RFC3339Nano), created.UTC().Format(time.RFC3339Nano))
		})
		// In the same batch: a refusal of the row above rolls this back
		// with the rest.
		p.exec(`DELETE FROM agent_streams WHERE node_id = $1`, []any{id}, wrapped(op))
		queueNotify(p, store.ChangeStanding, id)
		return commitAudited(ctx, p, audit, op)
	})
}

// nodeLockQuery takes the transaction-scoped advisory lock of a node ID
// ($2) in nodeLockClass ($1). A hash collision between two IDs only
// serializes their joins.
const nodeLockQuery = `SELECT pg_advisory_xact_lock($1, hashtext($2))`

// GetInstance returns an instance, whatever its state; ErrNotFound.
func (s *Store) GetInstance(ctx context.Context, id string) (store.Instance, error) {
	in, err := scanInstance(s.pool.QueryRow(ctx, `SELECT `+instanceColumns+` FROM instances WHERE id = $1`, id))
	if err != nil {
		return store.Instance{}, wrap("get instance "+id, err)
	}
	return in, nil
}

// ListInstances returns every instance that held the node ID, including
// those of deleted nodes, oldest first (ties by ID). An ID never used
// yields none and no error.
func (s *Store) ListInstances(ctx context.Context, nodeID string) ([]store.Instance, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+instanceColumns+` FROM instances
		WHERE node_id = $1 ORDER BY created_at, id`, nodeID)
	if err != nil {
		return nil, wrap("list instances", err)
	}
	return collect(rows, "list instances", scanInstance)
}

// GetCertificate returns the record of a serial; ErrNotFound.
func (s *Store) GetCertificate(ctx context.Context, serial string) (store.Certificate, error) {
	c, err := scanCertificate(s.pool.QueryRow(ctx, `SELECT `+certificateColumns+` FROM certificates
		WHERE serial = $1`, serial))
	if err != nil {
		return store.Certificate{}, wrap("get certificate "+serial, err)
	}
	return c, nil
}

// ListCertificates returns every certificate issued under the node ID,
// including to deleted nodes that held it, oldest first (ties by serial).
func (s *Store) ListCertificates(ctx context.Context, nodeID string) ([]store.Certificate, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+certificateColumns+` FROM certificates
		WHERE node_id = $1 ORDER BY issued_at, serial`, nodeID)
	if err != nil {
		return nil, wrap("list certificates", err)
	}
	return collect(rows, "list certificates", scanCertificate)
}

func scanNode(row pgx.Row) (store.Node, error) {
	var (
		n                store.Node
		created, updated *int64
	)
	if err := row.Scan(&n.ID, &n.JoinMethod, &n.TokenID, &n.InstanceID, &created, &updated); err != nil {
		return store.Node{}, err
	}
	n.CreatedAt, n.UpdatedAt = timeCol(created), timeCol(updated)
	return n, nil
}

func scanInstance(row pgx.Row) (store.Instance, error) {
	var (
		in              store.Instance
		created, issued *int64
	)
	if err := row.Scan(&in.ID, &in.NodeID, &in.JoinMethod, &in.TokenID, &in.PreviousID, &in.State,
		&in.Generation, &created, &in.LastSerial, &in.LastPublicKey, &in.LastChainPEM, &issued); err != nil {
		return store.Instance{}, err
	}
	in.CreatedAt, in.LastIssuedAt = timeCol(created), timeCol(issued)
	return in, nil
}

func scanCertificate(row pgx.Row) (store.Certificate, error) {
	var (
		c                           store.Certificate
		notBefore, notAfter, issued *int64
	)
	if err := row.Scan(&c.Serial, &c.NodeID, &c.InstanceID, &c.Generation, &c.JoinMethod, &c.TokenID,
		&c.PublicKey, &notBefore, &notAfter, &issued); err != nil {
		return store.Certificate{}, err
	}
	c.NotBefore, c.NotAfter, c.IssuedAt = timeCol(notBefore), timeCol(notAfter), timeCol(issued)
	return c, nil
}

// CarryIdentity writes an identity the restored store lacks (see
// store.JoinStore), with its record, in one transaction under the node
// ID's lock: an advance of the instance as read, or the node, instance
// and certificate of a join since the backup.
func (s *Store) CarryIdentity(ctx context.Context, c store.CarriedIdentity, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	in, cert := c.Instance, c.Certificate
	op := "carry identity of instance " + in.ID
	if audit == nil {
		return fmt.Errorf("postgres: %s: no audit record: an identity is never carried unaudited", op)
	}
	if err := c.Check(); err != nil {
		return fmt.Errorf("postgres: %s: %w", op, err)
	}
	return s.inPipe(ctx, op, func(p *pipe) error {
		p.exec(nodeLockQuery, []any{nodeLockClass, in.NodeID}, wrapped(op+": lock"))
		if c.Held != nil {
			held := *c.Held
			// One row: the instance as it was (NULL: none), and whether
			// it moved.
			p.row(`WITH was AS (SELECT generation, state, last_serial FROM instances WHERE id = $8),
					moved AS (UPDATE instances
						SET generation = $1, last_serial = $2, last_public_key = $3, last_chain_pem = $4, last_issued_at = $5,
							last_not_after = $6, last_expiring_at = $7
						WHERE id = $8 AND state = 'current' AND generation = $9 AND last_serial = $10 AND generation < $1
						RETURNING 1)
				SELECT (SELECT generation FROM was), (SELECT state FROM was), (SELECT last_serial FROM was), EXISTS (SELECT 1 FROM moved)`,
				[]any{in.Generation, in.LastSerial, in.LastPublicKey, in.LastChainPEM, timeArg(in.LastIssuedAt),
					timeArg(cert.NotAfter), timeArg(store.ExpiringAt(cert)), in.ID, held.Generation, held.LastSerial},
				instanceMoved(op, fmt.Sprintf("current at generation %d, serial %s as read", held.Generation, held.LastSerial)))
		} else {
			in.State = store.InstanceCurrent
			p.exec(`INSERT INTO instances (`+instanceColumns+`, last_not_after, last_expiring_at)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`,
				append(instanceArgs(in), timeArg(cert.NotAfter), timeArg(store.ExpiringAt(cert))), wrapped(op+": insert instance"))
			p.exec(`INSERT INTO nodes (`+nodeColumns+`) VALUES ($1, $2, $3, $4, $5, $6)`,
				[]any{in.NodeID, in.JoinMethod, in.TokenID, in.ID, timeArg(c.Node.CreatedAt), timeArg(c.Node.UpdatedAt)},
				wrapped(op+": insert node "+in.NodeID))
		}
		p.exec(insertCertificateQuery, certificateArgs(cert), wrapped(op+": insert certificate "+cert.Serial))
		queueNotify(p, store.ChangeStanding, in.NodeID)
		return commitAudited(ctx, p, audit, op)
	})
}

// RetireIdentity writes an instance the store kept aside holds deleted
// or superseded, and its certificate records the restored store lacks
// (see store.JoinStore), with its record, in one transaction under the
// node ID's lock.
func (s *Store) RetireIdentity(ctx context.Context, r store.RetiredIdentity, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	in := r.Instance
	op := "retire instance " + in.ID
	if audit == nil {
		return fmt.Errorf("postgres: %s: no audit record: an identity is never retired unaudited", op)
	}
	if err := r.Check(); err != nil {
		return fmt.Errorf("postgres: %s: %w", op, err)
	}
	return s.inPipe(ctx, op, func(p *pipe) error {
		p.exec(nodeLockQuery, []any{nodeLockClass, in.NodeID}, wrapped(op+": lock"))
		if r.Held != nil {
			held := *r.Held
			p.row(`WITH was AS (SELECT generation, state, last_serial FROM instances WHERE id = $9),
					moved AS (UPDATE instances
						SET state = $1, generation = $2, last_serial = $3, last_public_key = $4, last_chain_pem = $5, last_issued_at = $6,
							last_not_after = $7, last_expiring_at = $8
						WHERE id = $9 AND generation = $10 AND last_serial = $11 AND generation <= $2 AND (generation < $2 OR state <> $1)
						RETURNING 1)
				SELECT (SELECT generation FROM was), (SELECT state FROM was), (SELECT last_serial FROM was), EXISTS (SELECT 1 FROM moved)`,
				[]any{in.State, in.Generation, in.LastSerial, in.LastPublicKey, in.LastChainPEM, timeArg(in.LastIssuedAt),
					timeArg(r.Last.NotAfter), timeArg(store.ExpiringAt(r.Last)), in.ID, held.Generation, held.LastSerial},
				instanceMoved(op, fmt.Sprintf("at generation %d, serial %s as read, or %s already", held.Generation, held.LastSerial, in.State)))
		} else {
			p.exec(`INSERT INTO instances (`+instanceColumns+`, last_not_after, last_expiring_at)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`,
				append(instanceArgs(in), timeArg(r.Last.NotAfter), timeArg(store.ExpiringAt(r.Last))), wrapped(op+": insert instance"))
		}
		for _, c := range r.Certificates {
			p.exec(insertCertificateQuery, certificateArgs(c), wrapped(op+": insert certificate "+c.Serial))
		}
		queueNotify(p, store.ChangeStanding, in.NodeID)
		return commitAudited(ctx, p, audit, op)
	})
}

// instanceMoved reads the row of a conditional instance write that
// returns the instance as it was and whether it moved: nil if it moved;
// else ErrNotFound for no instance, or ErrConflict saying what it is now
// beside as, what the write expected of it.
func instanceMoved(op, as string) func(pgx.Row) error {
	return func(r pgx.Row) error {
		var gen *int64
		var state, serial *string
		var moved bool
		if err := r.Scan(&gen, &state, &serial, &moved); err != nil {
			return wrap(op, err)
		}
		switch {
		case moved:
			return nil
		case gen == nil:
			return wrap(op, pgx.ErrNoRows)
		}
		return fmt.Errorf("postgres: %s: %w: it is %s at generation %d, serial %s, not %s", op, store.ErrConflict, *state, *gen, *serial, as)
	}
}

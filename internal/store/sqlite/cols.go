package sqlite

import (
	"fmt"
	"sync"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// The scan functions read a row whole into []any, then take its values
// one column after another into the fields of what they return (cols). A
// Scan(&field, …) through the scanner interface (*sql.Row, *sql.Rows)
// moved every destination it was handed to the heap: the struct being
// filled, each time column's nullInt, the slice of destinations; a
// renewal's read made about 21 allocations there. Each table's column
// order is written once, in its decode function (nodeFrom and the
// others), whichever way the row was read.

// cols is a row's values, taken in column order. The values are those
// database/sql's Scan into *any gives, or the driver's: string, []byte
// (copied out of the driver), int64, or nil for NULL. A NULL reads as the
// zero value, as a LEFT JOIN's columns do when it found no row (the
// flags in ReadRenewal tell those apart). A value of another type is an
// error, kept until err.
type cols struct {
	v   []any
	i   int
	err error
}

func (c *cols) next() any {
	if c.i >= len(c.v) {
		if c.err == nil {
			c.err = fmt.Errorf("sqlite: %d columns read, more taken", len(c.v))
		}
		c.i++
		return nil
	}
	c.i++
	return c.v[c.i-1]
}

func (c *cols) mismatch(v any, want string) {
	if c.err == nil {
		c.err = fmt.Errorf("sqlite: column %d: cannot store %T in %s", c.i-1, v, want)
	}
}

func (c *cols) str() string {
	switch v := c.next().(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case nil:
		return ""
	default:
		c.mismatch(v, "string")
		return ""
	}
}

// bytes returns a []byte value as it is: database/sql and the driver
// copied it out of SQLite for this row.
func (c *cols) bytes() []byte {
	switch v := c.next().(type) {
	case []byte:
		return v
	case string:
		return []byte(v)
	case nil:
		return nil
	default:
		c.mismatch(v, "[]byte")
		return nil
	}
}

func (c *cols) int() int64 {
	switch v := c.next().(type) {
	case int64:
		return v
	case nil:
		return 0
	default:
		c.mismatch(v, "int64")
		return 0
	}
}

// time is a time column (timeArg): Unix microseconds, or NULL for the
// zero time.
func (c *cols) time() time.Time {
	switch v := c.next().(type) {
	case int64:
		return time.UnixMicro(v).UTC()
	case nil:
		return time.Time{}
	default:
		c.mismatch(v, "time")
		return time.Time{}
	}
}

// done is the error of the columns taken: a value of the wrong type, or
// a count that is not the row's.
func (c *cols) done() error {
	if c.err == nil && c.i != len(c.v) {
		c.err = fmt.Errorf("sqlite: %d columns read, %d taken", len(c.v), c.i)
	}
	return c.err
}

// rowBuf is a row read whole: raw holds its values, dst points into raw.
// Pooled, as what the scan functions return holds none of it (the values
// in raw are strings and byte slices of their own).
type rowBuf struct{ raw, dst []any }

var rowBufs = sync.Pool{New: func() any { return new(rowBuf) }}

// readRow reads row's n columns into a pooled rowBuf; the caller puts it
// back.
func readRow(row scanner, n int) (*rowBuf, error) {
	b := rowBufs.Get().(*rowBuf)
	if len(b.raw) < n {
		b.raw, b.dst = make([]any, n), make([]any, n)
		for i := range b.raw {
			b.dst[i] = &b.raw[i]
		}
	}
	if err := row.Scan(b.dst[:n]...); err != nil {
		b.put()
		return nil, err
	}
	return b, nil
}

func (b *rowBuf) cols(n int) cols { return cols{v: b.raw[:n]} }

func (b *rowBuf) put() {
	clear(b.raw)
	rowBufs.Put(b)
}

// The decode functions, one per table: each takes the table's columns
// (nodeColumns and the others) in their order. The fields of a composite
// literal are evaluated in the order written (the spec's order of
// evaluation), which is the columns'.

func nodeFrom(c cols) (store.Node, error) {
	n := store.Node{ID: c.str(), JoinMethod: c.str(), TokenID: c.str(), InstanceID: c.str(),
		CreatedAt: c.time(), UpdatedAt: c.time()}
	return n, c.done()
}

func instanceFrom(c cols) (store.Instance, error) {
	in := store.Instance{ID: c.str(), NodeID: c.str(), JoinMethod: c.str(), TokenID: c.str(),
		PreviousID: c.str(), State: c.str(), Generation: c.int(), CreatedAt: c.time(),
		LastSerial: c.str(), LastPublicKey: c.bytes(), LastChainPEM: c.bytes(), LastIssuedAt: c.time()}
	return in, c.done()
}

func certificateFrom(c cols) (store.Certificate, error) {
	cert := store.Certificate{Serial: c.str(), NodeID: c.str(), InstanceID: c.str(), Generation: c.int(),
		JoinMethod: c.str(), TokenID: c.str(), PublicKey: c.bytes(),
		NotBefore: c.time(), NotAfter: c.time(), IssuedAt: c.time()}
	return cert, c.done()
}

func lockFrom(c cols) (store.Lock, error) {
	l := store.Lock{ID: c.str(), Kind: c.str(), Target: c.str(), Reason: c.str(), CreatedBy: c.str(),
		CreatedAt: c.time(), ExpiresAt: c.time()}
	return l, c.done()
}

func scanNode(row scanner) (store.Node, error) {
	b, err := readRow(row, nodeColumnCount)
	if err != nil {
		return store.Node{}, err
	}
	defer b.put()
	return nodeFrom(b.cols(nodeColumnCount))
}

func scanInstance(row scanner) (store.Instance, error) {
	b, err := readRow(row, instanceColumnCount)
	if err != nil {
		return store.Instance{}, err
	}
	defer b.put()
	return instanceFrom(b.cols(instanceColumnCount))
}

func scanCertificate(row scanner) (store.Certificate, error) {
	b, err := readRow(row, certificateColumnCount)
	if err != nil {
		return store.Certificate{}, err
	}
	defer b.put()
	return certificateFrom(b.cols(certificateColumnCount))
}

func scanLock(row scanner) (store.Lock, error) {
	b, err := readRow(row, lockColumnCount)
	if err != nil {
		return store.Lock{}, err
	}
	defer b.put()
	return lockFrom(b.cols(lockColumnCount))
}

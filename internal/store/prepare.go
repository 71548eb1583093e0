package store

import (
	"bytes"
	"errors"
	"fmt"
	"time"
)

// The records a join or renewal writes are completed the same way by every
// backend: the fields the contract leaves to the store are set, empty ones
// are filled from the join or the instance, and a given value that
// contradicts them is an error (a bug in the caller, not a sentinel).

// PrepareJoin returns the instance and certificate CommitJoin writes, with
// the store's fields set, the empty ones filled and times as they read
// back; PreviousID is left to the node claim.
func PrepareJoin(j Join) (Instance, Certificate, error) {
	in, c := j.Instance, j.Certificate
	if j.NodeID == "" || in.ID == "" || c.Serial == "" {
		return in, c, errors.New("node ID, instance ID and serial are required")
	}
	in.NodeID, in.State, in.PreviousID, in.Generation = j.NodeID, InstanceCurrent, "", 0
	if c.Generation != 0 {
		return in, c, fmt.Errorf("certificate generation %d, want 0", c.Generation)
	}
	// The instance first: the certificate is filled from it.
	credential := j.TokenID
	if j.Credential != "" {
		if j.TokenID != "" {
			return in, c, errors.New("both a token and another credential")
		}
		credential = j.Credential
	}
	if err := fill("instance token", &in.TokenID, credential, true); err != nil {
		return in, c, err
	}
	if err := fill("instance last serial", &in.LastSerial, c.Serial, true); err != nil {
		return in, c, err
	}
	if err := fillCertificate(&c, in, true); err != nil {
		return in, c, err
	}
	if len(in.LastPublicKey) == 0 {
		in.LastPublicKey = c.PublicKey
	} else if !bytes.Equal(in.LastPublicKey, c.PublicKey) {
		return in, c, errors.New("instance last public key is not the certificate's")
	}
	if in.LastIssuedAt.IsZero() {
		in.LastIssuedAt = c.IssuedAt
	}
	in.CreatedAt, in.LastIssuedAt = StoredTime(in.CreatedAt), StoredTime(in.LastIssuedAt)
	return in, c, nil
}

// PrepareRenewal returns the certificate of r with its instance and
// generation filled in and checked; the rest is filled from the instance
// by FillRenewedCertificate once the write has read it.
func PrepareRenewal(r Renewal) (Certificate, error) {
	c := r.Certificate
	if err := fill("certificate instance", &c.InstanceID, r.InstanceID, true); err != nil {
		return c, err
	}
	if c.Generation == 0 {
		c.Generation = r.FromGeneration + 1
	}
	if c.Generation != r.FromGeneration+1 {
		return c, fmt.Errorf("certificate generation %d, want %d", c.Generation, r.FromGeneration+1)
	}
	return c, nil
}

// FillRenewedCertificate fills a renewal's certificate from its instance.
func FillRenewedCertificate(c *Certificate, in Instance) error {
	return fillCertificate(c, in, false)
}

// fillCertificate fills c's node, join method and token from in, and its
// instance when withInstance is set.
func fillCertificate(c *Certificate, in Instance, withInstance bool) error {
	if withInstance {
		if err := fill("certificate instance", &c.InstanceID, in.ID, true); err != nil {
			return err
		}
	}
	if err := fill("certificate node", &c.NodeID, in.NodeID, true); err != nil {
		return err
	}
	fill("certificate join method", &c.JoinMethod, in.JoinMethod, false)
	fill("certificate token", &c.TokenID, in.TokenID, false)
	return nil
}

// fill sets an empty *field to want. A non-empty one must equal want when
// mustMatch is set.
func fill(name string, field *string, want string, mustMatch bool) error {
	switch {
	case *field == "":
		*field = want
	case mustMatch && *field != want:
		return fmt.Errorf("%s %q, want %q", name, *field, want)
	}
	return nil
}

// StoredTime returns t as every backend returns it: to the microsecond, in
// UTC, the zero time unchanged.
func StoredTime(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.Truncate(time.Microsecond).UTC()
}

// BuildAuditRecord calls build with the chain's head and checks the record
// it returns the way AppendAudit promises: Seq head.Seq+1 and PrevHash
// head.Hash (else ErrConflict), a hash and a time; an empty PrevHash
// becomes nil and the time is as it reads back.
func BuildAuditRecord(head AuditHead, build func(AuditHead) (AuditRecord, error)) (AuditRecord, error) {
	rec, err := build(AuditHead{Seq: head.Seq, Hash: bytes.Clone(head.Hash)})
	if err != nil {
		return AuditRecord{}, fmt.Errorf("build: %w", err)
	}
	if rec.Seq != head.Seq+1 {
		return AuditRecord{}, fmt.Errorf("record seq %d, want %d: %w", rec.Seq, head.Seq+1, ErrConflict)
	}
	if !bytes.Equal(rec.PrevHash, head.Hash) {
		return AuditRecord{}, fmt.Errorf("record %d prev hash does not match the head: %w", rec.Seq, ErrConflict)
	}
	if len(rec.Hash) == 0 {
		return AuditRecord{}, errors.New("record has no hash")
	}
	if len(rec.PrevHash) == 0 {
		rec.PrevHash = nil // the first link's missing prev hash is stored as NULL
	}
	if rec.Time.IsZero() {
		return AuditRecord{}, errors.New("record has no time")
	}
	rec.Time = StoredTime(rec.Time)
	return rec, nil
}

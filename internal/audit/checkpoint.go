package audit

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/muster-dev/muster/internal/atomicfile"
	"github.com/muster-dev/muster/internal/store"
)

// ErrDiverged is returned by Checkpoint when the chain no longer holds the
// record an earlier checkpoint signed: records were removed or replaced.
// Nothing is signed or written then, so the checkpoint that shows it is
// kept for Verify.
var ErrDiverged = errors.New("audit: the chain no longer matches an earlier checkpoint")

// finalCheckpointTimeout bounds the checkpoint Run takes as it stops.
const finalCheckpointTimeout = 5 * time.Second

// checkpointDomain separates checkpoint signatures from anything else the
// key could ever sign.
const checkpointDomain = "muster-audit-checkpoint-v1\n"

// KeyID names a checkpoint public key, so that an operator can tell which
// key signed a checkpoint.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return "ed25519:" + hex.EncodeToString(sum[:])[:16]
}

// checkpointMessage is what a checkpoint signature covers. The seq and the
// time are fixed-size, so the hash between them is unambiguous.
func checkpointMessage(seq int64, hash []byte, t time.Time) []byte {
	msg := make([]byte, 0, len(checkpointDomain)+8+len(hash)+8)
	msg = append(msg, checkpointDomain...)
	msg = binary.BigEndian.AppendUint64(msg, uint64(seq))
	msg = append(msg, hash...)
	msg = binary.BigEndian.AppendUint64(msg, uint64(t.UnixMicro()))
	return msg
}

// signedBy reports whether c carries a valid signature by pub.
func signedBy(pub ed25519.PublicKey, c store.AuditCheckpoint) bool {
	return len(c.Signature) == ed25519.SignatureSize &&
		ed25519.Verify(pub, checkpointMessage(c.Seq, c.Hash, c.Time), c.Signature)
}

// Checkpoint signs the current head of the chain, stores the checkpoint and
// writes it to the checkpoint file. If the head has not moved since the last
// checkpoint it returns that one and does nothing else. Before signing it
// checks that the chain still holds the records the last checkpoints signed,
// and fails with ErrDiverged if not.
func (l *Logger) Checkpoint(ctx context.Context) (store.AuditCheckpoint, error) {
	l.cpMu.Lock()
	defer l.cpMu.Unlock()

	if !l.lastLoaded {
		cps, err := l.st.ListAuditCheckpoints(ctx)
		if err != nil {
			return store.AuditCheckpoint{}, fmt.Errorf("audit: checkpoint: %w", err)
		}
		// A checkpoint this key did not sign is not trusted: whoever
		// wrote one at the head could otherwise stop every later
		// checkpoint as a no-op.
		for i := len(cps) - 1; i >= 0; i-- {
			if signedBy(l.pub, cps[i]) {
				l.last = cps[i]
				break
			}
		}
		l.lastLoaded = true
	}

	head, err := l.st.AuditHead(ctx)
	if err != nil {
		return store.AuditCheckpoint{}, fmt.Errorf("audit: checkpoint: %w", err)
	}
	if head.Seq == l.last.Seq && bytes.Equal(head.Hash, l.last.Hash) {
		return l.last, nil
	}

	anchors := []store.AuditCheckpoint{l.last}
	if l.file != "" {
		fc, err := ReadCheckpointFile(l.file)
		var pe *fs.PathError
		switch {
		case err == nil:
			if signedBy(l.pub, fc) {
				anchors = append(anchors, fc)
			}
		case errors.Is(err, fs.ErrNotExist):
		case errors.As(err, &pe):
			// The file may hold the only proof of a cut tail, so it is
			// not overwritten unread.
			return store.AuditCheckpoint{}, fmt.Errorf("audit: checkpoint: %w", err)
		default:
			// Malformed content proves nothing; the new checkpoint
			// replaces it.
		}
	}
	for _, a := range anchors {
		if err := l.holds(ctx, head, a); err != nil {
			return store.AuditCheckpoint{}, err
		}
	}

	c := store.AuditCheckpoint{
		Seq:   head.Seq,
		Hash:  head.Hash,
		Time:  l.now().Truncate(time.Microsecond).UTC(),
		KeyID: l.keyID,
	}
	c.Signature = ed25519.Sign(l.signKey, checkpointMessage(c.Seq, c.Hash, c.Time))
	// A conflict means another process sharing the store checkpointed the
	// same head first; its checkpoint states what ours would.
	if err := l.st.InsertAuditCheckpoint(ctx, c); err != nil && !errors.Is(err, store.ErrConflict) {
		return store.AuditCheckpoint{}, fmt.Errorf("audit: checkpoint: %w", err)
	}
	if l.file != "" {
		if err := l.replaceCheckpointFile(c); err != nil {
			return store.AuditCheckpoint{}, fmt.Errorf("audit: checkpoint: %w", err)
		}
	}
	l.last = c
	return c, nil
}

// holds checks that the chain ending at head still has the record a signed.
func (l *Logger) holds(ctx context.Context, head store.AuditHead, a store.AuditCheckpoint) error {
	switch {
	case a.Seq <= 0:
		return nil
	case head.Seq < a.Seq:
		return diverged("the chain ends at record %d but a checkpoint covers record %d", head.Seq, a.Seq)
	case head.Seq == a.Seq:
		if !bytes.Equal(head.Hash, a.Hash) {
			return diverged("record %d differs from its checkpoint", a.Seq)
		}
		return nil
	}
	recs, err := l.st.ListAudit(ctx, store.AuditFilter{AfterSeq: a.Seq - 1, Limit: 1})
	if err != nil {
		return fmt.Errorf("audit: checkpoint: %w", err)
	}
	if len(recs) == 0 || recs[0].Seq != a.Seq {
		return diverged("record %d is missing", a.Seq)
	}
	if !bytes.Equal(recs[0].Hash, a.Hash) {
		return diverged("record %d differs from its checkpoint", a.Seq)
	}
	return nil
}

func diverged(format string, args ...any) error {
	return fmt.Errorf("%w (%s); run muster audit verify", ErrDiverged, fmt.Sprintf(format, args...))
}

// Run checkpoints every CheckpointInterval until ctx ends, then takes a
// last checkpoint and returns nil. A failed checkpoint is retried at the
// next tick: the records it would have covered are still in the chain, and
// Verify reports whatever is wrong with them.
func (l *Logger) Run(ctx context.Context) error {
	t := time.NewTicker(l.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			// The final checkpoint must outlive the cancellation that
			// asked for it.
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalCheckpointTimeout)
			defer cancel()
			_, _ = l.Checkpoint(fctx)
			return nil
		case <-t.C:
			_, _ = l.Checkpoint(ctx)
		}
	}
}

// checkpointJSON is the checkpoint file's format.
type checkpointJSON struct {
	Seq       int64  `json:"seq"`
	Hash      string `json:"hash"`
	Time      string `json:"time"`
	KeyID     string `json:"key_id"`
	Signature string `json:"signature"`
}

// ReadCheckpointFile reads a checkpoint written by Checkpoint. It does not
// check the signature. A missing file is an error wrapping fs.ErrNotExist,
// and any other failure to read it wraps a *fs.PathError.
func ReadCheckpointFile(path string) (store.AuditCheckpoint, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return store.AuditCheckpoint{}, fmt.Errorf("audit: read checkpoint file: %w", err)
	}
	var j checkpointJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return store.AuditCheckpoint{}, fmt.Errorf("audit: checkpoint file %s: %w", path, err)
	}
	bad := func(what string, err error) (store.AuditCheckpoint, error) {
		if err != nil {
			return store.AuditCheckpoint{}, fmt.Errorf("audit: checkpoint file %s: %s: %w", path, what, err)
		}
		return store.AuditCheckpoint{}, fmt.Errorf("audit: checkpoint file %s: %s", path, what)
	}
	if j.Seq <= 0 {
		return bad("no seq", nil)
	}
	c := store.AuditCheckpoint{Seq: j.Seq, KeyID: j.KeyID}
	if c.Hash, err = hex.DecodeString(j.Hash); err != nil || len(c.Hash) == 0 {
		return bad("bad hash", err)
	}
	t, err := time.Parse(time.RFC3339Nano, j.Time)
	if err != nil {
		return bad("bad time", err)
	}
	c.Time = t.UTC()
	if c.Signature, err = base64.StdEncoding.DecodeString(j.Signature); err != nil || len(c.Signature) == 0 {
		return bad("bad signature encoding", err)
	}
	return c, nil
}

// replaceCheckpointFile writes c to the checkpoint file unless the file
// holds a newer checkpoint of this key, which another process on the
// directory signed since this one read the file (filelock.go).
func (l *Logger) replaceCheckpointFile(c store.AuditCheckpoint) error {
	release, err := lockedIf(l.lock)
	if err != nil {
		return err
	}
	defer release()
	if fc, err := ReadCheckpointFile(l.file); err == nil && fc.Seq > c.Seq && signedBy(l.pub, fc) {
		return nil
	}
	return writeCheckpointFile(l.file, c)
}

// writeCheckpointFile replaces path with c. The new file is written and
// synced under a temporary name in the same directory and renamed over the
// old one, so a crash leaves either checkpoint whole, never a torn file.
func writeCheckpointFile(path string, c store.AuditCheckpoint) error {
	data, err := json.MarshalIndent(checkpointJSON{
		Seq:       c.Seq,
		Hash:      hex.EncodeToString(c.Hash),
		Time:      c.Time.UTC().Format(time.RFC3339Nano),
		KeyID:     c.KeyID,
		Signature: base64.StdEncoding.EncodeToString(c.Signature),
	}, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')

	return atomicfile.Write(path, data, 0o600)
}

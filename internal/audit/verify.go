package audit

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// verifyPageSize is how many records Verify reads at a time.
const verifyPageSize = 1000

// Report is the outcome of Verify.
type Report struct {
	// OK is true when the chain and every checkpoint check out.
	OK bool
	// RecordsChecked and CheckpointsChecked count what passed.
	RecordsChecked     int64
	CheckpointsChecked int64
	// FirstBadSeq is the seq of the first record, or of the checkpoint,
	// found wrong; for a cut tail the first record missing. It is 0 when
	// all is well or the problem concerns no seq.
	FirstBadSeq int64
	// Problem says what is wrong, for an operator; empty when OK.
	Problem string
	// Head is the last record read.
	Head store.AuditHead
}

// anchor is a checkpoint and where Verify found it.
type anchor struct {
	store.AuditCheckpoint
	// file is the checkpoint file it came from, empty for the store.
	file string
}

func (a anchor) name() string {
	if a.file == "" {
		return "a checkpoint"
	}
	return "the checkpoint in " + a.file
}

// Verify walks the whole chain and every checkpoint, in the store and in the
// checkpoint file, and reports the first problem. It returns an error only
// when it cannot read them; tampering is reported in the Report.
func (l *Logger) Verify(ctx context.Context) (Report, error) {
	var (
		rep     Report
		anchors []anchor
	)
	fail := func(seq int64, format string, args ...any) (Report, error) {
		rep.FirstBadSeq = max(seq, 0)
		rep.Problem = fmt.Sprintf(format, args...)
		return rep, nil
	}

	// Checkpoints are read before the records: each covers a record that
	// was committed before it was signed, so the walk that follows reaches
	// every record they cover even while the chain grows.
	var fileAnchor []anchor
	if l.file != "" {
		c, err := ReadCheckpointFile(l.file)
		var pe *fs.PathError
		switch {
		case err == nil:
			fileAnchor = append(fileAnchor, anchor{c, l.file})
		case errors.Is(err, fs.ErrNotExist):
		case errors.As(err, &pe):
			return Report{}, fmt.Errorf("audit: verify: %w", err)
		default:
			return fail(0, "the checkpoint file %s is damaged (%v); compare it with a backup and find out who changed it", l.file, err)
		}
	}
	cps, err := l.st.ListAuditCheckpoints(ctx)
	if err != nil {
		return Report{}, fmt.Errorf("audit: verify: %w", err)
	}
	for _, c := range cps {
		anchors = append(anchors, anchor{AuditCheckpoint: c})
	}
	// At a seq both cover the store's checkpoint is checked first; the file
	// is the backstop for when the store's is gone.
	anchors = append(anchors, fileAnchor...)
	slices.SortStableFunc(anchors, func(a, b anchor) int { return cmp.Compare(a.Seq, b.Seq) })

	badSignature := func(a anchor) (Report, error) {
		why := ""
		if a.KeyID != l.keyID {
			why = fmt.Sprintf(" (it names key %q; this authority signs with %q)", a.KeyID, l.keyID)
		}
		if a.file == "" {
			return fail(a.Seq, "checkpoint at seq %d has a bad signature%s", a.Seq, why)
		}
		return fail(a.Seq, "the checkpoint in %s (seq %d) has a bad signature%s", a.file, a.Seq, why)
	}

	next := 0 // anchors[:next] are checked
	// No record has seq 0 or less, so nothing can confirm such a checkpoint
	// beyond its signature, which this logger never makes.
	for ; next < len(anchors) && anchors[next].Seq <= 0; next++ {
		if !signedBy(l.pub, anchors[next].AuditCheckpoint) {
			return badSignature(anchors[next])
		}
		rep.CheckpointsChecked++
	}

	var prev store.AuditRecord
	for {
		recs, err := l.st.ListAudit(ctx, store.AuditFilter{AfterSeq: prev.Seq, Limit: verifyPageSize})
		if err != nil {
			return Report{}, fmt.Errorf("audit: verify: %w", err)
		}
		if len(recs) == 0 {
			break
		}
		for _, r := range recs {
			rep.Head = store.AuditHead{Seq: r.Seq, Hash: r.Hash}
			want := prev.Seq + 1
			switch {
			case r.Seq < want:
				return fail(r.Seq, "record %d appears out of order after record %d; the store returned the chain out of sequence", r.Seq, prev.Seq)
			case r.Seq == want+1:
				return fail(want, "record %d is missing (removed)", want)
			case r.Seq > want:
				return fail(want, "records %d to %d are missing (removed)", want, r.Seq-1)
			case r.Seq == 1 && len(r.PrevHash) != 0:
				return fail(1, "record 1 does not start the chain: it links to an earlier record (records removed from the start, or inserted)")
			case !bytes.Equal(r.PrevHash, prev.Hash):
				return fail(r.Seq, "record %d does not link to record %d (inserted or reordered)", r.Seq, prev.Seq)
			case !hmac.Equal(r.Hash, ChainHash(l.chainKey, r)):
				return fail(r.Seq, "record %d was edited: its hash does not match its contents", r.Seq)
			}
			prev = r

			for ; next < len(anchors) && anchors[next].Seq == r.Seq; next++ {
				a := anchors[next]
				if !signedBy(l.pub, a.AuditCheckpoint) {
					return badSignature(a)
				}
				if !bytes.Equal(a.Hash, r.Hash) {
					where := ""
					if a.file != "" {
						where = " in " + a.file
					}
					return fail(r.Seq, "record %d differs from the checkpoint signed at %s%s",
						r.Seq, a.Time.UTC().Format(time.RFC3339), where)
				}
				rep.CheckpointsChecked++
			}
			rep.RecordsChecked++
		}
	}

	// What is left covers records past the end of the chain.
	if next < len(anchors) {
		a := anchors[next]
		if !signedBy(l.pub, a.AuditCheckpoint) {
			return badSignature(a)
		}
		if a.file != "" {
			// The files outside the store are ahead of it: a cut tail, or
			// a restore, which the authority's refusal to start names too.
			return fail(prev.Seq+1, "the chain ends at record %d but %s covers record %d: records removed from the tail; %s",
				prev.Seq, a.name(), a.Seq, l.restoredWayOut())
		}
		return fail(prev.Seq+1, "the chain ends at record %d but %s covers record %d (records removed from the tail)",
			prev.Seq, a.name(), a.Seq)
	}
	// The head file covers the newest records, appended since the last
	// checkpoint. It is read last: records appended during the walk are
	// looked up in the store, not missed.
	problem, firstBad, damaged, err := l.checkHead(ctx)
	if err != nil {
		return Report{}, fmt.Errorf("audit: verify: %w", err)
	}
	if damaged != nil {
		// The whole chain was walked: the file is wrong, and what it
		// alone covered (the records after the newest checkpoint)
		// cannot be told.
		w := walked{head: prev.Seq}
		if len(anchors) > 0 {
			w.checkpoint = anchors[len(anchors)-1].Seq
		}
		return fail(0, "%s", l.damagedHead(damaged, &w))
	}
	if problem != "" {
		return fail(firstBad, "%s; %s", problem, l.restoredWayOut())
	}
	rep.OK = true
	return rep, nil
}

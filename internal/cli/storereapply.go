package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/postgres"
)

// reapplyActor is the audit actor of what store reapply re-applies: no
// operator certificate vouches for it, the storage key does.
const reapplyActor = "muster store reapply"

// reapplyAction is the action of its records; each names the record of
// the store kept aside it re-applies. A restored chain's tail of these
// alone is still the restored store's head for another run.
const reapplyAction = "store.reapply"

func newStoreCmd(env *Env) *cobra.Command {
	cmd := &cobra.Command{Use: "store", Short: "Work on the authority's store itself: back it up, re-apply after a restore from a backup"}
	cmd.AddCommand(newStoreReapplyCmd(env))
	cmd.AddCommand(newStoreBackupCmd(env))
	return cmd
}

func newStoreReapplyCmd(env *Env) *cobra.Command {
	var (
		af                   adminFlags
		out                  output
		offline, apply       bool
		storeURL, configFile string
		fromURL              string
	)
	cmd := &cobra.Command{
		Use: "reapply --offline --from STORE [--apply]",
		Example: `  muster store reapply --offline --data /var/lib/muster/authority --from sqlite:///var/lib/muster/authority/muster.db.before-restore
  muster store reapply --offline --data /var/lib/muster/authority --from sqlite:///var/lib/muster/authority/muster.db.before-restore --apply
  muster store reapply --offline --data /var/lib/muster/authority --from 'postgres://muster@db.internal:5432/muster_before_restore' -o json`,
		Short: "Re-apply to a restored store the locks, deletions, token uses and agent identities its backup predates",
		Long: `A store restored from a backup lacks everything done since the backup:
locks, node deletions, token uses and deletions, the identities of
agents that renewed or joined since, and its audit records.
reapply reads them from the store the restore replaced (--from: the
muster.db.before-restore file, or the renamed PostgreSQL database), after
the restored store's newest record, and re-applies each to the restored
store as one conditional write with its own store.reapply record naming
the record it re-applies. It refuses, changing nothing, a --from store
whose chain does not hold the restored store's newest record: not the
store the backup was taken from. An agent's identity (its instance's
generation and last certificate, or a node joined since) is carried only
for a certificate chaining to an agent CA the restored store knows,
unexpired, and only where the restored store does not say otherwise
(node deleted, locked, or its ID held by another node): the rest it
lists, with why and the way out. An instance the store kept aside holds
deleted or superseded is written so, with the certificates it got
since: it renews no more, and the CRL names a deleted node's. A
bound-keypair token's join state (bound key, recovery sequence and count,
epoch) is carried with its agent's identity, only forward, with the
join-state keys made since: its agent refreshes with the key it holds
now, and a key it rotated away binds no more. One of a resync window
opened since the backup is listed, with the window as its way out. --apply
also marks closed the agent streams the restored store holds as
connected: the backup's, none live while reapply runs.

Without --apply it prints the plan and changes nothing. What the audit
cannot re-apply (a PSK rotation: the new PSK is in no record; operator
identities, signer and CA steps issued since) it lists with the command
to run. Run it with the authority stopped (every replica, on PostgreSQL:
it refuses while one serves, and none starts while it works), after
moving the audit files aside as the refused start says, before starting
it again. A backup taken before an upgrade is at the older schema: when
the store kept aside is at this muster's, the restored store is migrated
first, as the authority's start would, and it says so.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			if !offline {
				return errors.New("store reapply: it works on the store itself, from the data directory, with the authority stopped: give --offline")
			}
			if err := refuseAdminAPIFlags(cmd, "store reapply"); err != nil {
				return err
			}
			if fromURL == "" {
				return errors.New("store reapply: --from is required: the store the restore replaced, such as sqlite:///var/lib/muster/authority/muster.db.before-restore")
			}
			res, err := reapply(cmd.Context(), env, af.data, configFile, storeURL, fromURL, apply)
			if err != nil {
				return fmt.Errorf("store reapply: %w", err)
			}
			if out.json() {
				if err := out.write(env.Stdout, res); err != nil {
					return err
				}
			} else {
				res.print(env.Stdout)
			}
			if res.Failed != "" {
				return fmt.Errorf("store reapply: %s", res.Failed)
			}
			return nil
		},
	}
	af.register(cmd)
	cmd.Flags().BoolVar(&offline, "offline", false, "work on the store itself, from the data directory (required: there is no online reapply)")
	cmd.Flags().StringVar(&fromURL, "from", "", "the store the restore replaced: sqlite://PATH of muster.db.before-restore, or the renamed PostgreSQL database's URL")
	cmd.Flags().BoolVar(&apply, "apply", false, "write the plan to the restored store (without it, print the plan and change nothing)")
	cmd.Flags().StringVar(&storeURL, "store", "", "the restored store's URL (env MUSTER_STORE; default: "+storeDefaultHelp+")")
	cmd.Flags().StringVar(&configFile, "config", "", configHelp(""))
	out.register(cmd)
	return cmd
}

// reapplyResult is what store reapply prints: the plan, and with --apply
// what became of each step.
type reapplyResult struct {
	// Head is the restored store's newest record, which the store kept
	// aside holds too; FromHead is that store's newest.
	Head     int64 `json:"head"`
	FromHead int64 `json:"from_head"`
	Applied  bool  `json:"applied"`
	// Steps are the changes re-applied (or, without --apply, to be).
	Steps []reapplyStep `json:"steps"`
	// Manual are what the audit cannot re-apply, each with its command.
	Manual []manualStep `json:"manual"`
	// NotCarried are the identities of the store kept aside not carried
	// to the restored store, each with why and its way out.
	NotCarried []notCarried `json:"not_carried"`
	// Before is what --apply needs done first ("" for nothing).
	Before string `json:"before,omitempty"`
	// Failed is the step whose write failed, and why; the steps after it
	// were not tried.
	Failed string `json:"failed,omitempty"`
	// List is the command that lists every record the restore undid.
	List string `json:"list"`
	// StreamsClosed, with --apply, is how many stream rows of the
	// restored store marked connected were marked closed (record
	// StreamsSeq).
	StreamsClosed int64 `json:"streams_closed,omitempty"`
	StreamsSeq    int64 `json:"streams_seq,omitempty"`
}

// reapplyStep is one change: Seq and Action are the record of the store
// kept aside it re-applies (Seq 0: none names it), What the change.
type reapplyStep struct {
	Seq    int64  `json:"seq"`
	Action string `json:"action"`
	What   string `json:"what"`
	// Result, with --apply: "applied" (record ReapplySeq), "in place"
	// (the restored store holds it already: nothing written), "conflict"
	// (the restored store changed since the plan read it: nothing
	// written), or "failed".
	Result     string `json:"result,omitempty"`
	ReapplySeq int64  `json:"reapply_seq,omitempty"`

	target string
	write  func(ctx context.Context, st store.Store, build func(store.AuditHead) (store.AuditRecord, error)) error
	// inPlace, when set, says after a write refused as a conflict
	// whether the restored store holds what the step writes: a refusal
	// can also be a read gone stale, which leaves it undone.
	inPlace func(ctx context.Context, st store.Store) (bool, error)
}

// reapplyPlanned, when set (by tests), runs between the plan and its
// writes.
var reapplyPlanned func(ctx context.Context, st store.Store)

// manualStep is a record the audit alone cannot re-apply, and the
// command that does it.
type manualStep struct {
	Seqs    []int64 `json:"seqs"`
	Action  string  `json:"action"`
	What    string  `json:"what"`
	Command string  `json:"command"`
}

func (r *reapplyResult) print(w io.Writer) {
	fmt.Fprintf(w, "The restored store ends at record %d; the store kept aside holds it and goes on to record %d.\n", r.Head, r.FromHead)
	switch {
	case len(r.Steps) == 0:
		fmt.Fprintln(w, "Nothing to re-apply: every lock, node deletion, token use, token deletion and agent identity since is in the restored store.")
	case r.Applied:
		fmt.Fprintln(w, "Re-applied:")
	default:
		fmt.Fprintln(w, "To re-apply (nothing is changed without --apply):")
	}
	for _, s := range r.Steps {
		line := "  " + s.What + " (" + reapplyOrigin(s.Seq, s.Action) + ")"
		switch s.Result {
		case "applied":
			line += fmt.Sprintf(": done, record %d", s.ReapplySeq)
		case "":
		default:
			line += ": " + s.Result
		}
		fmt.Fprintln(w, line)
	}
	if len(r.Manual) > 0 {
		fmt.Fprintln(w, "Not in the audit, to do by hand:")
		for _, m := range r.Manual {
			fmt.Fprintf(w, "  %s (%s %s): %s\n", m.What, seqList(m.Seqs), m.Action, m.Command)
		}
	}
	printNotCarried(w, r.NotCarried)
	if r.StreamsClosed > 0 {
		streams := fmt.Sprintf("the %d agent streams", r.StreamsClosed)
		if r.StreamsClosed == 1 {
			streams = "the agent stream"
		}
		fmt.Fprintf(w, "Marked closed %s the restored store held as connected, from before the backup (record %d): agents list shows them disconnected until their agents connect again.\n", streams, r.StreamsSeq)
	}
	if r.Before != "" {
		fmt.Fprintln(w, "Before --apply: "+r.Before)
	}
	fmt.Fprintln(w, "Every record the restore undid: "+r.List)
}

func reapplyOrigin(seq int64, action string) string {
	if seq == 0 {
		return "no record since the backup names it"
	}
	return fmt.Sprintf("record %d, %s", seq, action)
}

func seqList(seqs []int64) string {
	s := make([]string, len(seqs))
	for i, q := range seqs {
		s[i] = fmt.Sprint(q)
	}
	if len(s) == 1 {
		return "record " + s[0]
	}
	return "records " + strings.Join(s, ", ")
}

// reapply opens the restored store (the data directory's) and the one
// kept aside (fromURL), plans, and with apply writes the plan.
func reapply(ctx context.Context, env *Env, data, configFile, storeURL, fromURL string, apply bool) (_ *reapplyResult, err error) {
	od, err := loadOfflineDir(env, data, configFile)
	if err != nil {
		return nil, err
	}
	d, err := loadDataDir(od.dir, od.storeURL(env, storeURL))
	if err != nil {
		return nil, err
	}
	ctx, fenced, release, err := keepAuthoritiesOut(ctx, od, d)
	if err != nil {
		return nil, err
	}
	defer release()
	defer func() {
		// The step it stopped at says only that it was cancelled.
		if lost := context.Cause(ctx); errors.Is(lost, postgres.ErrExclusionLost) {
			err = fmt.Errorf("the store %s: %w", storeURLWithoutPassword(d.url), lost)
		}
	}()
	// The store kept aside first, at this muster's schema (it refuses to
	// migrate it): the one the authorities used until the restore, so
	// they are of this version, or the command is not.
	from, fd, err := openOfflineStore(ctx, od, fromURL)
	if err != nil {
		return nil, fmt.Errorf("the store kept aside (--from): %w", err)
	}
	defer from.Close()
	if fd.url == d.url {
		return nil, fmt.Errorf("--from names the restored store itself (%s): give the store the restore replaced", storeURLWithoutPassword(d.url))
	}
	// A backup taken before the upgrade that migrated the store kept
	// aside is at an older schema: the authority's start would migrate
	// it, but a start appends records, after which nothing can be
	// re-applied. With every authority kept out, it is migrated here
	// first, and said so.
	var migrated time.Time
	d.migrating = func(from, to int) error {
		if from == 0 {
			return nil // no schema: CheckStore says what is wrong
		}
		migrated = time.Now()
		fmt.Fprintf(env.Stderr, "The restored store is at schema version %d, from before the upgrade to version %d, at which the store kept aside is: "+
			"migrating it first, as the authority's start would (nothing else is written without --apply)...\n", from, to)
		return nil
	}
	st, err := openLoadedOfflineStore(ctx, od, d)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	if !migrated.IsZero() {
		fmt.Fprintf(env.Stderr, "Migrated in %s.\n", time.Since(migrated).Round(time.Millisecond))
	}
	logger, err := newAuditLogger(st, d.sk, od.dir, od.configPath, nil)
	if err != nil {
		return nil, err
	}
	logger.SetRestoreDoc("it undid what this command re-applies: run it again once these files are moved aside")
	head, err := restoredHead(ctx, st)
	if err != nil {
		return nil, err
	}
	// Named without its password: in records, output and the commands
	// printed to paste (the driver reads it from PGPASSWORD or PGPASSFILE).
	fromName := storeURLWithoutPassword(fd.url)
	lost, fromHead, err := lostRecords(ctx, st, from, head, fromName, od)
	if err != nil {
		return nil, err
	}
	p := &reapplyPlanner{st: st, from: from, lost: lost, fromName: fromName, od: od}
	res := &reapplyResult{Head: head.Seq, FromHead: fromHead,
		List: fmt.Sprintf("muster audit list --offline --data %s%s --store %s --since %s", od.quoted(), od.configArg(),
			shellword.Quote(fromName), head.Time.UTC().Format(time.RFC3339))}
	if err := p.plan(ctx, res); err != nil {
		return nil, err
	}
	// A chain cut short is refused here as at the authority's start:
	// appending would reuse the removed records' numbers. The refusal
	// names the files to move aside first.
	if err := logger.CheckHead(ctx); err != nil {
		if !apply {
			res.Before = err.Error()
			return res, nil
		}
		return nil, err
	}
	if !apply {
		return res, nil
	}
	if reapplyPlanned != nil {
		reapplyPlanned(ctx, st)
	}
	again := fmt.Sprintf("muster store reapply --offline --data %s%s --from %s --apply", od.quoted(), od.configArg(), shellword.Quote(fromName))
	if storeURL != "" {
		again = fmt.Sprintf("muster store reapply --offline --data %s%s --store %s --from %s --apply", od.quoted(), od.configArg(),
			shellword.Quote(storeURLWithoutPassword(d.url)), shellword.Quote(fromName))
	}
	res.Applied = true
	for i := range res.Steps {
		s := &res.Steps[i]
		reason := fmt.Sprintf("re-applies %s of the store kept aside (%s), which the restore from a backup undid: %s",
			reapplyOrigin(s.Seq, s.Action), p.fromName, s.What)
		link, err := logger.Builder(audit.Event{Actor: reapplyActor, Action: reapplyAction, Target: s.target,
			Result: audit.ResultOK, Reason: reason})
		if err != nil {
			return nil, err
		}
		var rec store.AuditRecord
		build := func(h store.AuditHead) (store.AuditRecord, error) {
			r, err := link.Build(h)
			rec = r
			return r, err
		}
		// Checked right before each write: a lock lost since the watch's
		// last check lets no write through.
		if err := fenced(ctx); err != nil {
			return nil, err
		}
		err = s.write(ctx, st, build)
		switch {
		case errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound):
			// Made meanwhile (another run), or gone: nothing written. A
			// step that can tell says whether that is so, or a read the
			// plan made has gone stale, which a new plan reads afresh.
			if s.inPlace != nil {
				held, cerr := s.inPlace(ctx, st)
				if cerr != nil || !held {
					why := "the restored store changed since this run read it"
					if cerr != nil {
						why = cerr.Error()
					}
					s.Result = "conflict"
					res.Failed = fmt.Sprintf("%s: refused (%v), and %s, so it is not in place; nothing of it was written, and the steps after it were not tried: run it again to plan from what the store holds now: %s", s.What, err, why, again)
					return res, nil
				}
			}
			s.Result = "in place"
		case err != nil:
			s.Result = "failed"
			res.Failed = fmt.Sprintf("%s: %v; nothing of it was written, and the steps after it were not tried: run the command again: %s", s.What, err, again)
			return res, nil
		default:
			logger.Appended(link)
			s.Result, s.ReapplySeq = "applied", rec.Seq
		}
	}
	if err := closeRestoredStreams(ctx, st, logger, res); err != nil {
		return nil, err
	}
	return res, nil
}

// closeRestoredStreams marks closed the stream rows the restored store
// holds marked connected: the backup's, of streams that ended with the
// authorities it was taken from. Left, agents list and show would give
// each as connected via its old address until streamStaleAfter (2
// minutes) past its last heartbeat in the backup. None is live: no
// authority serves while reapply runs (keepAuthoritiesOut), and an agent
// that connects once one starts writes its row anew.
func closeRestoredStreams(ctx context.Context, st store.Store, logger *audit.Logger, res *reapplyResult) error {
	link, err := logger.Builder(audit.Event{Actor: reapplyActor, Action: reapplyAction, Target: "agent streams", Result: audit.ResultOK,
		Reason: "marks closed the agent streams the restored store holds as connected: the backup's, which ended with the authorities it was taken from (none serves while store reapply runs)"})
	if err != nil {
		return err
	}
	var rec store.AuditRecord
	n, err := st.CloseRestoredStreams(ctx, func(h store.AuditHead) (store.AuditRecord, error) {
		r, err := link.Build(h)
		rec = r
		return r, err
	})
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil // none marked connected: nothing written
	case err != nil:
		res.Failed = fmt.Sprintf("marking closed the agent streams the restored store holds as connected: %v; nothing of it was written: run the command again", err)
		return nil
	}
	logger.Appended(link)
	res.StreamsClosed, res.StreamsSeq = n, rec.Seq
	return nil
}

// keepAuthoritiesOut takes what an authority serving on d's store holds
// until release: the data directory's lock and, for SQLite, the database
// file's; for PostgreSQL, shared by every replica on the database, its
// serving lock, exclusively. So reapply refuses while one serves (its
// writes would race the authority's, and the authority's appends to the
// restored chain make it refuse anyway), and none starts while it works.
// ctx, derived from the one given, ends once the PostgreSQL lock is lost
// (postgres.ExcludeServingWatched): the work under it stops.
//
// fenced, called right before each write, returns an error once the lock
// is lost (on PostgreSQL it checks the lock's connection there and then).
func keepAuthoritiesOut(ctx context.Context, od offlineDir, d dataDir) (_ context.Context, fenced func(context.Context) error, release func(), err error) {
	stopFirst := func(err error) error {
		return fmt.Errorf("it works with the authority stopped: %w; stop it (systemctl stop muster-authority), then run this again", err)
	}
	unlock, err := lockAuthorityFiles(od.dir, d.url, datadir.HolderReapply)
	if err != nil {
		if (errors.Is(err, datadir.ErrLocked) || errors.Is(err, datadir.ErrStoreLocked)) && !datadir.HeldByCommand(err) {
			err = stopFirst(err)
		}
		return nil, nil, nil, err
	}
	if strings.HasPrefix(d.url, "sqlite://") {
		return ctx, func(ctx context.Context) error { return context.Cause(ctx) }, unlock, nil
	}
	ctx, check, releasePG, err := postgres.ExcludeServingChecked(ctx, d.url)
	switch {
	case errors.Is(err, postgres.ErrServing):
		unlock()
		return nil, nil, nil, fmt.Errorf("it works with every authority on the store %s stopped: %w; stop every replica (systemctl stop muster-authority on each, and discovery where it serves on this database), then run this again",
			storeURLWithoutPassword(d.url), err)
	case err != nil:
		unlock()
		return nil, nil, nil, fmt.Errorf("the store %s: %w", storeURLWithoutPassword(d.url), err)
	}
	return ctx, check, func() { releasePG(); unlock() }, nil
}

// restoredHead is the restored store's newest record, before any record
// an earlier reapply appended: the one the store kept aside must hold.
func restoredHead(ctx context.Context, st store.Store) (store.AuditRecord, error) {
	h, err := st.AuditHead(ctx)
	if err != nil {
		return store.AuditRecord{}, err
	}
	for seq := h.Seq; seq > 0; seq-- {
		r, err := recordAt(ctx, st, seq)
		if err != nil {
			return store.AuditRecord{}, err
		}
		if r.Action != reapplyAction {
			return r, nil
		}
	}
	return store.AuditRecord{}, errors.New("the restored store's audit chain is empty: it is not a store this authority ran on")
}

// recordAt reads record seq of st's chain.
func recordAt(ctx context.Context, st store.Store, seq int64) (store.AuditRecord, error) {
	rs, err := st.ListAudit(ctx, store.AuditFilter{AfterSeq: seq - 1, Limit: 1})
	if err != nil {
		return store.AuditRecord{}, err
	}
	if len(rs) == 0 || rs[0].Seq != seq {
		return store.AuditRecord{}, fmt.Errorf("record %d: %w", seq, store.ErrNotFound)
	}
	return rs[0], nil
}

// lostRecords returns the records of from after head, which from must
// hold (same seq, same hash), linked one to the next; and from's newest
// record's seq. st is the restored store, read only to say where the
// two chains parted when from does not hold head.
func lostRecords(ctx context.Context, st, from store.Store, head store.AuditRecord, fromName string, od offlineDir) ([]store.AuditRecord, int64, error) {
	const notIt = "it is not the store the backup was taken from, or records were appended to the restored store since the restore " +
		"(an authority started on it: re-apply before starting it), so nothing of it can be re-applied; nothing was changed. " +
		"Give --from the store that was in use when the restore replaced it, or redo what it holds by hand (docs/operator-guide.md, \"Backing up and restoring the SQLite store\")"
	r, err := recordAt(ctx, from, head.Seq)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, 0, fmt.Errorf("reading the store kept aside: %w", err)
	}
	if err != nil || !bytes.Equal(r.Hash, head.Hash) {
		why := notIt
		if fork, ok, ferr := earlierRestore(ctx, st, from, head.Seq); ferr != nil {
			return nil, 0, fmt.Errorf("reading the stores: %w", ferr)
		} else if ok {
			why = fork.why(fromName, od)
		}
		if err != nil {
			return nil, 0, fmt.Errorf("the store kept aside (%s) does not hold record %d, the restored store's newest: %s", fromName, head.Seq, why)
		}
		return nil, 0, fmt.Errorf("record %d of the store kept aside (%s) differs from the restored store's newest (%s %s at %s there, %s %s at %s here): the two chains parted before it: %s",
			head.Seq, fromName, r.Action, r.Target, r.Time.UTC().Format(time.RFC3339), head.Action, head.Target, head.Time.UTC().Format(time.RFC3339), why)
	}
	var lost []store.AuditRecord
	prev := r
	for {
		page, err := from.ListAudit(ctx, store.AuditFilter{AfterSeq: prev.Seq, Limit: 1000})
		if err != nil {
			return nil, 0, fmt.Errorf("reading the store kept aside: %w", err)
		}
		for _, rec := range page {
			if rec.Seq != prev.Seq+1 || !bytes.Equal(rec.PrevHash, prev.Hash) {
				return nil, 0, fmt.Errorf("the chain of the store kept aside (%s) breaks at record %d: walk it with muster audit verify --offline --data %s%s --store %s before re-applying from it; nothing was changed",
					fromName, rec.Seq, od.quoted(), od.configArg(), shellword.Quote(fromName))
			}
			lost, prev = append(lost, rec), rec
		}
		if len(page) < 1000 {
			return lost, prev.Seq, nil
		}
	}
}

// fork is where the store kept aside parted from the restored store's
// chain: it was itself restored from a backup that ended at record
// common (both chains hold it), and re-applied from record reapply on.
type fork struct {
	common, reapply store.AuditRecord
}

// earlierRestore looks for the fork of a backup restored twice: the
// store kept aside was restored by an earlier restore from a backup
// older than the one restored now (its first store.reapply record
// follows a record both chains hold, before the restored store's
// newest, seq head). The backup restored now was then taken on the chain
// that earlier restore replaced, which the store it kept aside holds;
// ok false if no such record is found.
func earlierRestore(ctx context.Context, st, from store.Store, head int64) (fork, bool, error) {
	var (
		found fork
		ok    bool
	)
	for after := int64(0); ; {
		page, err := from.ListAudit(ctx, store.AuditFilter{Action: reapplyAction, AfterSeq: after, Limit: 1000})
		if err != nil {
			return fork{}, false, err
		}
		for _, rec := range page {
			if rec.Seq-1 >= head {
				return found, ok, nil
			}
			prev, err := recordAt(ctx, from, rec.Seq-1)
			if err != nil {
				return fork{}, false, err
			}
			if prev.Action == reapplyAction {
				continue
			}
			mine, err := recordAt(ctx, st, prev.Seq)
			if err != nil {
				return fork{}, false, err
			}
			if bytes.Equal(mine.Hash, prev.Hash) {
				found, ok = fork{common: prev, reapply: rec}, true
			}
		}
		if len(page) < 1000 {
			return found, ok, nil
		}
		after = page[len(page)-1].Seq
	}
}

// why says what happened and the ways out: the chain the backup was
// taken on is in the store the earlier restore kept aside; what was done
// since the earlier restore is on no chain the backup continues.
func (f fork) why(fromName string, od offlineDir) string {
	since := f.reapply.Time.UTC().Format(time.RFC3339)
	return fmt.Sprintf("the store kept aside was itself restored from an older backup, which ended at record %d (record %d re-applies onto it, %s), "+
		"and the backup restored now was taken on the chain that earlier restore replaced, so nothing of the store kept aside can be re-applied onto it; nothing was changed. "+
		"What was done on that chain since this backup is in the store the earlier restore kept aside (its refused start named it after --from): give that store as --from. "+
		"What was done since the earlier restore (muster audit list --offline --data %s%s --store %s --since %s) cannot be re-applied onto this backup: redo it by hand, "+
		"or restore a backup taken since the earlier restore instead (muster audit list --offline --data %s%s --store %s --action store.backup --since %s lists them; "+
		"docs/operator-guide.md, \"Backing up and restoring the SQLite store\")",
		f.common.Seq, f.reapply.Seq, reapplyAction, od.quoted(), od.configArg(), shellword.Quote(fromName), since,
		od.quoted(), od.configArg(), shellword.Quote(fromName), since)
}

// reapplyPlanner compares the two stores, guided by the records lost.
type reapplyPlanner struct {
	st, from store.Store
	lost     []store.AuditRecord
	fromName string
	od       offlineDir
	// deleting are the nodes of the restored store planNodes deletes
	// again, by ID: their IDs are free for the node the store kept aside
	// holds under them, joined since.
	deleting map[string]time.Time
	// joinStates are the bound-keypair join states planned, by token
	// (joinState); epochs the restored store's epoch ordinals.
	joinStates map[string]joinStatePlan
	epochs     map[string]int64
}

// last is the newest lost record of action (ok) that match accepts.
func (p *reapplyPlanner) last(action string, match func(store.AuditRecord) bool) (store.AuditRecord, bool) {
	for i := len(p.lost) - 1; i >= 0; i-- {
		r := p.lost[i]
		if r.Action == action && r.Result == audit.ResultOK && match(r) {
			return r, true
		}
	}
	return store.AuditRecord{}, false
}

func (p *reapplyPlanner) plan(ctx context.Context, res *reapplyResult) error {
	res.Steps, res.Manual = []reapplyStep{}, []manualStep{}
	for _, f := range []func(context.Context, *reapplyResult) error{p.planLocks, p.planNodes, p.planTokens, p.planRetired, p.planCerts, p.planJoinStates, p.planManual} {
		if err := f(ctx, res); err != nil {
			return err
		}
	}
	return nil
}

// planLocks: a lock in force in the store kept aside that the restored
// store lacks was made since the backup (lock IDs are random) and not
// lifted; it is made again as it was, its ID, reason and end kept.
func (p *reapplyPlanner) planLocks(ctx context.Context, res *reapplyResult) error {
	have, err := p.st.ListLocks(ctx)
	if err != nil {
		return err
	}
	had, err := p.from.ListLocks(ctx)
	if err != nil {
		return fmt.Errorf("reading the locks of the store kept aside: %w", err)
	}
	ids := map[string]bool{}
	for _, l := range have {
		ids[l.ID] = true
	}
	for _, l := range had {
		if ids[l.ID] {
			continue
		}
		r, _ := p.last("lock.create", func(r store.AuditRecord) bool {
			return r.Target == l.Kind+":"+l.Target || r.Target == l.Kind+" "+l.Target
		})
		what := fmt.Sprintf("lock %s on %s %s", l.ID, l.Kind, l.Target)
		if !l.ExpiresAt.IsZero() {
			what += ", until " + l.ExpiresAt.UTC().Format(time.RFC3339)
		}
		res.Steps = append(res.Steps, reapplyStep{Seq: r.Seq, Action: "lock.create", What: what, target: l.Kind + ":" + l.Target,
			write: func(ctx context.Context, st store.Store, build func(store.AuditHead) (store.AuditRecord, error)) error {
				return st.InsertLock(ctx, l, build)
			}})
	}
	// A lock lifted since is in force again: it refuses what it refused
	// before the lift, so lifting it again is left to the operator.
	byID := map[string]bool{}
	for _, l := range had {
		byID[l.ID] = true
	}
	for _, l := range have {
		if byID[l.ID] {
			continue
		}
		if r, ok := p.last("lock.delete", func(r store.AuditRecord) bool { return r.Target == l.ID }); ok {
			res.Manual = append(res.Manual, manualStep{Seqs: []int64{r.Seq}, Action: r.Action,
				What:    fmt.Sprintf("lock %s on %s %s, lifted since, is in force again", l.ID, l.Kind, l.Target),
				Command: "muster lock delete " + shellword.Quote(l.ID)})
		}
	}
	return nil
}

// planNodes: a node deleted since that the restored store holds is
// deleted again: the node the restored store holds under the ID, by its
// creation (the first join, which a node keeps through its instances), so
// a node deleted and joined again under its ID since, there when the
// write comes, is another node and is left.
func (p *reapplyPlanner) planNodes(ctx context.Context, res *reapplyResult) error {
	done := map[string]bool{}
	var steps []reapplyStep
	for i := len(p.lost) - 1; i >= 0; i-- {
		r := p.lost[i]
		if r.Action != "agent.delete" || r.Result != audit.ResultOK || done[r.Target] {
			continue
		}
		done[r.Target] = true
		n, err := p.st.GetNode(ctx, r.Target)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		what := fmt.Sprintf("delete node %s, created %s, instance %s", n.ID, n.CreatedAt.UTC().Format(time.RFC3339), n.InstanceID)
		switch f, err := p.from.GetNode(ctx, n.ID); {
		case err == nil && f.CreatedAt.Equal(n.CreatedAt):
			continue // the store kept aside holds it still: the record deleted another
		case err == nil:
			what += " (the store kept aside holds another node joined under its ID since: its identity is carried after this deletion, unless listed as not carried)"
		case !errors.Is(err, store.ErrNotFound):
			return fmt.Errorf("reading the nodes of the store kept aside: %w", err)
		}
		id, created := n.ID, n.CreatedAt
		if p.deleting == nil {
			p.deleting = map[string]time.Time{}
		}
		p.deleting[id] = created
		steps = append(steps, reapplyStep{Seq: r.Seq, Action: r.Action, What: what, target: id,
			write: func(ctx context.Context, st store.Store, build func(store.AuditHead) (store.AuditRecord, error)) error {
				return st.DeleteNodeCreated(ctx, id, created, build)
			}})
	}
	slices.Reverse(steps)
	res.Steps = append(res.Steps, steps...)
	return nil
}

// planTokens: a token of the restored store that the store kept aside
// lacks (or holds as another token of its name) was deleted since, and is
// deleted; one the store kept aside counts more uses of was used since,
// and takes those uses again, so a single-use token spent since admits no
// one.
func (p *reapplyPlanner) planTokens(ctx context.Context, res *reapplyResult) error {
	have, err := p.st.ListTokens(ctx)
	if err != nil {
		return err
	}
	had, err := p.from.ListTokens(ctx)
	if err != nil {
		return fmt.Errorf("reading the tokens of the store kept aside: %w", err)
	}
	byID := map[string]store.Token{}
	for _, t := range had {
		byID[t.ID] = t
	}
	for _, t := range have {
		id := t.ID
		f, ok := byID[id]
		if !ok || !f.CreatedAt.Equal(t.CreatedAt) {
			r, _ := p.last("token.delete", func(r store.AuditRecord) bool { return r.Target == "token "+id })
			if c, ok := p.last("token.cleanup", func(r store.AuditRecord) bool { return slices.Contains(strings.Split(r.Target, ","), id) }); ok && c.Seq > r.Seq {
				r = c
			}
			what := "delete token " + id
			if ok {
				what += " (the store kept aside holds another token made under its name since)"
			}
			res.Steps = append(res.Steps, reapplyStep{Seq: r.Seq, Action: cmpOr(r.Action, "token.delete"), What: what, target: "token " + id,
				write: func(ctx context.Context, st store.Store, build func(store.AuditHead) (store.AuditRecord, error)) error {
					return st.DeleteToken(ctx, id, build)
				}})
			continue
		}
		if t.UsesAllowed > 0 && f.UsesCount > t.UsesCount {
			uses := f.UsesCount
			r, _ := p.last("agent.join", func(r store.AuditRecord) bool {
				return strings.Contains(r.Reason, "token "+id+",") || strings.Contains(r.Reason, "token "+id+" ")
			})
			res.Steps = append(res.Steps, reapplyStep{Seq: r.Seq, Action: "agent.join",
				What:   fmt.Sprintf("token %s: %d of its %d uses spent (the restored store counts %d)", id, min(uses, t.UsesAllowed), t.UsesAllowed, t.UsesCount),
				target: "token " + id,
				write: func(ctx context.Context, st store.Store, build func(store.AuditHead) (store.AuditRecord, error)) error {
					return st.RaiseTokenUses(ctx, id, uses, build)
				}})
		}
	}
	return nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// planManual lists what the records say was done that the audit alone
// cannot re-apply, each with the command that does it.
func (p *reapplyPlanner) planManual(ctx context.Context, res *reapplyResult) error {
	data := " --offline --data " + p.od.quoted() + p.od.configArg()
	seqs := map[string][]int64{}
	var order []string
	note := func(key string, seq int64) {
		if _, ok := seqs[key]; !ok {
			order = append(order, key)
		}
		seqs[key] = append(seqs[key], seq)
	}
	for _, r := range p.lost {
		if r.Result != audit.ResultOK {
			continue
		}
		switch a := r.Action; {
		case a == "psk.rotate":
			note("psk", r.Seq)
		case a == "operator.add" || a == "operator.renew":
			note("operator "+r.Target, r.Seq)
		case strings.HasPrefix(a, "signer.") || strings.HasPrefix(a, "node_task_signer."):
			note("signer", r.Seq)
		case strings.HasPrefix(a, "ca."):
			note("ca", r.Seq)
		case a == "setting.set":
			note("setting "+r.Target, r.Seq)
		case a == "agent.join" && strings.HasPrefix(r.Reason, "method "+store.JoinMethodBoundKeypair):
			note("bound-keypair", r.Seq)
		}
	}
	settings := map[string]string{}
	if ss, err := p.from.ListSettings(ctx); err == nil {
		for _, s := range ss {
			settings[s.Key] = s.Value
		}
	}
	for _, key := range order {
		m := manualStep{Seqs: seqs[key]}
		switch kind, name, _ := strings.Cut(key, " "); kind {
		case "psk":
			m.Action = "psk.rotate"
			m.What = "the bootstrap PSK rotated since is the backup's again (the new PSK is in no record): rotate it and hand out the PSK the rotation prints (it asks for --revoke-grace while an older one is in grace)"
			m.Command = "muster psk rotate --grace 0"
		case "operator":
			m.Action, m.What = "operator.add", "operator "+name+"'s identity issued since is unknown to the restored store"
			m.Command = "muster admin add " + shellword.Quote(name) + data + " --out " + shellword.Quote(name+"-new.pem")
		case "signer":
			m.Action, m.What = "signer.*", "task signer steps made since are undone: redo each step the records name (docs/signer-lifecycle.md), from what this lists"
			m.Command = "muster signer list"
		case "ca":
			m.Action, m.What = "ca.*", "CA steps made since are undone: redo each step the records name (docs/ca-lifecycle.md, \"Restore from backup\"), from what this shows"
			m.Command = "muster ca status"
		case "setting":
			m.Action, m.What = "setting.set", "setting "+name+" set since is the backup's again"
			m.Command = "muster settings list"
			if v, ok := settings[name]; ok {
				m.Command = "muster settings set " + shellword.Quote(name) + " " + shellword.Quote(v) + data
			}
		case "bound-keypair":
			m.Action, m.What = "agent.join", "bound-keypair agents joined or recovered since hold join states ahead of the restored store"
			m.Command = `muster bound-keypair resync open --for 24h --reason "restored the store from a backup"`
		}
		res.Manual = append(res.Manual, m)
	}
	return nil
}

package signer_test

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
	"github.com/muster-dev/muster/internal/task"
)

// modelSteps is the number of random steps per seed of TestFleetModel;
// MUSTER_MODEL_STEPS or -model.steps raise it.
var (
	modelSteps = flag.Int("model.steps", 0, "TestFleetModel: steps per seed (default 50, or MUSTER_MODEL_STEPS)")
	modelSeeds = flag.Int("model.seeds", 0, "TestFleetModel: seeds to run (default 3, or MUSTER_MODEL_SEEDS)")
)

func modelParam(flagValue int, env string, def int) int {
	if flagValue > 0 {
		return flagValue
	}
	if n, err := strconv.Atoi(os.Getenv(env)); err == nil && n > 0 {
		return n
	}
	return def
}

// modelClock is the store with a clock the model moves.
type modelClock struct {
	store.Store
	mu     sync.Mutex
	offset time.Duration
}

func (c *modelClock) Now(ctx context.Context) (time.Time, error) {
	now, err := c.Store.Now(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	return now.Add(c.offset), err
}

func (c *modelClock) step(d time.Duration) { c.mu.Lock(); c.offset += d; c.mu.Unlock() }

type discardAudit struct{}

func (discardAudit) Record(context.Context, audit.Event) (store.AuditRecord, error) {
	return store.AuditRecord{}, nil
}

// Builder builds e's record as the next link of the store's chain.
func (discardAudit) Builder(e audit.Event) (*audit.Link, error) {
	return audit.NewLink(e, func(h store.AuditHead) (store.AuditRecord, error) {
		return store.AuditRecord{Seq: h.Seq + 1, PrevHash: h.Hash, Hash: []byte(strconv.FormatInt(h.Seq+1, 10)), Time: time.Now(),
			Action: e.Action, Result: e.Result}, nil
	}), nil
}

func (discardAudit) Appended(*audit.Link) {}

// lateStore is the store of the model's second replica: armed, its next
// keep of a verifier set first runs before, a step through the first
// replica, as when another replica steps between this one's read of the
// signers and its write of their set.
type lateStore struct {
	signer.Store
	before func()
	// beforeStep, armed, runs before the replica's next step write: after
	// its read of the signers and its keep of their set.
	beforeStep func()
}

func (s *lateStore) ApplySignerChanges(ctx context.Context, expect store.SignerSetID, changes []store.SignerChange, audit func(store.AuditHead) (store.AuditRecord, error)) (int64, error) {
	if f := s.beforeStep; f != nil {
		s.beforeStep = nil
		f()
	}
	return s.Store.ApplySignerChanges(ctx, expect, changes, audit)
}

// stepAny takes one operator step through k other than not (stage,
// activate, retire, rollback), the first the rules allow, and names it;
// "" if none is allowed.
func stepAny(ctx context.Context, k *signer.Keeper, who signer.Actor, rng *rand.Rand, not string) string {
	steps := []string{"stage", "activate", "retire", "rollback"}
	rng.Shuffle(len(steps), func(i, j int) { steps[i], steps[j] = steps[j], steps[i] })
	if i := slices.Index(steps, not); i >= 0 {
		steps = append(slices.Delete(steps, i, i+1), not)
	}
	for _, name := range steps {
		var err error
		switch name {
		case "stage":
			_, err = k.Stage(ctx, who, 10*time.Minute+time.Duration(rng.IntN(30))*time.Minute, time.Duration(1+rng.IntN(120))*time.Minute)
		case "activate":
			_, err = k.Activate(ctx, who)
		case "retire":
			_, err = k.Retire(ctx, who)
		default:
			_, err = k.Rollback(ctx, who)
		}
		if err == nil {
			return name
		}
	}
	return ""
}

// backupTables are the tables a model backup keeps and its restore puts
// back: the signers and their sets.
var backupTables = []string{"signers", "signer_set", "verifier_sets"}

// backup copies the store file to path, as an operator's backup does.
func backup(t *testing.T, ctx context.Context, db *sql.DB, path string) {
	t.Helper()
	_ = os.Remove(path)
	if _, err := db.ExecContext(ctx, `VACUUM INTO ?`, path); err != nil {
		t.Fatal(err)
	}
}

// restoreBackup rolls the store's signers and sets back to the backup at
// path, in one transaction, under the running replicas (which keep what
// they read and cached): the version goes back, and the next steps reach
// the versions made since again, with other signers.
func restoreBackup(t *testing.T, ctx context.Context, db *sql.DB, path string) {
	t.Helper()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stmts := []string{`PRAGMA busy_timeout = 30000`, `ATTACH DATABASE '` + path + `' AS backup`, `BEGIN IMMEDIATE`}
	for _, tb := range backupTables {
		stmts = append(stmts, `DELETE FROM main.`+tb, `INSERT INTO main.`+tb+` SELECT * FROM backup.`+tb)
	}
	stmts = append(stmts, `COMMIT`, `DETACH DATABASE backup`)
	for _, q := range stmts {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatalf("restore: %s: %v", q, err)
		}
	}
}

func (s *lateStore) PutVerifierSet(ctx context.Context, id store.SignerSetID, raw []byte) error {
	if f := s.before; f != nil {
		s.before = nil
		f()
	}
	return s.Store.PutVerifierSet(ctx, id, raw)
}

// modelAgent is one agent of the fleet: its trust (the real acceptance
// code), whether it is connected, and whether it connected since the last
// check.
type modelAgent struct {
	trust     *signer.Trust
	online    bool
	connected bool
	// reached is what the last stranding check found reachable: the
	// agent's state and the set version it reached, so an agent whose
	// trust and the authority's set are unchanged is not replayed again.
	reached string
}

// TestFleetModel drives random sequences of stage, activate, retire,
// revoke, rollback and clock steps through the real signer lifecycle (the
// keeper on a real SQLite store) against a fleet of agents holding the
// real trust code (signer.Trust: Accept and AcceptChain, as the agent
// takes sets on its stream, at renewal and by trust refresh), some
// connected, some offline, some restarted from what they persisted; forced
// activations are often followed by a rollback, the cycle that used to
// lengthen the grace. After every step it checks: an active signer exists;
// no signer's grace is longer than the operator asked at stage, counted
// from its real activation; no connected agent, and no agent holding only
// the current set, trusts a revoked key; no agent trusts no key; every
// agent that connected since the last step verifies a task from the
// active signer; no agent holds a set it cannot leave (a copy of every
// agent, connected now, reaches the authority's current set).
//
// One step in ten restores the store from a backup under the two
// replicas: a step through the first is lost with the restore, the
// second reads the signers after it and plans a step, and before its
// write the store is rolled back and stepped back up to the version it
// read, on other signers; its step must be refused (on a store whose
// steps are conditional on the version alone, seed 2 shows one landing).
//
// CI runs 3 fixed seeds of 50 steps (a few seconds). For a longer run:
// MUSTER_MODEL_SEEDS=50 MUSTER_MODEL_STEPS=1000 go test -run TestFleetModel
// ./internal/signer/ (or -model.seeds / -model.steps); a failure names its
// seed and step.
func TestFleetModel(t *testing.T) {
	seeds := modelParam(*modelSeeds, "MUSTER_MODEL_SEEDS", 3)
	steps := modelParam(*modelSteps, "MUSTER_MODEL_STEPS", 50)
	for seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { runModel(t, uint64(seed), steps) })
	}
}

func runModel(t *testing.T, seed uint64, steps int) {
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(seed, 20))
	path := filepath.Join(t.TempDir(), "muster.db")
	st, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	clock := &modelClock{Store: st}
	custody, _ := signer.NewSealed(seal.StorageKey{9})
	const minLead = 10 * time.Minute
	k := signer.NewKeeper(clock, custody, discardAudit{}, "prod-a3f2e1", minLead)
	// k2 is a second replica on the same store (and clock), whose keep of
	// a set the model makes late: another step lands first.
	late := &lateStore{Store: clock}
	k2 := signer.NewKeeper(late, custody, discardAudit{}, "prod-a3f2e1", minLead)
	keepers := []*signer.Keeper{k, k2}
	who := signer.Actor{Name: "model"}
	if _, err := k.EnsureFirst(ctx, who); err != nil {
		t.Fatal(err)
	}
	now := func() time.Time { n, _ := clock.Now(ctx); return n }

	// connect is an agent's stream opening, or a renewal: the current set,
	// and when that does not take, the chain from the set it holds.
	connect := func(tr *signer.Trust) error {
		raw, err := k.VerifierSet(ctx)
		if err != nil {
			t.Fatal(err)
		}
		err = tr.Accept(raw, now())
		if err == nil || errors.Is(err, signer.ErrSetStale) {
			return nil
		}
		// A chain cut at MaxChain is asked for again from where it
		// stopped, as the agent does (catchUp).
		for {
			have := tr.Version()
			chain, cerr := k.Chain(ctx, have)
			if cerr != nil {
				t.Fatal(cerr)
			}
			if err := tr.AcceptChain(chain, now()); err != nil {
				return err
			}
			if len(chain) < signer.MaxChain || tr.Version() <= have {
				break
			}
		}
		if err := tr.Accept(raw, now()); err != nil && !errors.Is(err, signer.ErrSetStale) {
			return err
		}
		return nil
	}

	agents := make([]*modelAgent, 6)
	for i := range agents {
		tr, _ := signer.NewTrust(nil, nil)
		raw, err := k.VerifierSet(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Accept(raw, now()); err != nil {
			t.Fatal(err)
		}
		agents[i] = &modelAgent{trust: tr, online: i%2 == 0, connected: true}
	}

	// rotate hands the rotate task of a stage, or of a rollback that
	// re-issues it, to the connected agents once they hold the step's set,
	// as the stream does: dated as the authority dates it, signed by the
	// active signer, validated by the real rule, its key added as staged.
	// A connected agent must take it: one that refuses it learns the
	// signer only from the set, and counts a verification failure.
	rotate := func(res signer.Result) error {
		var staged signer.Signer
		for _, c := range res.Changes {
			if c.To.State == signer.Staged {
				staged = c.To
			}
		}
		if staged.VersionID == "" {
			return nil
		}
		id, sign, err := k.ActiveSigner(ctx)
		if err != nil {
			t.Fatal(err)
		}
		issued := signer.RolloutIssuedAt(res.At, now())
		env := task.Envelope{TaskID: uuid.NewString(), TaskType: task.TypeRotateSigningKey, Target: task.Target{All: true},
			Params:   task.RotateParams(staged.VersionID, staged.PublicKey, staged.EffectiveAt, staged.GraceUntil),
			IssuedAt: issued, ExpiresAt: staged.EffectiveAt, SignerVersionID: id}
		raw, err := env.Sign(sign)
		if err != nil {
			t.Fatal(err)
		}
		for i, a := range agents {
			if !a.online {
				continue
			}
			v := &task.Verifier{NodeID: "n1", Keys: a.trust, Window: task.NewWindow(nil), Now: now}
			got, err := v.Verify(raw)
			if err != nil {
				return fmt.Errorf("agent %d refuses the rotate task of %s: %w", i, staged.VersionID, err)
			}
			key, err := task.ValidateRotate(got, a.trust, a.trust.MinLeadTime(), now())
			if err != nil {
				return fmt.Errorf("agent %d refuses the rotate task of %s: %w", i, staged.VersionID, err)
			}
			_ = a.trust.AddStaged(key)
		}
		return nil
	}

	// asked is the grace each staged version was asked for; graces the
	// signers the model saw enter grace, with the bound of their grace.
	asked := map[string]time.Duration{}
	graces := map[string]time.Time{}
	var history []string
	fail := func(step int, format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d step %d (%v): %s", seed, step, history, fmt.Sprintf(format, args...))
	}
	for step := range steps {
		snap, err := k.Load(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var rollouts []signer.Result
		var op string
		var res signer.Result
		stage := func(k *signer.Keeper) (signer.Result, error) {
			eff := minLead + time.Duration(rng.IntN(30))*time.Minute
			grace := time.Duration(1+rng.IntN(120)) * time.Minute
			res, err := k.Stage(ctx, who, eff, grace)
			if err == nil {
				for _, c := range res.Changes {
					asked[c.To.VersionID] = grace
				}
				rollouts = append(rollouts, res)
			}
			return res, err
		}
		// A step is taken, one time in three, by the late replica:
		// between its read of the signers after the step and its keep of
		// their set, the first replica stages a signer, activates the
		// staged one (a stage's set is then never kept by the replica
		// that staged) or the clock moves a step. The late replica's set
		// is then of a version gone; it must keep and serve the current
		// one, and agents that held the set before its step must still
		// reach the current one.
		by, lateOp := k, ""
		var lateErr error
		superseded := false
		restoring := rng.IntN(10) == 0
		if !restoring && rng.IntN(3) == 0 {
			by = k2
			late.before = func() {
				var err error
				n := 3
				if op == "stage" {
					// Not the clock: the stage's rotate task goes out
					// at once, dated by the step.
					n = 2
				}
				switch rng.IntN(n) {
				case 0:
					lateOp = "stage"
					_, err = stage(k)
				case 1:
					lateOp = "activate"
					if _, err = k.Activate(ctx, who); err == nil {
						// The stage's rotate task would be signed by
						// the signer it stages, now active: agents
						// learn it from the sets alone.
						superseded = true
					}
				default:
					d := time.Duration(rng.IntN(90)) * time.Minute
					lateOp = "clock +" + d.String()
					clock.step(d)
					_, err = k.Tick(ctx, signer.Actor{Name: "clock"})
				}
				if err != nil && !signer.IsRule(err) {
					lateErr = err
				}
			}
		}
		switch r := rng.IntN(100); {
		case restoring:
			// A restore from a backup under two running replicas: the
			// backup is taken, the first replica steps (lost with the
			// restore), the late one reads the signers after that step
			// and plans one of its own; before its write the store is
			// restored and the first replica steps back up to the
			// version the late one read, on other signers. The late
			// replica's step must be refused (its read is of signers
			// the store no longer holds), whatever it is.
			bak := filepath.Join(t.TempDir(), "backup.db")
			backup(t, ctx, db, bak)
			lost := stepAny(ctx, k, who, rng, "")
			if lost == "" {
				fail(step, "restore: no step possible after the backup")
			}
			lostID, err := st.SignerSetID(ctx)
			if err != nil {
				t.Fatal(err)
			}
			restored := false
			var again string
			restore := func() {
				restored = true
				restoreBackup(t, ctx, db, bak)
				// The SQLite store clock counts milliseconds: the step
				// back up is stamped after the lost one, as any step a
				// restore later is.
				for {
					if n, err := st.Now(ctx); err != nil || n.After(time.UnixMicro(lostID.SteppedAt)) {
						break
					}
					time.Sleep(time.Millisecond)
				}
				again = stepAny(ctx, k, who, rng, lost)
				if again == "stage" {
					// Its rotate task goes out with the step's set.
					res, _ := k.Load(ctx)
					for _, sg := range res.Signers {
						if sg.State == signer.Staged {
							asked[sg.VersionID] = sg.GraceLength()
						}
					}
				}
			}
			late.beforeStep = func() {
				if restored {
					return
				}
				restore()
			}
			var lateName string
			switch snap, _ := k2.Load(ctx); rng.IntN(4) {
			case 0:
				lateName = "activate"
				_, err = k2.Activate(ctx, who)
			case 1:
				lateName = "retire"
				_, err = k2.Retire(ctx, who)
			case 2:
				lateName = "rollback"
				_, err = k2.Rollback(ctx, who)
			default:
				s := snap.Signers[rng.IntN(len(snap.Signers))]
				lateName = "revoke " + s.VersionID + "(" + string(s.State) + ")"
				_, err = k2.Revoke(ctx, who, s.VersionID)
			}
			late.beforeStep = nil
			wrote := restored
			if !restored {
				restore()
			}
			op = fmt.Sprintf("restore [%s lost, %s again] with the late replica's %s", lost, again, lateName)
			switch {
			case wrote && !errors.Is(err, store.ErrConflict):
				fail(step, "%s: the late replica's step from its read before the restore: %v, want a conflict", op, err)
			case wrote:
				err = nil
			}
		case r < 15:
			op = "stage"
			res, err = stage(by)
		case r < 23:
			op = "activate"
			res, err = by.Activate(ctx, who)
			if err == nil && by == k && rng.IntN(2) == 0 {
				// A forced activation and its rollback, a minute or
				// two later: the rollout is re-issued.
				failf := func(format string, args ...any) { fail(step, "after activate: "+format, args...) }
				check(t, ctx, k, agents, now(), connect, failf)
				checkGrace(t, ctx, k, asked, graces, now(), failf)
				op = "activate+rollback"
				clock.step(time.Duration(rng.IntN(3)) * time.Minute)
				res, err = k.Rollback(ctx, who)
				if err == nil {
					rollouts = append(rollouts, res)
				}
			}
		case r < 29:
			op = "retire"
			res, err = by.Retire(ctx, who)
		case r < 39:
			if len(snap.Signers) == 0 {
				continue
			}
			s := snap.Signers[rng.IntN(len(snap.Signers))]
			op = "revoke " + s.VersionID + "(" + string(s.State) + ")"
			res, err = by.Revoke(ctx, who, s.VersionID)
		case r < 47:
			op = "rollback"
			res, err = k.Rollback(ctx, who)
			if err == nil {
				rollouts = append(rollouts, res)
			}
		case r < 65:
			d := time.Duration(rng.IntN(90)) * time.Minute
			op = "clock +" + d.String()
			clock.step(d)
			res, err = by.Tick(ctx, signer.Actor{Name: "clock"})
		case r < 80:
			a := agents[rng.IntN(len(agents))]
			a.online = !a.online
			op = fmt.Sprintf("agent online=%v", a.online)
		default:
			// Restart: the agent rebuilds its trust from what it
			// persisted.
			a := agents[rng.IntN(len(agents))]
			tr, err := signer.NewTrust(a.trust.Raw(), a.trust.Pending())
			if err != nil {
				fail(step, "restart: %v", err)
			}
			a.trust = tr
			op = "agent restart"
		}
		if err != nil && !signer.IsRule(err) {
			fail(step, "%s: %v", op, err)
		}
		if err != nil {
			op += " refused"
		}
		if by == k2 {
			op += " by the late replica"
			if lateOp != "" {
				op += " [" + lateOp + " first]"
			}
		}
		if lateErr != nil {
			fail(step, "%s: %s: %v", op, lateOp, lateErr)
		}
		if superseded {
			rollouts = nil
		}
		// A stage the late replica took may be activated by the step
		// that came first (a clock step, or a forced activation): its
		// rotate task is then not handed out (it would be dated after
		// its signer's effective time, or signed by that signer), and
		// agents learn the signer from the sets alone.
		if by == k2 && lateOp != "" {
			now, _ := k.Load(ctx)
			rollouts = slices.DeleteFunc(rollouts, func(r signer.Result) bool {
				for _, c := range r.Changes {
					if c.To.State == signer.Staged {
						for _, s := range now.Signers {
							if s.VersionID == c.To.VersionID {
								return s.State != signer.Staged
							}
						}
					}
				}
				return false
			})
		}
		late.before = nil
		history = append(history, op)
		if len(history) > 12 {
			history = history[1:]
		}
		_ = res

		// Connected agents get the new set on their stream.
		for _, a := range agents {
			a.connected = false
			if a.online {
				if err := connect(a.trust); err != nil {
					fail(step, "a connected agent cannot take the set: %v", err)
				}
				a.connected = true
			}
		}
		for _, r := range rollouts {
			if err := rotate(r); err != nil {
				fail(step, "%v", err)
			}
		}
		failf := func(format string, args ...any) { fail(step, format, args...) }
		check(t, ctx, k, agents, now(), connect, failf)
		checkGrace(t, ctx, k, asked, graces, now(), failf)
		checkKept(t, ctx, db, st, keepers, failf)
	}
}

// checkKept checks the kept verifier sets against the store: none is kept
// above the store's version (read from the file directly, as
// VerifierSets lists none there whatever is kept), and every replica
// serves the set kept for the current version, which names every live
// signer of the store in its state and no key the store does not hold so.
func checkKept(t *testing.T, ctx context.Context, db *sql.DB, st store.Store, keepers []*signer.Keeper, fail func(string, ...any)) {
	t.Helper()
	var above int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM verifier_sets WHERE version > (SELECT version FROM signer_set WHERE id = 1)`).Scan(&above); err != nil {
		t.Fatal(err)
	}
	if above != 0 {
		fail("%d verifier sets kept above the store's version", above)
	}
	snap, err := keepers[0].Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	v := snap.Version()
	kept, err := st.VerifierSets(ctx, v-1, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keepers {
		served, sv, err := k.SignedVerifierSet(ctx, -1)
		if err != nil {
			t.Fatal(err)
		}
		if sv != v || len(kept) != 1 || string(served) != string(kept[0].Raw) {
			fail("replica %d serves version %d, the store is at %d, and %d sets are kept there; want the one kept", i, sv, v, len(kept))
		}
	}
	set, err := signer.ParseVerifierSet(kept[0].Raw)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]signer.State{}
	for _, s := range snap.Signers {
		states[s.VersionID] = s.State
		if key, ok := set.Key(s.VersionID); s.State.Trusted() && (!ok || key.State != s.State) {
			fail("the set of version %d has %s %s (listed %v), the store %s", v, s.VersionID, key.State, ok, s.State)
		}
	}
	for _, key := range set.Keys {
		if states[key.VersionID] != key.State {
			fail("the set of version %d has %s %s, the store %q", v, key.VersionID, key.State, states[key.VersionID])
		}
	}
}

// checkGrace checks that no grace is longer than asked: every signer's
// grace length (GraceUntil - EffectiveAt, re-issued by a rollback) is at
// most what its stage asked, and a signer that entered grace since the
// last check retires at most that long after now, the activation that put
// it there.
func checkGrace(t *testing.T, ctx context.Context, k *signer.Keeper, asked map[string]time.Duration, graces map[string]time.Time, now time.Time, fail func(string, ...any)) {
	t.Helper()
	snap, err := k.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	active, _ := signer.ActiveOf(snap.Signers)
	for _, s := range snap.Signers {
		if want, ok := asked[s.VersionID]; ok && s.State != signer.Retired && s.State != signer.Revoked && s.GraceLength() > want {
			fail("%s (%s) has a grace of %v, asked %v", s.VersionID, s.State, s.GraceLength(), want)
		}
		if s.State != signer.Grace {
			delete(graces, s.VersionID)
			continue
		}
		if _, seen := graces[s.VersionID]; !seen {
			want, ok := asked[active.VersionID]
			if !ok || active.Previous != s.VersionID {
				fail("%s entered grace, but the active %s (asked %v) does not replace it", s.VersionID, active.VersionID, want)
			}
			graces[s.VersionID] = now.Add(want)
		}
		if s.RetiresAt.After(graces[s.VersionID]) {
			fail("%s in grace until %v, past its activation's %v", s.VersionID, s.RetiresAt, graces[s.VersionID])
		}
	}
}

func check(t *testing.T, ctx context.Context, k *signer.Keeper, agents []*modelAgent, now time.Time, connect func(*signer.Trust) error, fail func(string, ...any)) {
	t.Helper()
	snap, err := k.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	active, ok := signer.ActiveOf(snap.Signers)
	if !ok {
		fail("no active signer")
	}
	id, sign, err := k.ActiveSigner(ctx)
	if err != nil {
		t.Fatal(err)
	}
	env := task.Envelope{TaskID: uuid.NewString(), TaskType: task.TypeReport, Target: task.Target{All: true},
		Params: map[string]string{}, IssuedAt: now, ExpiresAt: now.Add(time.Minute), SignerVersionID: id}
	raw, err := env.Sign(sign)
	if err != nil {
		t.Fatal(err)
	}
	// An agent holding just the current set (one that joins now) trusts
	// the active signer and no revoked key.
	cur, err := k.VerifierSet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fresh, _ := signer.NewTrust(nil, nil)
	if err := fresh.Accept(cur, now); err != nil {
		fail("the current set: %v", err)
	}
	if _, _, ok := fresh.Verifier(active.VersionID, now); !ok {
		fail("the current set does not trust the active signer %s", active.VersionID)
	}
	for _, s := range snap.Signers {
		if _, _, ok := fresh.Verifier(s.VersionID, now); ok && s.State == signer.Revoked {
			fail("the current set trusts revoked %s", s.VersionID)
		}
	}
	for i, a := range agents {
		if len(a.trust.Accepted(now)) == 0 {
			fail("agent %d (set %d, online %v) trusts no key", i, a.trust.Version(), a.online)
		}
		if a.online {
			for _, s := range snap.Signers {
				if s.State != signer.Revoked {
					continue
				}
				if _, _, ok := a.trust.Verifier(s.VersionID, now); ok {
					fail("connected agent %d trusts revoked %s", i, s.VersionID)
				}
			}
		}
		if a.connected {
			v := &task.Verifier{NodeID: "n1", Keys: a.trust, Window: task.NewWindow(nil), Now: func() time.Time { return now }}
			if _, err := v.Verify(raw); err != nil {
				fail("agent %d (set %d) refuses a task from the active signer %s: %v", i, a.trust.Version(), active.VersionID, err)
			}
		}
		// Every agent, offline ones too, can still reach the current set.
		memo := fmt.Sprintf("%d/%d/%d/%d", a.trust.Version(), len(a.trust.Pending()), snap.Version(), now.Unix())
		if a.reached == memo {
			continue
		}
		a.reached = memo
		cp, err := signer.NewTrust(a.trust.Raw(), a.trust.Pending())
		if err != nil {
			fail("agent %d: %v", i, err)
		}
		if err := connect(cp); err != nil || cp.Version() != snap.Version() {
			fail("agent %d holding set %d is stranded: reached %d of %d: %v", i, a.trust.Version(), cp.Version(), snap.Version(), err)
		}
	}
}

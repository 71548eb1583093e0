package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/store"
)

// tokenDeleteOfflineActor is the audit actor of the bulk deletion: no
// operator certificate vouches for it, the storage key does.
const tokenDeleteOfflineActor = "muster token delete --offline"

// bulkTokenDelete is token delete's way out of a restore whose replaced
// store is lost: with nothing to tell which tokens were spent since the
// backup, every one with uses left made before the backup is deleted.
type bulkTokenDelete struct {
	withUsesLeft  bool
	createdBefore string
	offline       bool
	apply         bool
	storeURL      string
	configFile    string
}

func (b *bulkTokenDelete) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.BoolVar(&b.withUsesLeft, "with-uses-left", false, "delete every join token with uses left created before --created-before (with --offline: after a restore from a backup)")
	f.StringVar(&b.createdBefore, "created-before", "", "with --with-uses-left: the time the backup was taken, RFC 3339, or a duration ago such as 36h")
	f.BoolVar(&b.offline, "offline", false, "with --with-uses-left: work on the store itself, from the data directory (required)")
	f.BoolVar(&b.apply, "apply", false, "with --with-uses-left: delete them (without it, list them and change nothing)")
	f.StringVar(&b.storeURL, "store", "", "with --offline: the authority's store URL (env MUSTER_STORE; default: "+storeDefaultHelp+")")
	f.StringVar(&b.configFile, "config", "", configHelp("with --offline: "))
}

// refuseAlone refuses the bulk flags given without --with-uses-left: they
// would be silently ignored.
func (b *bulkTokenDelete) refuseAlone(cmd *cobra.Command) error {
	for _, f := range []string{"created-before", "offline", "apply", "store", "config"} {
		if cmd.Flags().Changed(f) {
			return fmt.Errorf("token delete: --%s goes with --with-uses-left", f)
		}
	}
	return nil
}

// tokenDeletedJSON is one token the bulk deletion deleted (or would).
type tokenDeletedJSON struct {
	ID          string    `json:"id"`
	CreatedAt   time.Time `json:"created_at"`
	UsesAllowed int64     `json:"uses_allowed"`
	UsesCount   int64     `json:"uses_count"`
	Deleted     bool      `json:"deleted"`
}

func (b *bulkTokenDelete) run(cmd *cobra.Command, env *Env, af *adminFlags, out output) error {
	if !b.offline {
		return errors.New("token delete --with-uses-left: it works on the store itself, from the data directory: give --offline")
	}
	if err := refuseAdminAPIFlags(cmd, "token delete"); err != nil {
		return err
	}
	if b.createdBefore == "" {
		return errors.New("token delete --with-uses-left: --created-before is required: the time the restored backup was taken (its tokens made since are not in the store)")
	}
	before, err := parseSince(b.createdBefore, time.Now())
	if err != nil {
		return fmt.Errorf("token delete: --created-before %q: give an RFC 3339 time or a duration such as 36h", b.createdBefore)
	}
	toks, err := deleteTokensWithUsesLeft(cmd.Context(), env, af.data, b.configFile, b.storeURL, before, b.apply)
	if err != nil {
		return fmt.Errorf("token delete: %w", err)
	}
	if out.json() {
		return out.write(env.Stdout, toks)
	}
	verb := "Would delete"
	if b.apply {
		verb = "Deleted"
	}
	for _, t := range toks {
		state := fmt.Sprintf("%d of %d uses spent", t.UsesCount, t.UsesAllowed)
		if t.UsesAllowed == 0 {
			state = "unlimited uses"
		}
		what := verb
		if b.apply && !t.Deleted {
			what = "Gone already:"
		}
		fmt.Fprintf(env.Stdout, "%s token %s (created %s, %s)\n", what, t.ID, t.CreatedAt.UTC().Format(time.RFC3339), state)
	}
	switch {
	case len(toks) == 0:
		fmt.Fprintf(env.Stdout, "No join token with uses left was created before %s\n", before.UTC().Format(time.RFC3339))
	case !b.apply:
		fmt.Fprintln(env.Stdout, "Nothing is changed without --apply")
	}
	return nil
}

// deleteTokensWithUsesLeft lists, and with apply deletes, each with its
// token.delete record, the join tokens (not bound-keypair: a resync window
// lets their agents back, and deleting them locks every agent out) of the
// data directory's store created before before that have uses left and
// have not expired by the store clock.
func deleteTokensWithUsesLeft(ctx context.Context, env *Env, data, configFile, storeURL string, before time.Time, apply bool) ([]tokenDeletedJSON, error) {
	st, d, od, err := openOfflineDirStore(ctx, env, data, configFile, storeURL)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	now, err := st.Now(ctx)
	if err != nil {
		return nil, err
	}
	all, err := st.ListTokens(ctx)
	if err != nil {
		return nil, err
	}
	toks := []tokenDeletedJSON{}
	for _, t := range all {
		if t.JoinMethod != store.JoinMethodToken || !t.CreatedAt.Before(before) ||
			(t.UsesAllowed > 0 && t.UsesCount >= t.UsesAllowed) || (!t.ExpiresAt.IsZero() && !t.ExpiresAt.After(now)) {
			continue
		}
		toks = append(toks, tokenDeletedJSON{ID: t.ID, CreatedAt: t.CreatedAt, UsesAllowed: t.UsesAllowed, UsesCount: t.UsesCount})
	}
	if !apply || len(toks) == 0 {
		return toks, nil
	}
	logger, err := newAuditLogger(st, d.sk, od.dir, od.configPath, nil)
	if err != nil {
		return nil, err
	}
	// A chain cut short is refused here as at the authority's start:
	// appending would reuse the removed records' numbers.
	if err := logger.CheckHead(ctx); err != nil {
		return nil, err
	}
	for i := range toks {
		t := &toks[i]
		link, err := logger.Builder(audit.Event{Actor: tokenDeleteOfflineActor, Action: "token.delete", Target: "token " + t.ID, Result: audit.ResultOK,
			Reason: fmt.Sprintf("--with-uses-left --created-before %s: %d of %d uses spent by the store's count, which a restore from a backup taken after its creation may have undone",
				before.UTC().Format(time.RFC3339), t.UsesCount, t.UsesAllowed)})
		if err != nil {
			return nil, err
		}
		err = st.DeleteToken(ctx, t.ID, link.Build)
		switch {
		case errors.Is(err, store.ErrNotFound):
			continue // deleted meanwhile
		case err != nil:
			return nil, fmt.Errorf("token %s not deleted (nor those after it; the ones before are): %w", t.ID, err)
		}
		logger.Appended(link)
		t.Deleted = true
	}
	return toks, nil
}

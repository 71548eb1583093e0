package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/authority"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/store"
)

// sharedOf returns the shared settings o runs with.
func sharedOf(o *authorityOptions) authority.SharedSettings {
	return authority.SharedSettings{SignerMinLeadTime: o.signerMinLead, CAIntermediateTTL: o.caIntermediateTTL,
		CADraftTTL: o.caDraftTTL, JWTKeyRotationPeriod: o.jwtKeyPeriod}
}

// setShared makes o run with s.
func setShared(o *authorityOptions, s authority.SharedSettings) {
	o.signerMinLead, o.caIntermediateTTL, o.caDraftTTL, o.jwtKeyPeriod = s.SignerMinLeadTime, s.CAIntermediateTTL, s.CADraftTTL, s.JWTKeyRotationPeriod
}

// sharedActor is who records a replica's value of a shared setting the
// store held none of.
const sharedActor = "authority"

// sharedMismatch is a shared setting given in a replica's settings with
// another value than the store's.
type sharedMismatch struct {
	key, from    string
	mine, stored time.Duration
	// row is the store's row as read, which an adopting write replaces.
	row store.Setting
}

// where names where m's own value comes from: the flag, or the settings
// file configPath.
func (m sharedMismatch) where(configPath string) string {
	if m.from != "" {
		return m.from
	}
	return configPath
}

// chainLinks builds the audit records that store writes carry into
// their own transaction, and hears of those committed (audit.Logger).
type chainLinks interface {
	Builder(e audit.Event) (*audit.Link, error)
	Appended(link *audit.Link)
}

// putAudited writes s from the row from (store.SettingStore.PutSetting)
// with e's record in the same transaction: the setting changes with its
// record, or neither is written and the error says why.
func putAudited(ctx context.Context, st store.SettingStore, links chainLinks, s store.Setting, from store.Setting, e audit.Event) (store.Setting, error) {
	link, err := links.Builder(e)
	if err != nil {
		return store.Setting{}, err
	}
	row, err := st.PutSetting(ctx, s, from, link.Build)
	if err != nil {
		return store.Setting{}, err
	}
	links.Appended(link)
	return row, nil
}

// adoptShared makes m's own value the store's, on a store one authority
// uses at a time: one conditional write from the version read, audited
// as setting.set by the authority and logged as a warning, since it
// changes a value someone may have set with muster settings set. A
// write in between (muster settings set --offline beside this start)
// makes the start fail, to be tried again against the new value.
func adoptShared(ctx context.Context, st store.SettingStore, m sharedMismatch, configPath string, links chainLinks, log *slog.Logger) error {
	from := m.where(configPath)
	_, err := putAudited(ctx, st, links, store.Setting{Key: m.key, Value: m.mine.String(), UpdatedBy: sharedActor}, m.row,
		audit.Event{Actor: sharedActor, Action: "setting.set", Target: m.key, Result: audit.ResultOK,
			Reason: fmt.Sprintf("%s was %s in the store, now %s from %s: one authority uses this store, and its settings change the store's", m.key, m.stored, m.mine, from)})
	if errors.Is(err, store.ErrConflict) {
		return fmt.Errorf("%s changed in the store while this authority started (written offline beside it): start it again, "+
			"and it takes %s from %s again: %w", m.key, m.mine, from, err)
	}
	if err != nil {
		return fmt.Errorf("recording %s %s from %s in the store with its audit record (neither is written): %w", m.key, m.mine, from, err)
	}
	log.Warn("shared setting changed in the store to this authority's value: one authority uses this store (SQLite), so its settings file or flag changes the store's",
		"key", m.key, "was", m.stored.String(), "now", m.mine.String(), "from", from)
	return nil
}

// reconcileShared makes o's shared settings the store's, before the
// authority starts (docs/high-availability.md, "Settings kept in the
// store"). For each one:
//
//   - the store holds no value: this replica records its own (given or
//     default) in one conditional write, audited as setting.set; of
//     replicas starting together one writes, and the others take its
//     value as if it had been there;
//   - the store holds one and o leaves the setting to its default: o
//     takes the store's;
//   - the store holds one and o gives another, on a store several
//     replicas share (PostgreSQL): the authority refuses to start,
//     naming both values and the ways out. Taking either value silently
//     could weaken what the operator set: a longer signer.min_lead_time
//     or a shorter ca.intermediate_ttl in this file would not be in
//     force, and nothing would say so but a log line;
//   - the same on a store one authority uses at a time (SQLite): o's
//     value replaces the store's, in one conditional write from the
//     version read, audited as setting.set and logged as a warning.
//     There is no other replica to disagree with, and editing
//     authority.yaml and restarting is how a single authority's
//     settings change.
//
// A stored value this muster cannot read (a newer muster's, or a hand
// edit) is logged, and o keeps its own: the others read it as theirs.
func reconcileShared(ctx context.Context, st store.SettingStore, o *authorityOptions, links chainLinks, log *slog.Logger) error {
	mine := sharedOf(o)
	next := mine
	all, err := st.ListSettings(ctx)
	if err != nil {
		return err
	}
	held := map[string]store.Setting{}
	for _, h := range all {
		held[h.Key] = h
	}
	// Every held value is checked before anything is written: a refused
	// start records nothing.
	var bad, adopt []sharedMismatch
	take := func(key string, h store.Setting) {
		want := mine.Get(key)
		stored, err := authority.ParseSharedSetting(key, h.Value)
		switch {
		case err != nil:
			log.Error("the store holds a shared setting this muster cannot read; this replica uses its own value: set one with `muster settings set KEY VALUE`",
				"key", key, "err", err, "value", want.String())
		case stored == want:
		case hasKey(o.sharedGiven, key) && !st.Replicated():
			adopt = append(adopt, sharedMismatch{key: key, from: o.sharedGiven[key], mine: want, stored: stored, row: h})
		case hasKey(o.sharedGiven, key):
			bad = append(bad, sharedMismatch{key: key, from: o.sharedGiven[key], mine: want, stored: stored})
		default:
			log.Info("shared setting: using the store's value, which every replica uses (this replica's settings leave it to its default)",
				"key", key, "value", stored.String(), "default", want.String())
			next.Set(key, stored)
		}
	}
	for _, key := range authority.SharedSettingKeys() {
		if h, ok := held[key]; ok {
			take(key, h)
		}
	}
	if len(bad) > 0 {
		return sharedMismatchError(bad, o.configPath, o.dir)
	}
	for _, key := range authority.SharedSettingKeys() {
		if _, ok := held[key]; ok {
			continue
		}
		want := mine.Get(key)
		_, err := putAudited(ctx, st, links, store.Setting{Key: key, Value: want.String(), UpdatedBy: sharedActor}, store.Setting{},
			audit.Event{Actor: sharedActor, Action: "setting.set", Target: key, Result: audit.ResultOK,
				Reason: fmt.Sprintf("%s recorded as %s from this replica's settings: the store held no value, and every replica uses this one from now on", key, want)})
		switch {
		case err == nil:
			log.Info("shared setting recorded in the store from this replica's settings", "key", key, "value", want.String())
		case errors.Is(err, store.ErrConflict):
			// Another replica recorded it first: its value is the
			// store's, as if it had been there.
			h, ok, err := heldSetting(ctx, st, key)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("recording %s in the store: %w", key, store.ErrConflict)
			}
			take(key, h)
		default:
			return fmt.Errorf("recording %s %s in the store with its audit record (neither is written): %w", key, want, err)
		}
	}
	if len(bad) > 0 {
		return sharedMismatchError(bad, o.configPath, o.dir)
	}
	for _, m := range adopt {
		if err := adoptShared(ctx, st, m, o.configPath, links, log); err != nil {
			return err
		}
	}
	setShared(o, next)
	return nil
}

func hasKey(m map[string]string, k string) bool {
	_, ok := m[k]
	return ok
}

// heldSetting returns the store's row of key, and whether it holds one.
func heldSetting(ctx context.Context, st store.SettingStore, key string) (store.Setting, bool, error) {
	all, err := st.ListSettings(ctx)
	if err != nil {
		return store.Setting{}, false, err
	}
	for _, h := range all {
		if h.Key == key {
			return h, true, nil
		}
	}
	return store.Setting{}, false, nil
}

// sharedMismatchError names each setting given with another value than
// the store's, and the ways out: the replica's own value changed or left
// out, or the store's changed for every replica, through a running
// replica or, with none running, offline from the data directory dir
// and the settings file configPath (named with --config unless it is
// dir's own authority.yaml, which the offline command reads by default).
func sharedMismatchError(bad []sharedMismatch, configPath, dir string) error {
	var b strings.Builder
	for i, m := range bad {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s is %s in %s but %s in the store, whose value every replica uses: "+
			"make it %s there or leave it out, or change it for every replica with `muster settings set %s %s` "+
			"(through a running replica) or `muster settings set %s %s --offline --data %s%s` (with none running)",
			m.key, m.mine, m.where(configPath), m.stored, m.stored, m.key, m.mine, m.key, m.mine, shellword.Quote(dir), datadir.Dir(dir).ConfigArg(configPath))
	}
	b.WriteString(" (docs/high-availability.md, \"Settings kept in the store\")")
	return errors.New(b.String())
}

// offlineShared is a shared setting as an offline command (one that
// opens the store itself, while no authority may run) reads it from its
// flag or authority.yaml: its value, whether it was given, and from
// which flag ("": the file), which a refusal names as the place to change.
type offlineShared struct {
	key   string
	value time.Duration
	given bool
	flag  string
}

// fromStore returns s's value in force: the store's, which every replica
// uses, when it holds one, else the file's. A value the file gives other
// than the store's is refused, as at an authority's start, with the same
// ways out. It writes nothing.
func (s offlineShared) fromStore(ctx context.Context, st store.SettingStore, configPath, dir string) (time.Duration, error) {
	h, ok, err := heldSetting(ctx, st, s.key)
	if err != nil || !ok {
		return s.value, err
	}
	stored, err := authority.ParseSharedSetting(s.key, h.Value)
	if err != nil {
		return s.value, nil // as at start: this muster's own value holds
	}
	if s.given && stored != s.value {
		return 0, sharedMismatchError([]sharedMismatch{{key: s.key, from: s.flag, mine: s.value, stored: stored}}, configPath, dir)
	}
	return stored, nil
}

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
//   - the store holds one and o gives another: the authority refuses to
//     start, naming both values and both ways out. Taking either value
//     silently could weaken what the operator set: a longer
//     signer.min_lead_time or a shorter ca.intermediate_ttl in this file
//     would not be in force, and nothing would say so but a log line.
//
// A stored value this muster cannot read (a newer muster's, or a hand
// edit) is logged, and o keeps its own: the others read it as theirs.
func reconcileShared(ctx context.Context, st store.SettingStore, o *authorityOptions, record func(audit.Event), log *slog.Logger) error {
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
	var bad []sharedMismatch
	take := func(key string, h store.Setting) {
		want := mine.Get(key)
		stored, err := authority.ParseSharedSetting(key, h.Value)
		switch {
		case err != nil:
			log.Error("the store holds a shared setting this muster cannot read; this replica uses its own value: set one with `muster settings set KEY VALUE`",
				"key", key, "err", err, "value", want.String())
		case stored == want:
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
		return sharedMismatchError(bad, o.configPath)
	}
	for _, key := range authority.SharedSettingKeys() {
		if _, ok := held[key]; ok {
			continue
		}
		want := mine.Get(key)
		_, err := st.PutSetting(ctx, store.Setting{Key: key, Value: want.String(), UpdatedBy: sharedActor}, 0)
		switch {
		case err == nil:
			record(audit.Event{Actor: sharedActor, Action: "setting.set", Target: key, Result: audit.ResultOK,
				Reason: fmt.Sprintf("%s recorded as %s from this replica's settings: the store held no value, and every replica uses this one from now on", key, want)})
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
			return err
		}
	}
	if len(bad) > 0 {
		return sharedMismatchError(bad, o.configPath)
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
// the store's, and the two ways out.
func sharedMismatchError(bad []sharedMismatch, configPath string) error {
	var b strings.Builder
	for i, m := range bad {
		if i > 0 {
			b.WriteString("; ")
		}
		from := m.from
		if from == "" {
			from = configPath
		}
		fmt.Fprintf(&b, "%s is %s in %s but %s in the store, whose value every replica uses: "+
			"make it %s there or leave it out, or change it for every replica with `muster settings set %s %s`",
			m.key, m.mine, from, m.stored, m.stored, m.key, m.mine)
	}
	b.WriteString(" (docs/high-availability.md, \"Settings kept in the store\")")
	return errors.New(b.String())
}

// offlineShared is a shared setting as an offline command (one that
// opens the store itself, while no authority may run) reads it from
// authority.yaml: its value, and whether the file gave it.
type offlineShared struct {
	key   string
	value time.Duration
	given bool
}

// fromStore returns s's value in force: the store's, which every replica
// uses, when it holds one, else the file's. A value the file gives other
// than the store's is refused, as at an authority's start, with the same
// ways out. It writes nothing.
func (s offlineShared) fromStore(ctx context.Context, st store.SettingStore, configPath string) (time.Duration, error) {
	h, ok, err := heldSetting(ctx, st, s.key)
	if err != nil || !ok {
		return s.value, err
	}
	stored, err := authority.ParseSharedSetting(s.key, h.Value)
	if err != nil {
		return s.value, nil // as at start: this muster's own value holds
	}
	if s.given && stored != s.value {
		return 0, sharedMismatchError([]sharedMismatch{{key: s.key, mine: s.value, stored: stored}}, configPath)
	}
	return stored, nil
}

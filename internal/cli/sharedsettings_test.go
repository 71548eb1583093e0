package cli

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/authority"
	"github.com/muster-dev/muster/internal/store"
)

// settingsFake is a store.SettingStore holding rows by key. lost, when
// set, is a row another replica writes just before this one's first
// write, which then conflicts. replicated is what Replicated reports:
// PostgreSQL's true, SQLite's false.
type settingsFake struct {
	rows       map[string]store.Setting
	lost       *store.Setting
	writes     int
	replicated bool
}

func (f *settingsFake) Replicated() bool { return f.replicated }

func (f *settingsFake) ListSettings(context.Context) ([]store.Setting, error) {
	var out []store.Setting
	for _, k := range authority.SharedSettingKeys() {
		if r, ok := f.rows[k]; ok {
			out = append(out, r)
		}
	}
	return out, nil
}

// PutSetting builds the write's audit record, as a store does in the
// write's transaction: a record that cannot be built writes nothing.
func (f *settingsFake) PutSetting(_ context.Context, s store.Setting, from store.Setting, build func(store.AuditHead) (store.AuditRecord, error)) (store.Setting, error) {
	if f.lost != nil && f.lost.Key == s.Key {
		f.rows[s.Key], f.lost = *f.lost, nil
	}
	if cur := f.rows[s.Key]; cur.Version != from.Version || (from.Version != 0 && !cur.UpdatedAt.Equal(from.UpdatedAt)) {
		return store.Setting{}, store.ErrConflict
	}
	if build == nil {
		return store.Setting{}, errors.New("no audit record")
	}
	if _, err := build(store.AuditHead{}); err != nil {
		return store.Setting{}, err
	}
	f.writes++
	s.Version = from.Version + 1
	f.rows[s.Key] = s
	return s, nil
}

// linksFake is a chainLinks whose records are the events it was given,
// heard once appended; fail, when set, fails every record's build.
type linksFake struct {
	events []audit.Event
	fail   error
}

func (l *linksFake) Builder(e audit.Event) (*audit.Link, error) {
	return audit.NewLink(e, func(h store.AuditHead) (store.AuditRecord, error) {
		if l.fail != nil {
			return store.AuditRecord{}, l.fail
		}
		return store.AuditRecord{Seq: h.Seq + 1, Action: e.Action}, nil
	}), nil
}

func (l *linksFake) Appended(k *audit.Link) { l.events = append(l.events, k.Event()) }

// TestReconcileShared: at start, a store without a value records the
// replica's (given or default), one holding a value gives it to a replica
// that leaves the key out, and one holding another value than the
// replica's settings give refuses the start on a replicated store
// (PostgreSQL), naming both values, where the replica's comes from, and
// the ways out (online and offline, the data directory quoted), and
// writes nothing; on SQLite, where one authority uses the store, the
// given value replaces the store's in one conditional write, audited
// with both values and where the new one comes from, and warned of.
func TestReconcileShared(t *testing.T) {
	held := func(kv ...string) map[string]store.Setting {
		m := map[string]store.Setting{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = store.Setting{Key: kv[i], Value: kv[i+1], Version: 3, UpdatedBy: "admin"}
		}
		return m
	}
	tests := []struct {
		name   string
		held   map[string]store.Setting
		lost   *store.Setting
		lead   time.Duration
		given  map[string]string
		sqlite bool                     // the store is not replicated
		want   authority.SharedSettings // zero fields: the defaults
		writes int
		err    []string
		log    string
		// reason is what the audit record of the adopted value says
		// (the others say "recorded as").
		reason []string
	}{
		{name: "an empty store records the defaults", held: held(), writes: 4},
		{name: "an empty store records a given value", held: held(), lead: 2 * time.Minute, given: map[string]string{"signer.min_lead_time": ""},
			want: authority.SharedSettings{SignerMinLeadTime: 2 * time.Minute}, writes: 4},
		{name: "a key left out takes the store's value", held: held("signer.min_lead_time", "2m0s", "ca.intermediate_ttl", "4380h0m0s"),
			want: authority.SharedSettings{SignerMinLeadTime: 2 * time.Minute, CAIntermediateTTL: 4380 * time.Hour}, writes: 2,
			log: "using the store's value"},
		{name: "a given value equal to the store's", held: held("signer.min_lead_time", "2m0s"), lead: 2 * time.Minute,
			given: map[string]string{"signer.min_lead_time": ""}, want: authority.SharedSettings{SignerMinLeadTime: 2 * time.Minute}, writes: 3},
		{name: "a given value other than the store's refuses", held: held("signer.min_lead_time", "2m0s"), lead: 5 * time.Minute,
			given: map[string]string{"signer.min_lead_time": ""},
			err: []string{"signer.min_lead_time is 5m0s in /etc/muster/authority.yaml but 2m0s in the store", "make it 2m0s there or leave it out",
				"`muster settings set signer.min_lead_time 5m0s` (through a running replica)",
				"`muster settings set signer.min_lead_time 5m0s --offline --data '/var/lib/muster data' --config /etc/muster/authority.yaml` (with none running)", "Settings kept in the store"}},
		{name: "SQLite: a given value other than the store's replaces it", sqlite: true,
			held: held("signer.min_lead_time", "2m0s", "ca.intermediate_ttl", "4380h0m0s"), lead: 5 * time.Minute,
			given: map[string]string{"signer.min_lead_time": ""},
			want:  authority.SharedSettings{SignerMinLeadTime: 5 * time.Minute, CAIntermediateTTL: 4380 * time.Hour}, writes: 3,
			log:    "level=WARN msg=\"shared setting changed in the store to this authority's value",
			reason: []string{"signer.min_lead_time was 2m0s in the store, now 5m0s from /etc/muster/authority.yaml"}},
		{name: "SQLite: a differing flag replaces it, named as the flag", sqlite: true, held: held("ca.intermediate_ttl", "4380h0m0s"),
			given:  map[string]string{"ca.intermediate_ttl": "--ca-intermediate-ttl (or MUSTER_CA_INTERMEDIATE_TTL)"},
			writes: 4, log: "level=WARN",
			reason: []string{"ca.intermediate_ttl was 4380h0m0s in the store, now 8760h0m0s from --ca-intermediate-ttl (or MUSTER_CA_INTERMEDIATE_TTL)"}},
		{name: "SQLite: a value left out still takes the store's", sqlite: true, held: held("signer.min_lead_time", "2m0s"),
			want: authority.SharedSettings{SignerMinLeadTime: 2 * time.Minute}, writes: 3, log: "using the store's value"},
		{name: "SQLite: a write in between (settings set --offline) fails the start", sqlite: true, held: held("signer.min_lead_time", "2m0s"),
			lead: 5 * time.Minute, given: map[string]string{"signer.min_lead_time": ""},
			lost:   &store.Setting{Key: "signer.min_lead_time", Value: "7m0s", Version: 4},
			writes: 3, err: []string{"signer.min_lead_time changed in the store while this authority started", "start it again"}},
		{name: "a differing flag is named as the flag", held: held("ca.intermediate_ttl", "4380h0m0s"),
			given: map[string]string{"ca.intermediate_ttl": "--ca-intermediate-ttl (or MUSTER_CA_INTERMEDIATE_TTL)"},
			err:   []string{"ca.intermediate_ttl is 8760h0m0s in --ca-intermediate-ttl (or MUSTER_CA_INTERMEDIATE_TTL) but 4380h0m0s in the store"}},
		{name: "another replica records first: its value holds", held: held(), lost: &store.Setting{Key: "signer.min_lead_time", Value: "3m0s", Version: 1},
			want: authority.SharedSettings{SignerMinLeadTime: 3 * time.Minute}, writes: 3, log: "using the store's value"},
		{name: "another replica records another value first than one given: refuses", held: held(), lead: 5 * time.Minute,
			given: map[string]string{"signer.min_lead_time": ""}, lost: &store.Setting{Key: "signer.min_lead_time", Value: "3m0s", Version: 1},
			// The race is found at the write, after the keys before it
			// in order were recorded (agreeing with nothing held).
			writes: 3,
			err:    []string{"signer.min_lead_time is 5m0s in /etc/muster/authority.yaml but 3m0s in the store"}},
		{name: "a stored value this muster cannot read keeps the replica's", held: held("signer.min_lead_time", "banana"), writes: 3,
			log: "cannot read"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &settingsFake{rows: tt.held, lost: tt.lost, replicated: !tt.sqlite}
			o := &authorityOptions{signerMinLead: tt.lead, sharedGiven: tt.given, configPath: "/etc/muster/authority.yaml", dir: "/var/lib/muster data"}
			var logs bytes.Buffer
			links := &linksFake{}
			err := reconcileShared(t.Context(), f, o, links, slog.New(slog.NewTextHandler(&logs, nil)))
			events := links.events
			if tt.err != nil {
				if err == nil {
					t.Fatalf("no error; want one saying %q", tt.err)
				}
				for _, w := range tt.err {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %q", err, w)
					}
				}
				if o.signerMinLead != tt.lead {
					t.Errorf("a refused start changed the options: lead %s", o.signerMinLead)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if tt.err == nil {
				want := tt.want
				for _, k := range authority.SharedSettingKeys() {
					if got := sharedOf(o).Get(k); got != want.Get(k) {
						t.Errorf("%s in force: %s, want %s", k, got, want.Get(k))
					}
				}
			}
			if f.writes != tt.writes || len(events) != tt.writes {
				t.Errorf("%d writes, %d audited; want %d each", f.writes, len(events), tt.writes)
			}
			adopted := 0
			for _, e := range events {
				if e.Action != "setting.set" || e.Actor != "authority" || e.Result != audit.ResultOK {
					t.Errorf("audit event %+v", e)
				}
				if strings.Contains(e.Reason, "recorded as") {
					continue
				}
				adopted++
				for _, w := range tt.reason {
					if !strings.Contains(e.Reason, w) {
						t.Errorf("audit reason %q does not say %q", e.Reason, w)
					}
				}
			}
			if want := min(len(tt.reason), 1); adopted != want {
				t.Errorf("%d values replaced in the store, audited; want %d", adopted, want)
			}
			if !strings.Contains(logs.String(), tt.log) {
				t.Errorf("log does not say %q:\n%s", tt.log, logs.String())
			}
		})
	}
}

// TestReconcileSharedUnaudited: a shared setting the start would record
// or change in the store, but whose audit record cannot be written, is
// not written: the start fails, naming the setting and the cause. Before,
// the value was written and its record's failure dropped.
func TestReconcileSharedUnaudited(t *testing.T) {
	for _, tt := range []struct {
		name string
		held map[string]store.Setting
		want string
	}{
		{"a value recorded", map[string]store.Setting{}, "recording ca.draft_ttl"},
		{"a value adopted (SQLite)", map[string]store.Setting{
			"ca.draft_ttl":                 {Key: "ca.draft_ttl", Value: authority.DefaultCADraftTTL.String(), Version: 1},
			"ca.intermediate_ttl":          {Key: "ca.intermediate_ttl", Value: "8760h0m0s", Version: 1},
			"jwt_svid.key_rotation_period": {Key: "jwt_svid.key_rotation_period", Value: authority.DefaultJWTKeyRotationPeriod.String(), Version: 1},
			"signer.min_lead_time":         {Key: "signer.min_lead_time", Value: "2m0s", Version: 1},
		}, "recording signer.min_lead_time 5m0s from /etc/muster/authority.yaml"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := &settingsFake{rows: tt.held}
			o := &authorityOptions{signerMinLead: 5 * time.Minute, sharedGiven: map[string]string{"signer.min_lead_time": ""},
				configPath: "/etc/muster/authority.yaml", dir: "/d"}
			links := &linksFake{fail: errors.New("disk on fire")}
			err := reconcileShared(t.Context(), f, o, links, slog.New(slog.DiscardHandler))
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "disk on fire") {
				t.Fatalf("reconcileShared = %v; want an error saying %q and the cause", err, tt.want)
			}
			if f.writes != 0 || len(links.events) != 0 {
				t.Fatalf("%d settings written, %d audited, with no audit record possible; want none", f.writes, len(links.events))
			}
		})
	}
}

// TestOfflineSharedFromStore: an offline command (ca migrate-custody, ca
// rotate --offline) takes a shared setting's value from the store when it
// holds one, its file's otherwise, and refuses a file's value other than
// the store's as the authority's start does.
func TestOfflineSharedFromStore(t *testing.T) {
	f := &settingsFake{rows: map[string]store.Setting{"ca.intermediate_ttl": {Key: "ca.intermediate_ttl", Value: "4380h0m0s", Version: 2}}}
	for _, tt := range []struct {
		name string
		s    offlineShared
		want time.Duration
		err  string
	}{
		{"held, the file's left to its default", offlineShared{"ca.intermediate_ttl", 8760 * time.Hour, false, ""}, 4380 * time.Hour, ""},
		{"held, the file's the same", offlineShared{"ca.intermediate_ttl", 4380 * time.Hour, true, ""}, 4380 * time.Hour, ""},
		{"held, the file's another", offlineShared{"ca.intermediate_ttl", 720 * time.Hour, true, ""}, 0,
			"ca.intermediate_ttl is 720h0m0s in /d/authority.yaml but 4380h0m0s in the store"},
		{"not held: the file's", offlineShared{"signer.min_lead_time", 2 * time.Minute, true, ""}, 2 * time.Minute, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.s.fromStore(t.Context(), f, "/d/authority.yaml", "/d")
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v; want one saying %q", err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("%s, %v; want %s", got, err, tt.want)
			}
		})
	}
	if f.writes != 0 {
		t.Errorf("an offline command's reading wrote %d settings", f.writes)
	}
}

// TestOfflineSharedNamesTheFlag: ca migrate-custody --ca-intermediate-ttl
// other than the store's value is refused naming the flag, where the
// value came from, not the data directory's authority.yaml, which does
// not give it (it named the file, whose "make it … there" fixed nothing).
func TestOfflineSharedNamesTheFlag(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	if code, _, stderr := runCLI(t, "init", "--data", dir); code != 0 {
		t.Fatalf("init: %s", stderr)
	}
	if code, _, stderr := runCLI(t, "settings", "set", "ca.intermediate_ttl", "4380h", "--offline", "--data", dir); code != 0 {
		t.Fatalf("settings set --offline: %s", stderr)
	}
	code, _, stderr := runCLI(t, "ca", "migrate-custody", "--data", dir, "--custody", "pkcs11:token=muster", "--ca-intermediate-ttl", "720h")
	if code == 0 || !strings.Contains(stderr, "ca.intermediate_ttl is 720h0m0s in --ca-intermediate-ttl but 4380h0m0s in the store") ||
		strings.Contains(stderr, "authority.yaml but") {
		t.Fatalf("migrate-custody with a flag other than the store's: exit %d, stderr %q; want the flag named", code, stderr)
	}
}

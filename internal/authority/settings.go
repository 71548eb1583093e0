package authority

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// The shared settings: those that govern state every replica on a store
// acts on, so that replicas configured differently would disagree over
// it (docs/high-availability.md, "Settings kept in the store"). The store
// keeps their values once; every replica uses the store's, and muster
// settings set changes them for all. Their names are authority.yaml's.
const (
	SettingSignerMinLeadTime    = "signer.min_lead_time"
	SettingCAIntermediateTTL    = "ca.intermediate_ttl"
	SettingCADraftTTL           = "ca.draft_ttl"
	SettingJWTKeyRotationPeriod = "jwt_svid.key_rotation_period"
)

// signer.min_lead_time's bounds. Below a minute agents connected through
// a restart could miss a rotation; above a week a rotation could not be
// staged in time for an emergency.
const (
	MinSignerLeadTime = time.Minute
	MaxSignerLeadTime = 7 * 24 * time.Hour
)

// SharedSettings are the values of the shared settings a replica runs
// with; a zero field is the setting's default.
type SharedSettings struct {
	SignerMinLeadTime    time.Duration
	CAIntermediateTTL    time.Duration
	CADraftTTL           time.Duration
	JWTKeyRotationPeriod time.Duration
}

// sharedSetting is one shared setting: its name, its default, the one
// reading of its text (authority.yaml's, a flag's, the store's, muster
// settings set's), and its field.
type sharedSetting struct {
	key   string
	def   time.Duration
	parse func(string) (time.Duration, error)
	field func(*SharedSettings) *time.Duration
}

// sharedSettings is every shared setting, by key.
var sharedSettings = []sharedSetting{
	{SettingCADraftTTL, DefaultCADraftTTL, parseCADraftTTL, func(s *SharedSettings) *time.Duration { return &s.CADraftTTL }},
	{SettingCAIntermediateTTL, ca.IntermediateTTL, parseCAIntermediateTTL, func(s *SharedSettings) *time.Duration { return &s.CAIntermediateTTL }},
	{SettingJWTKeyRotationPeriod, DefaultJWTKeyRotationPeriod, parseJWTKeyRotationPeriod, func(s *SharedSettings) *time.Duration { return &s.JWTKeyRotationPeriod }},
	{SettingSignerMinLeadTime, signer.DefaultMinLeadTime, parseSignerMinLeadTime, func(s *SharedSettings) *time.Duration { return &s.SignerMinLeadTime }},
}

func parseCADraftTTL(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d < MinCADraftTTL || d > MaxCADraftTTL {
		return 0, fmt.Errorf("ca.draft_ttl %q: want a duration from %s to %s, such as 1h", v, MinCADraftTTL, MaxCADraftTTL)
	}
	return d, nil
}

func parseCAIntermediateTTL(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d < MinCAIntermediateTTL || d > ca.RootTTL {
		return 0, fmt.Errorf("ca.intermediate_ttl %q: want a duration from %s to %s, such as 8760h", v, MinCAIntermediateTTL, ca.RootTTL)
	}
	return d, nil
}

func parseJWTKeyRotationPeriod(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d < MinJWTKeyRotationPeriod {
		return 0, fmt.Errorf("jwt_svid.key_rotation_period %q: want a duration of at least %s, such as 720h", v, MinJWTKeyRotationPeriod)
	}
	return d, nil
}

func parseSignerMinLeadTime(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d < MinSignerLeadTime || d > MaxSignerLeadTime {
		return 0, fmt.Errorf("signer.min_lead_time %q: want a duration between %s and %s", v, MinSignerLeadTime, MaxSignerLeadTime)
	}
	return d, nil
}

// ErrUnknownSetting: a key that names no shared setting.
var ErrUnknownSetting = errors.New("not a shared setting")

func findSharedSetting(key string) (sharedSetting, error) {
	for _, d := range sharedSettings {
		if d.key == key {
			return d, nil
		}
	}
	return sharedSetting{}, fmt.Errorf("%q: %w; the shared settings are %s", key, ErrUnknownSetting, strings.Join(SharedSettingKeys(), ", "))
}

// SharedSettingKeys returns the shared settings' keys, sorted.
func SharedSettingKeys() []string {
	keys := make([]string, len(sharedSettings))
	for i, d := range sharedSettings {
		keys[i] = d.key
	}
	return keys
}

// ParseSharedSetting reads the text of shared setting key, with the
// bounds authority.yaml's value is held to. ErrUnknownSetting for a key
// that is not one.
func ParseSharedSetting(key, v string) (time.Duration, error) {
	d, err := findSharedSetting(key)
	if err != nil {
		return 0, err
	}
	return d.parse(v)
}

// Get returns key's value in s, its default when s leaves it zero.
func (s SharedSettings) Get(key string) time.Duration {
	d, err := findSharedSetting(key)
	if err != nil {
		return 0
	}
	if v := *d.field(&s); v > 0 {
		return v
	}
	return d.def
}

// Set sets key's value in s; a key that is not a shared setting is
// ignored.
func (s *SharedSettings) Set(key string, v time.Duration) {
	if d, err := findSharedSetting(key); err == nil {
		*d.field(s) = v
	}
}

// withDefaults returns s with every zero field its default.
func (s SharedSettings) withDefaults() SharedSettings {
	for _, d := range sharedSettings {
		s.Set(d.key, s.Get(d.key))
	}
	return s
}

// shared returns the shared settings in force on this replica: the
// configured ones until New (or a test's bare Server) has set any.
func (s *Server) shared() SharedSettings {
	if p := s.sharedNow.Load(); p != nil {
		return *p
	}
	return configuredShared(s.cfg)
}

// configuredShared is the shared settings cfg gives, defaults filled in.
func configuredShared(cfg Config) SharedSettings {
	return SharedSettings{SignerMinLeadTime: cfg.SignerMinLeadTime, CAIntermediateTTL: cfg.CAIntermediateTTL,
		CADraftTTL: cfg.CADraftTTL, JWTKeyRotationPeriod: cfg.JWTKeyRotationPeriod}.withDefaults()
}

// useShared makes next the shared settings in force, logging each one
// that changed.
func (s *Server) useShared(next SharedSettings) {
	next = next.withDefaults()
	prev := s.sharedNow.Swap(&next)
	if s.signers != nil {
		s.signers.UseMinLeadTime(next.SignerMinLeadTime)
	}
	if prev == nil {
		return
	}
	for _, d := range sharedSettings {
		if was, now := prev.Get(d.key), next.Get(d.key); was != now {
			s.log.Info("shared setting changed in the store; this replica uses the new value", "key", d.key, "was", was.String(), "now", now.String())
		}
	}
}

// loadShared reads the shared settings from the store and uses them. A
// key the store holds no value for keeps this replica's; one it holds a
// value of that this replica cannot read (a newer muster's, or a hand
// edit) keeps this replica's too, with an error logged. A value older
// than the one in force (this reading began before a write another
// reading has applied) is not taken.
func (s *Server) loadShared(ctx context.Context) error {
	held, err := s.store.ListSettings(ctx)
	if err != nil {
		return err
	}
	s.sharedMu.Lock()
	defer s.sharedMu.Unlock()
	if s.sharedVersions == nil {
		s.sharedVersions = map[string]int64{}
	}
	next := s.shared()
	for _, h := range held {
		if h.Version < s.sharedVersions[h.Key] {
			continue
		}
		s.sharedVersions[h.Key] = h.Version
		v, err := ParseSharedSetting(h.Key, h.Value)
		if errors.Is(err, ErrUnknownSetting) {
			continue
		}
		if err != nil {
			if was, ok := s.sharedUnreadable.Swap(h.Key, h.Value); !ok || was != h.Value {
				s.log.Error("the store holds a shared setting this replica cannot read; it keeps its own value: set one with `muster settings set KEY VALUE`",
					"key", h.Key, "err", err, "kept", next.Get(h.Key).String())
			}
			continue
		}
		s.sharedUnreadable.Delete(h.Key)
		next.Set(h.Key, v)
	}
	s.useShared(next)
	return nil
}

// settingsStepTimeout bounds one reading of the shared settings.
const settingsStepTimeout = 30 * time.Second

// SettingsRefresh is how often an authority on a store that is not
// replicated (SQLite) reads the shared settings even unannounced: its
// change announcements are in-process, and muster settings set --offline
// writes from another process.
const SettingsRefresh = 3 * time.Second

// pokeSettings asks settingsClock to read the shared settings again.
func (s *Server) pokeSettings() {
	select {
	case s.settingsPoke <- struct{}{}:
	default: // a reading is pending already
	}
}

// settingsClock reads the shared settings again whenever the store
// announces a write of one (store.ChangeSettings, from any replica), and
// whenever it listens again after losing the announcements
// (store.ChangeAll): a replica uses a value set through another within
// one announcement. PostgreSQL announces a write from any process
// (muster settings set --offline too); SQLite only those of this one, so
// on SQLite the settings are also read every SettingsRefresh, as the CA
// intermediates are (caRefresh), for a write from an offline command.
func (s *Server) settingsClock(ctx context.Context) {
	var refresh <-chan time.Time
	if !s.store.Replicated() {
		t := time.NewTicker(SettingsRefresh)
		defer t.Stop()
		refresh = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.settingsPoke:
		case <-refresh:
		}
		sctx, cancel := context.WithTimeout(ctx, settingsStepTimeout)
		err := s.loadShared(sctx)
		cancel()
		if err != nil && ctx.Err() == nil && !s.outage.fail(err) {
			s.log.Error("reading the shared settings failed; the next change announced reads them again", "err", err)
		}
	}
}

// ListSettings returns every shared setting: the store's value, or this
// replica's where the store holds none (version 0).
func (a *adminService) ListSettings(ctx context.Context, _ *musterv1.ListSettingsRequest) (*musterv1.ListSettingsResponse, error) {
	held, err := a.s.store.ListSettings(ctx)
	if err != nil {
		return nil, toStatus(ctx, a.s.log, err)
	}
	byKey := map[string]store.Setting{}
	for _, h := range held {
		byKey[h.Key] = h
	}
	in := a.s.shared()
	resp := &musterv1.ListSettingsResponse{}
	for _, key := range SharedSettingKeys() {
		h, ok := byKey[key]
		if !ok {
			resp.Settings = append(resp.Settings, &musterv1.Setting{Key: key, Value: in.Get(key).String()})
			continue
		}
		resp.Settings = append(resp.Settings, settingToProto(h))
	}
	return resp, nil
}

func settingToProto(h store.Setting) *musterv1.Setting {
	return &musterv1.Setting{Key: h.Key, Value: h.Value, Version: h.Version, UpdatedAt: timestamppb.New(h.UpdatedAt), UpdatedBy: h.UpdatedBy}
}

// SetSetting changes a shared setting for every replica, audited as
// setting.set with the value before and after: the record goes in with
// the change, in the store's one transaction, so a change that cannot be
// audited is not made. A refusal is audited on its own.
func (a *adminService) SetSetting(ctx context.Context, req *musterv1.SetSettingRequest) (*musterv1.Setting, error) {
	resp, was, err := a.setSetting(ctx, req)
	err = toStatus(ctx, a.s.log, err)
	if err != nil {
		a.record(ctx, "setting.set", req.GetKey(), err)
		return nil, err
	}
	a.s.log.Info("shared setting changed by an operator", "key", req.GetKey(), "was", was, "now", resp.GetValue(),
		"operator", callerFrom(ctx).Actor())
	return resp, nil
}

func (a *adminService) setSetting(ctx context.Context, req *musterv1.SetSettingRequest) (*musterv1.Setting, string, error) {
	key := req.GetKey()
	v, err := ParseSharedSetting(key, req.GetValue())
	if err != nil {
		return nil, "", badRequest(err.Error())
	}
	held, err := a.s.store.ListSettings(ctx)
	if err != nil {
		return nil, "", err
	}
	from, was := store.Setting{}, a.s.shared().Get(key).String()
	for _, h := range held {
		if h.Key == key {
			from, was = h, h.Value
		}
	}
	// The write is conditional on the row read (its version and the time
	// of its write, which a restore cannot bring back with other content),
	// so was is the value it replaces whenever it succeeds.
	c := callerFrom(ctx)
	link, err := a.s.audit.Builder(audit.Event{Actor: c.Actor(), Action: "setting.set", Target: key, Result: audit.ResultOK,
		Reason: fmt.Sprintf("%s was %s, now %s for every replica", key, was, v), Source: c.Source, CorrelationID: c.CorrelationID})
	if err != nil {
		return nil, "", err
	}
	row, err := a.s.store.PutSetting(ctx, store.Setting{Key: key, Value: v.String(), UpdatedBy: c.Actor()}, from, link.Build)
	if errors.Is(err, store.ErrConflict) {
		return nil, "", status.Errorf(codes.Aborted, "%s was changed by another request at the same time: see muster settings list, and run muster settings set %s %s again if it is still wanted", key, key, req.GetValue())
	}
	if err != nil {
		return nil, "", fmt.Errorf("%s not changed: it could not be written with its audit record: %w", key, err)
	}
	a.s.audit.Appended(link)
	// This replica uses it at once; the others when the store announces
	// the write.
	if err := a.s.loadShared(ctx); err != nil {
		a.s.pokeSettings()
	}
	return settingToProto(row), was, nil
}

package authority

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestSharedSettingFollowedByEveryReplica: a shared setting set through
// one replica is in force there at once and on the other once the store
// announces the write, without a restart; a value out of bounds or a key
// that is not shared is refused and writes nothing; each is audited as
// setting.set.
func TestSharedSettingFollowedByEveryReplica(t *testing.T) {
	t.Parallel()
	b := startReplicas(t, nil, 2)
	r0, r1 := b.srvs[0], b.srvs[1]
	ctx := t.Context()
	a0, a1 := &adminService{s: r0}, &adminService{s: r1}

	for _, bad := range []struct{ key, value, want string }{
		{"signer.min_lead_time", "10s", "want a duration between 1m0s and 168h0m0s"},
		{"ca.intermediate_ttl", "1m", "want a duration from 2m0s to"},
		{"crl_validity", "1h", "not a shared setting; the shared settings are ca.draft_ttl, ca.intermediate_ttl, jwt_svid.key_rotation_period, signer.min_lead_time"},
	} {
		_, err := a0.SetSetting(ctx, &musterv1.SetSettingRequest{Key: bad.key, Value: bad.value})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("set %s %s: %v; want INVALID_ARGUMENT saying %q", bad.key, bad.value, err, bad.want)
		}
	}
	if held, err := b.store.ListSettings(ctx); err != nil || len(held) != 0 {
		t.Fatalf("refused sets wrote %+v (%v)", held, err)
	}

	resp, err := a0.SetSetting(ctx, &musterv1.SetSettingRequest{Key: "signer.min_lead_time", Value: "3m"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetValue() != "3m0s" || resp.GetVersion() != 1 {
		t.Fatalf("set: %+v", resp)
	}
	if got := r0.signers.MinLeadTime(); got != 3*time.Minute {
		t.Fatalf("the replica that took the set uses %s", got)
	}
	if _, err := a1.SetSetting(ctx, &musterv1.SetSettingRequest{Key: "ca.intermediate_ttl", Value: "4380h"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for r1.signers.MinLeadTime() != 3*time.Minute || r0.caIntermediateTTL() != 4380*time.Hour {
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the sets, replica 1 uses lead time %s and replica 0 intermediate lifetime %s", r1.signers.MinLeadTime(), r0.caIntermediateTTL())
		}
		time.Sleep(20 * time.Millisecond)
	}

	list, err := a1.ListSettings(ctx, &musterv1.ListSettingsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, s := range list.GetSettings() {
		got[s.GetKey()] = s.GetValue() + "@" + string(rune('0'+s.GetVersion()))
	}
	want := map[string]string{"signer.min_lead_time": "3m0s@1", "ca.intermediate_ttl": "4380h0m0s@1",
		"ca.draft_ttl": DefaultCADraftTTL.String() + "@0", "jwt_svid.key_rotation_period": DefaultJWTKeyRotationPeriod.String() + "@0"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("list: %s is %q, want %q", k, got[k], v)
		}
	}

	recs, err := b.store.ListAudit(ctx, store.AuditFilter{Action: "setting.set"})
	if err != nil {
		t.Fatal(err)
	}
	var ok, denied int
	for _, r := range recs {
		switch r.Result {
		case "ok":
			ok++
		case "denied":
			denied++
		}
	}
	if ok != 2 || denied != 3 {
		t.Errorf("setting.set records: %d ok, %d denied; want 2 and 3: %+v", ok, denied, recs)
	}
	if !strings.Contains(recs[len(recs)-2].Reason, "signer.min_lead_time was 10m0s, now 3m0s for every replica") {
		t.Errorf("the set's record says %q", recs[len(recs)-2].Reason)
	}
	if ca.IntermediateTTL == 4380*time.Hour {
		t.Fatal("the test sets the default: it would prove nothing")
	}
}

// heldSettings is a store whose only answer is its shared settings.
type heldSettings struct {
	store.Store
	rows []store.Setting
}

func (h *heldSettings) ListSettings(context.Context) ([]store.Setting, error) { return h.rows, nil }

// TestUnreadableSharedSettingLoggedOnce: a stored value this replica
// cannot read keeps its own and is logged once, not at every reading (on
// SQLite the settings are read every SettingsRefresh), and again only
// once the value changes.
func TestUnreadableSharedSettingLoggedOnce(t *testing.T) {
	var logs bytes.Buffer
	st := &heldSettings{rows: []store.Setting{{Key: SettingSignerMinLeadTime, Value: "banana", Version: 1}}}
	s := &Server{store: st, log: slog.New(slog.NewTextHandler(&logs, nil))}
	read := func() {
		t.Helper()
		if err := s.loadShared(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	count := func() int { return strings.Count(logs.String(), "cannot read") }
	read()
	read()
	if n := count(); n != 1 {
		t.Fatalf("an unreadable value read twice was logged %d times:\n%s", n, logs.String())
	}
	if got := s.shared().SignerMinLeadTime; got != signer.DefaultMinLeadTime {
		t.Errorf("lead time in force with an unreadable stored one: %s", got)
	}
	st.rows[0].Value = "2m0s"
	read()
	if got := s.shared().SignerMinLeadTime; got != 2*time.Minute {
		t.Errorf("lead time in force once readable: %s", got)
	}
	st.rows[0].Value = "banana"
	read()
	if n := count(); n != 2 {
		t.Errorf("an unreadable value after a readable one was logged %d times in all, want 2:\n%s", n, logs.String())
	}
}

// TestSharedSettingsNeverGoBack: a reading of the shared settings that
// ends after a newer one (settingsClock's and a SetSetting's run at once:
// the latter read before another replica's write, which settingsClock had
// already read) does not put the older value back. The older one stayed
// in force, on PostgreSQL until the next write of a shared setting, as
// nothing else reads them again.
func TestSharedSettingsNeverGoBack(t *testing.T) {
	st := &heldSettings{rows: []store.Setting{{Key: SettingSignerMinLeadTime, Value: "5m0s", Version: 2}}}
	s := &Server{store: st, log: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))}
	if err := s.loadShared(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The slower reading, of version 1, applies last.
	st.rows = []store.Setting{{Key: SettingSignerMinLeadTime, Value: "2m0s", Version: 1}}
	if err := s.loadShared(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := s.shared().SignerMinLeadTime; got != 5*time.Minute {
		t.Fatalf("lead time in force after a reading of version 1 ended last: %s, want version 2's 5m0s", got)
	}
	st.rows = []store.Setting{{Key: SettingSignerMinLeadTime, Value: "3m0s", Version: 3}}
	if err := s.loadShared(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := s.shared().SignerMinLeadTime; got != 3*time.Minute {
		t.Fatalf("lead time in force after version 3: %s", got)
	}
}

// unauditable is a store that cannot write the audit chain: appends
// fail with err, and so does the record a setting's write carries (the
// store's own append in that transaction).
type unauditable struct {
	store.Store
	err error
}

func (u unauditable) AppendAudit(context.Context, func(store.AuditHead) (store.AuditRecord, error)) (store.AuditRecord, error) {
	return store.AuditRecord{}, u.err
}

func (u unauditable) PutSetting(ctx context.Context, s store.Setting, from store.Setting, _ func(store.AuditHead) (store.AuditRecord, error)) (store.Setting, error) {
	return u.Store.PutSetting(ctx, s, from, func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, u.err })
}

// TestSetSettingUnauditedChangesNothing: a shared setting whose audit
// record cannot be written is not changed, and the failure is answered
// and logged with its cause. Before, the value was written first and its
// record after, whose failure was logged and dropped: the setting
// changed for every replica with nothing in the chain.
func TestSetSettingUnauditedChangesNothing(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	for _, tt := range []struct {
		name  string
		cause error
		code  codes.Code
	}{
		{"the chain cannot be written", errors.New("disk on fire"), codes.Internal},
		{"the store is full", fmt.Errorf("sqlite: disk full: %w", store.ErrUnavailable), codes.Unavailable},
	} {
		t.Run(tt.name, func(t *testing.T) {
			u := unauditable{Store: st, err: tt.cause}
			log, err := audit.New(audit.Config{Store: u, ChainKey: make([]byte, 32), CheckpointKey: key})
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			s := &Server{store: u, audit: log, log: slog.New(slog.NewTextHandler(&buf, nil))}
			ctx := context.WithValue(t.Context(), callerKey{}, Caller{CorrelationID: "corr-7"})
			_, err = (&adminService{s: s}).SetSetting(ctx, &musterv1.SetSettingRequest{Key: SettingSignerMinLeadTime, Value: "3m"})
			if status.Code(err) != tt.code {
				t.Fatalf("SetSetting = %v; want %v", err, tt.code)
			}
			if held, err := st.ListSettings(t.Context()); err != nil || len(held) != 0 {
				t.Fatalf("the setting changed unaudited: the store holds %+v (%v)", held, err)
			}
			if tt.code == codes.Internal && !strings.Contains(buf.String(), "signer.min_lead_time not changed") {
				t.Errorf("the log does not say the setting was not changed:\n%s", buf.String())
			}
		})
	}
	if recs, err := st.ListAudit(t.Context(), store.AuditFilter{}); err != nil || len(recs) != 0 {
		t.Fatalf("audit chain %+v (%v); want it empty", recs, err)
	}
}

// unauditedServer is a server over st whose every audit record fails to
// be written ("disk on fire"), its log kept in the buffer returned.
func unauditedServer(t *testing.T, st store.Store) (*Server, *bytes.Buffer) {
	t.Helper()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	u := unauditable{Store: st, err: errors.New("disk on fire")}
	log, err := audit.New(audit.Config{Store: u, ChainKey: make([]byte, 32), CheckpointKey: key})
	if err != nil {
		t.Fatal(err)
	}
	buf := new(bytes.Buffer)
	return &Server{store: u, audit: log, log: slog.New(slog.NewTextHandler(buf, nil))}, buf
}

// setupLink is the audit record a test's own store write (a lock it sets
// up) carries, outside the server's chain key: tests using it do not
// verify the chain.
func setupLink(h store.AuditHead) (store.AuditRecord, error) {
	return store.AuditRecord{Seq: h.Seq + 1, PrevHash: h.Hash, Hash: []byte{byte(h.Seq + 1)}, Time: time.Now(),
		Action: "test.setup", Result: audit.ResultOK}, nil
}

func (u unauditable) InsertLock(ctx context.Context, l store.Lock, _ func(store.AuditHead) (store.AuditRecord, error)) error {
	return u.Store.InsertLock(ctx, l, func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, u.err })
}

func (u unauditable) DeleteLock(ctx context.Context, id string, _ func(store.AuditHead) (store.AuditRecord, error)) error {
	return u.Store.DeleteLock(ctx, id, func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, u.err })
}

// TestLockUnauditedChangesNothing: a lock whose lock.create or
// lock.delete record cannot be written is neither created nor lifted,
// and the call fails saying so. Before, the lock was written first and
// its record after, whose failure was logged and dropped.
func TestLockUnauditedChangesNothing(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	held := store.Lock{ID: "lock-held", Kind: store.LockNode, Target: "node-1", CreatedBy: "admin", CreatedAt: time.Now()}
	if err := st.InsertLock(t.Context(), held, setupLink); err != nil {
		t.Fatal(err)
	}
	s, buf := unauditedServer(t, st)
	ctx := context.WithValue(t.Context(), callerKey{}, Caller{CorrelationID: "corr-8"})
	a := &adminService{s: s}
	if _, err := a.CreateLock(ctx, &musterv1.CreateLockRequest{Kind: store.LockNode, Target: "node-2"}); status.Code(err) != codes.Internal {
		t.Fatalf("CreateLock = %v; want Internal", err)
	}
	if _, err := a.DeleteLock(ctx, &musterv1.DeleteLockRequest{Id: held.ID}); status.Code(err) != codes.Internal {
		t.Fatalf("DeleteLock = %v; want Internal", err)
	}
	got, err := st.ListLocks(t.Context())
	if err != nil || len(got) != 1 || got[0].ID != held.ID {
		t.Fatalf("locks after unaudited writes: %+v (%v); want only %s", got, err, held.ID)
	}
	for _, want := range []string{"lock not created", "lock lock-held not deleted"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the log does not say %q:\n%s", want, buf.String())
		}
	}
	if recs, err := st.ListAudit(t.Context(), store.AuditFilter{}); err != nil || len(recs) != 1 {
		t.Fatalf("audit chain %+v (%v); want only the setup's record", recs, err)
	}
}

func (u unauditable) InsertToken(ctx context.Context, tok store.Token, _ func(store.AuditHead) (store.AuditRecord, error)) error {
	return u.Store.InsertToken(ctx, tok, func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, u.err })
}

func (u unauditable) DeleteToken(ctx context.Context, id string, _ func(store.AuditHead) (store.AuditRecord, error)) error {
	return u.Store.DeleteToken(ctx, id, func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, u.err })
}

// TestTokenUnauditedChangesNothing: a join token whose token.create or
// token.delete record cannot be written is neither created nor deleted,
// and the call fails saying so. Before, the token was written first and
// its record after, whose failure was logged and dropped: a token that
// admits nodes with nothing in the chain of its making.
func TestTokenUnauditedChangesNothing(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	held := store.Token{ID: "abc123", JoinMethod: store.JoinMethodToken, Ciphertext: []byte("c"), Nonce: []byte("n"), UsesAllowed: 1, CreatedBy: "admin", CreatedAt: time.Now()}
	if err := st.InsertToken(t.Context(), held, setupLink); err != nil {
		t.Fatal(err)
	}
	sealer, err := seal.StorageKey{}.Sealer(seal.InfoToken)
	if err != nil {
		t.Fatal(err)
	}
	s, buf := unauditedServer(t, st)
	s.tokens = sealer
	ctx := context.WithValue(t.Context(), callerKey{}, Caller{CorrelationID: "corr-9"})
	a := &adminService{s: s}
	if _, err := a.CreateToken(ctx, &musterv1.CreateTokenRequest{}); status.Code(err) != codes.Internal {
		t.Fatalf("CreateToken = %v; want Internal", err)
	}
	if _, err := a.DeleteToken(ctx, &musterv1.DeleteTokenRequest{Id: held.ID}); status.Code(err) != codes.Internal {
		t.Fatalf("DeleteToken = %v; want Internal", err)
	}
	got, err := st.ListTokens(t.Context())
	if err != nil || len(got) != 1 || got[0].ID != held.ID {
		t.Fatalf("tokens after unaudited writes: %+v (%v); want only %s", got, err, held.ID)
	}
	for _, want := range []string{"token not created", "token abc123 not deleted"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the log does not say %q:\n%s", want, buf.String())
		}
	}
	if recs, err := st.ListAudit(t.Context(), store.AuditFilter{}); err != nil || len(recs) != 1 {
		t.Fatalf("audit chain %+v (%v); want only the setup's record", recs, err)
	}
}

func (u unauditable) DeleteNode(ctx context.Context, id string, _ func(store.AuditHead) (store.AuditRecord, error)) error {
	return u.Store.DeleteNode(ctx, id, func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, u.err })
}

// TestAgentDeleteUnauditedChangesNothing: a node whose agent.delete
// record cannot be written is not deleted, and the call fails saying so.
// Before, the node was deleted first and its record written after, whose
// failure was logged and dropped: a node gone with nothing in the chain.
func TestAgentDeleteUnauditedChangesNothing(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Now()
	if err := st.InsertToken(t.Context(), store.Token{ID: "abc123", JoinMethod: store.JoinMethodToken, Ciphertext: []byte("c"), Nonce: []byte("n"),
		CreatedBy: "admin", CreatedAt: now}, setupLink); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CommitJoin(t.Context(), store.Join{TokenID: "abc123", NodeID: "node-1", RetryWindow: time.Minute,
		Instance:    store.Instance{ID: "i1", JoinMethod: store.JoinMethodToken, CreatedAt: now, LastChainPEM: []byte("chain")},
		Certificate: store.Certificate{Serial: "0a", PublicKey: []byte("key"), NotBefore: now, NotAfter: now.Add(time.Hour), IssuedAt: now},
	}); err != nil {
		t.Fatal(err)
	}
	s, buf := unauditedServer(t, st)
	ctx := context.WithValue(t.Context(), callerKey{}, Caller{CorrelationID: "corr-9"})
	a := &adminService{s: s}
	if _, err := a.DeleteAgent(ctx, &musterv1.DeleteAgentRequest{NodeId: "node-1"}); status.Code(err) != codes.Internal {
		t.Fatalf("DeleteAgent = %v; want Internal", err)
	}
	if _, err := st.GetNode(t.Context(), "node-1"); err != nil {
		t.Fatalf("GetNode after the unaudited delete: %v; want the node", err)
	}
	if !strings.Contains(buf.String(), "node node-1 not deleted") {
		t.Errorf("the log does not say the node was not deleted:\n%s", buf.String())
	}
	if recs, err := st.ListAudit(t.Context(), store.AuditFilter{}); err != nil || len(recs) != 1 {
		t.Fatalf("audit chain %+v (%v); want only the setup's record", recs, err)
	}
}

func (u unauditable) RotatePSK(ctx context.Context, from string, p store.PSK, grace time.Duration, _ func(store.AuditHead) (store.AuditRecord, error)) (store.PSK, error) {
	return u.Store.RotatePSK(ctx, from, p, grace, func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, u.err })
}

func (u unauditable) RevokeExpiredGracePSKs(ctx context.Context, _ func([]string) func(store.AuditHead) (store.AuditRecord, error)) ([]string, error) {
	return u.Store.RevokeExpiredGracePSKs(ctx, func([]string) func(store.AuditHead) (store.AuditRecord, error) {
		return func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, u.err }
	})
}

// TestPSKUnauditedChangesNothing: a bootstrap PSK rotation whose
// psk.rotate record cannot be written changes no PSK and hands none out,
// and a grace whose psk.expire record cannot be written is not revoked
// (it admits no one past its end all the same). Before, both were written
// first and recorded after, the record's failure logged and dropped.
func TestPSKUnauditedChangesNothing(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Now()
	var sk seal.StorageKey
	_, active, err := datadir.NewPSK(sk, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.InsertPSK(t.Context(), active, setupLink); err != nil {
		t.Fatal(err)
	}
	s, buf := unauditedServer(t, st)
	s.cfg.StorageKey = sk
	ctx := context.WithValue(t.Context(), callerKey{}, Caller{CorrelationID: "corr-9"})
	a := &adminService{s: s}
	if resp, err := a.RotatePSK(ctx, &musterv1.RotatePSKRequest{}); status.Code(err) != codes.Internal || resp != nil {
		t.Fatalf("RotatePSK = %v, %v; want Internal and no PSK", resp, err)
	}
	expired := store.PSK{ID: "psk-old", Ciphertext: []byte{1}, Nonce: []byte{2}, Status: store.PSKGrace,
		CreatedAt: now.Add(-time.Hour), GraceExpiresAt: now.Add(-time.Minute)}
	if err := st.InsertPSK(t.Context(), expired, setupLink); err != nil {
		t.Fatal(err)
	}
	if err := s.revokeExpiredGracePSKs(ctx); err == nil {
		t.Fatal("revokeExpiredGracePSKs succeeded with its record unwritten")
	}
	ps, err := st.ListPSKs(t.Context())
	if err != nil || len(ps) != 2 {
		t.Fatalf("PSKs %+v (%v); want the active one and the one in grace", ps, err)
	}
	for _, p := range ps {
		if want := map[string]string{active.ID: store.PSKActive, expired.ID: store.PSKGrace}[p.ID]; p.Status != want {
			t.Errorf("PSK %s is %s; want %s", p.ID, p.Status, want)
		}
	}
	if !strings.Contains(buf.String(), "psk "+active.ID+" not rotated") {
		t.Errorf("the log does not say the PSK was not rotated:\n%s", buf.String())
	}
	recs, err := st.ListAudit(t.Context(), store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Action != "test.setup" {
			t.Fatalf("audit chain %+v; want only the setup's records", recs)
		}
	}
}

func (u unauditable) failing(store.AuditHead) (store.AuditRecord, error) {
	return store.AuditRecord{}, u.err
}

func (u unauditable) InsertCACert(ctx context.Context, c store.CACert, _ func(store.AuditHead) (store.AuditRecord, error)) error {
	return u.Store.InsertCACert(ctx, c, u.failing)
}

func (u unauditable) ActivateCACert(ctx context.Context, role, serial string, _ func(store.AuditHead) (store.AuditRecord, error)) error {
	return u.Store.ActivateCACert(ctx, role, serial, u.failing)
}

func (u unauditable) RetireCACert(ctx context.Context, role, serial string, _ func(store.AuditHead) (store.AuditRecord, error)) ([]byte, error) {
	return u.Store.RetireCACert(ctx, role, serial, u.failing)
}

func (u unauditable) DiscardCACert(ctx context.Context, role, serial string, _ func(store.AuditHead) (store.AuditRecord, error)) ([]byte, error) {
	return u.Store.DiscardCACert(ctx, role, serial, u.failing)
}

func (u unauditable) DeleteExpiredTokens(ctx context.Context, retention time.Duration, _ func([]string) func(store.AuditHead) (store.AuditRecord, error)) ([]string, error) {
	return u.Store.DeleteExpiredTokens(ctx, retention, func([]string) func(store.AuditHead) (store.AuditRecord, error) { return u.failing })
}

// TestCAStepUnauditedChangesNothing: a CA step of the leader's clock
// (retire, discard, activate) whose record cannot be written changes no
// intermediate, keeps its key reference and destroys no key, and the
// failure is logged; an expired token whose token.cleanup record cannot
// be written is not deleted. Before, each was written first and recorded
// after, the record's failure logged and dropped (and the key of a
// retired intermediate destroyed with no record of it).
func TestCAStepUnauditedChangesNothing(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := t.Context()
	row := func(role, serial, state string) store.CACert {
		return store.CACert{Role: role, Serial: serial, CertDER: []byte("der-" + serial), KeyRef: []byte("sealed-" + serial),
			State: state, NotAfter: time.Now().Add(time.Hour)}
	}
	for _, r := range []store.CACert{row("agent", "a1", store.CAActive), row("agent", "a2", store.CAPrepared),
		row("server", "s1", store.CAActive), row("server", "s2", store.CAPrepared)} {
		if err := st.InsertCACert(ctx, r, setupLink); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.ActivateCACert(ctx, "server", "s2", setupLink); err != nil { // s1 retiring
		t.Fatal(err)
	}
	if err := st.InsertToken(ctx, store.Token{ID: "tok-old", JoinMethod: "token", Ciphertext: []byte{1}, Nonce: []byte{2}, UsesAllowed: 1,
		ExpiresAt: time.Now().Add(-2 * tokenRetention), CreatedBy: "admin", CreatedAt: time.Now().Add(-3 * tokenRetention)}, setupLink); err != nil {
		t.Fatal(err)
	}
	before, err := st.ListCACerts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, buf := unauditedServer(t, st)
	// No custody: a step that went through would try to destroy a key
	// and panic on it.
	s.endIntermediate(ctx, "ca.retire", "server", "s1", "the last leaf it signed has expired", s.store.RetireCACert)
	s.endIntermediate(ctx, "ca.discard", "agent", "a2", "root rotation: prepared under a root that no longer signs", s.store.DiscardCACert)
	link := s.caStepLink("ca.activate", "agent", "a2", "two thirds of the active intermediate's life have passed")
	s.caChange(ctx, "ca.activate", "agent", "a2", "two thirds", link, s.store.ActivateCACert(ctx, "agent", "a2", link.Build))
	s.cleanTokensOnce(ctx)

	after, err := st.ListCACerts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("intermediates after unaudited steps:\n%+v\nwant as they were:\n%+v", after, before)
	}
	if _, err := st.GetToken(ctx, "tok-old"); err != nil {
		t.Errorf("the expired token after an unaudited cleanup: %v; want it kept", err)
	}
	for _, want := range []string{"action=ca.retire", "action=ca.discard", "action=ca.activate", "token cleaner failed"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the log says nothing of %s:\n%s", want, buf.String())
		}
	}
	recs, err := st.ListAudit(ctx, store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Action != "test.setup" {
			t.Fatalf("audit chain %+v; want only the setup's records", recs)
		}
	}
}

package authority

import (
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

func TestTokenState(t *testing.T) {
	now := time.Now()
	for _, tt := range []struct {
		name string
		tok  store.Token
		want string
	}{
		{"fresh", store.Token{UsesAllowed: 1, ExpiresAt: now.Add(time.Hour)}, tokenActive},
		{"never expires", store.Token{UsesAllowed: 1}, tokenActive},
		{"unlimited", store.Token{UsesCount: 1000, ExpiresAt: now.Add(time.Hour)}, tokenActive},
		{"used up", store.Token{UsesAllowed: 2, UsesCount: 2, ExpiresAt: now.Add(time.Hour)}, tokenUsedUp},
		{"expired at this instant", store.Token{UsesAllowed: 1, ExpiresAt: now}, tokenExpired},
		{"expired and used up", store.Token{UsesAllowed: 1, UsesCount: 1, ExpiresAt: now.Add(-time.Hour)}, tokenExpired},
	} {
		if got := tokenState(tt.tok, now); got != tt.want {
			t.Errorf("%s: state %s, want %s", tt.name, got, tt.want)
		}
	}
}

func TestCleanerDeletesLongExpiredTokens(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	log, _ := audit.New(audit.Config{Store: st, ChainKey: make([]byte, 32), CheckpointKey: key})
	s := &Server{store: st, audit: log, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	now := time.Now()
	for id, exp := range map[string]time.Time{
		"old111": now.Add(-tokenRetention - time.Hour), // past retention: deleted
		"new111": now.Add(-time.Hour),                  // expired, kept for the operator to see
		"live11": now.Add(time.Hour),
		"never1": {},
	} {
		if err := st.InsertToken(t.Context(), store.Token{ID: id, JoinMethod: store.JoinMethodToken, Ciphertext: []byte{1},
			Nonce: []byte{1}, UsesAllowed: 1, ExpiresAt: exp, CreatedAt: now.Add(-48 * time.Hour)}, setupLink); err != nil {
			t.Fatal(err)
		}
	}
	s.cleanTokensOnce(t.Context())
	ts, _ := st.ListTokens(t.Context())
	var left []string
	for _, tk := range ts {
		left = append(left, tk.ID)
	}
	if len(left) != 3 || slices.Contains(left, "old111") {
		t.Fatalf("tokens left %v, want all but old111", left)
	}
	recs, _ := st.ListAudit(t.Context(), store.AuditFilter{Action: "token.cleanup"})
	if len(recs) != 1 || recs[0].Target != "old111" {
		t.Fatalf("cleanup audit %+v", recs)
	}
	// Nothing to delete: nothing audited.
	s.cleanTokensOnce(t.Context())
	if recs, _ := st.ListAudit(t.Context(), store.AuditFilter{Action: "token.cleanup"}); len(recs) != 1 {
		t.Fatalf("an empty cleanup was audited")
	}
}

// TestCertificateServiceAccess: on the main listener CertificateService
// takes agents (renewal) and callers without a certificate (PSK
// bootstrap); on the bootstrap listener only the latter.
func TestCertificateServiceAccess(t *testing.T) {
	const svc = "muster.v1.CertificateService"
	if got := accessFor(svc, false); got != accessAgentOrAnonymous {
		t.Errorf("main listener: access %d, want agent or anonymous", got)
	}
	if got := accessFor(svc, true); got != accessAnonymous {
		t.Errorf("bootstrap listener: access %d, want anonymous only", got)
	}
	if got := accessFor("muster.v1.AdminService", true); got != accessAdmin {
		t.Errorf("admin service on the bootstrap listener: access %d (it is not registered there, and its rule must not loosen)", got)
	}
	if got := accessFor("muster.v1.NoSuchService", false); got != 0 {
		t.Errorf("unlisted service: access %d, want none", got)
	}
}

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

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

// failingAudit is a store whose audit appends fail with err.
type failingAudit struct {
	store.Store
	err error
}

func (f failingAudit) AppendAudit(context.Context, func(store.AuditHead) (store.AuditRecord, error)) (store.AuditRecord, error) {
	return store.AuditRecord{}, f.err
}

// TestFailedAuditWriteIsLoggedOnce: a failed audit write is one log line,
// naming the record's action and target and the request's correlation ID,
// whether the request goes on (an admin change) or is answered with the
// failure (an enrollment record, through toStatus). Before, enrollment's
// failure was logged by its auditor and again by toStatus, and an admin
// change's line had no target.
func TestFailedAuditWriteIsLoggedOnce(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, tt := range []struct {
		name     string
		cause    error
		wantCode codes.Code
		write    func(ctx context.Context, s *Server) error
	}{
		{"an enrollment record, answered", errors.New("disk on fire"), codes.Internal, func(ctx context.Context, s *Server) error {
			return toStatus(ctx, s.log, enrollAuditor{s}.Record(ctx, audit.Event{Actor: "authority", Action: "lock.create",
				Target: "instance inst-1", Result: audit.ResultOK}))
		}},
		{"an enrollment record, the store full", fmt.Errorf("sqlite: disk full: %w", store.ErrUnavailable), codes.Unavailable,
			func(ctx context.Context, s *Server) error {
				return toStatus(ctx, s.log, enrollAuditor{s}.Record(ctx, audit.Event{Actor: "authority", Action: "lock.create",
					Target: "instance inst-1", Result: audit.ResultOK}))
			}},
		{"an admin change's record", errors.New("disk on fire"), codes.OK, func(ctx context.Context, s *Server) error {
			(&adminService{s: s}).record(ctx, "lock.create", "instance inst-1", nil)
			return nil
		}},
		// The keeper drops a failed write (its step has committed): the
		// auditor the authority gives it is the one that logs it.
		{"the signer keeper's record", errors.New("disk on fire"), codes.OK, func(ctx context.Context, s *Server) error {
			_, _ = loggedAudit{s}.Record(ctx, audit.Event{Actor: "op", Action: "lock.create", Target: "instance inst-1",
				Result: audit.ResultOK, CorrelationID: "corr-7"})
			return nil
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, key, _ := ed25519.GenerateKey(rand.Reader)
			fail := failingAudit{Store: st, err: tt.cause}
			log, err := audit.New(audit.Config{Store: fail, ChainKey: make([]byte, 32), CheckpointKey: key})
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			s := &Server{store: fail, audit: log, log: slog.New(slog.NewTextHandler(&buf, nil))}
			ctx := context.WithValue(t.Context(), callerKey{}, Caller{CorrelationID: "corr-7"})
			err = tt.write(ctx, s)
			if got := status.Code(err); got != tt.wantCode {
				t.Errorf("answered %v (%v), want %v", got, err, tt.wantCode)
			}
			lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
			if len(lines) != 1 {
				t.Fatalf("the failure was logged in %d lines, want 1:\n%s", len(lines), buf.String())
			}
			for _, want := range []string{"action=lock.create", `target="instance inst-1"`, "correlation_id=corr-7", tt.cause.Error()} {
				if !strings.Contains(lines[0], want) {
					t.Errorf("the log line %q does not say %s", lines[0], want)
				}
			}
		})
	}
}

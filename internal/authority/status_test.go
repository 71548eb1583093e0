package authority

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/enroll"
	"github.com/muster-dev/muster/internal/errinfo"
	"github.com/muster-dev/muster/internal/store"
)

// TestToStatusReasons: every refusal leaves the service layer with its
// code and a muster.dev ErrorInfo reason (DESIGN.md's word where it names
// one); cancellations and internal errors carry none.
func TestToStatusReasons(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		code   codes.Code
		reason string
	}{
		{"locked", &enroll.Refusal{Kind: enroll.KindPermissionDenied, Reason: enroll.ReasonLocked, Detail: "lock x"}, codes.PermissionDenied, "locked"},
		{"copy", fmt.Errorf("renew: %w", &enroll.Refusal{Kind: enroll.KindPermissionDenied, Reason: enroll.ReasonCopyDetected}), codes.PermissionDenied, "copy_detected"},
		{"superseded", &enroll.Refusal{Kind: enroll.KindPermissionDenied, Reason: enroll.ReasonSuperseded}, codes.PermissionDenied, "superseded"},
		{"deleted", &enroll.Refusal{Kind: enroll.KindPermissionDenied, Reason: enroll.ReasonDeleted}, codes.PermissionDenied, "deleted"},
		{"a later method's word", &enroll.Refusal{Kind: enroll.KindUnauthenticated, Reason: "challenge_failed"}, codes.Unauthenticated, "challenge_failed"},
		{"psk missing", &enroll.Refusal{Kind: enroll.KindPermissionDenied, Reason: enroll.ReasonPSKMissing}, codes.PermissionDenied, "psk_missing"},
		{"ticket used", &enroll.Refusal{Kind: enroll.KindPermissionDenied, Reason: enroll.ReasonTicketUsed}, codes.PermissionDenied, "ticket_used"},
		{"ticket key unknown", &enroll.Refusal{Kind: enroll.KindPermissionDenied, Reason: enroll.ReasonTicketKeyUnknown, Detail: "key k1"}, codes.PermissionDenied, "ticket_key_unknown"},
		{"ticket key not fetched", &enroll.Refusal{Kind: enroll.KindUnavailable, Reason: enroll.ReasonTicketKeyNotFetched}, codes.Unavailable, "ticket_key_not_fetched"},
		{"a sentence", &enroll.Refusal{Kind: enroll.KindFailedPrecondition, Reason: "the moon is in the way"}, codes.FailedPrecondition, "failed_precondition"},
		{"token expired", &enroll.Refusal{Kind: enroll.KindFailedPrecondition, Reason: enroll.ReasonTokenExpired}, codes.FailedPrecondition, "token_expired"},
		{"token used up", &enroll.Refusal{Kind: enroll.KindFailedPrecondition, Reason: enroll.ReasonTokenUsedUp}, codes.FailedPrecondition, "token_used_up"},
		{"token spent at the write", &enroll.Refusal{Kind: enroll.KindFailedPrecondition, Reason: enroll.ReasonTokenSpent}, codes.FailedPrecondition, "token_spent"},
		{"token bound elsewhere", &enroll.Refusal{Kind: enroll.KindPermissionDenied, Reason: enroll.ReasonTokenBoundElsewhere}, codes.PermissionDenied, "token_bound_elsewhere"},
		{"node taken (token)", &enroll.Refusal{Kind: enroll.KindAlreadyExists, Reason: enroll.ReasonNodeTakenToken}, codes.AlreadyExists, "node_taken"},
		{"node taken (PSK)", &enroll.Refusal{Kind: enroll.KindAlreadyExists, Reason: enroll.ReasonNodeTaken}, codes.AlreadyExists, "node_taken"},
		{"certificate unknown", &enroll.Refusal{Kind: enroll.KindPermissionDenied, Reason: enroll.ReasonCertificateUnknown, Detail: "serial 1f"}, codes.PermissionDenied, "certificate_unknown"},
		{"rate limited", &enroll.Refusal{Kind: enroll.KindRateLimited, Reason: "too many requests from this source"}, codes.ResourceExhausted, "resource_exhausted"},
		{"bad request", badRequest("node_id is required"), codes.InvalidArgument, "invalid_argument"},
		{"bad csr", fmt.Errorf("x: %w", ca.ErrBadCSR), codes.InvalidArgument, "invalid_argument"},
		{"store not found", store.ErrNotFound, codes.NotFound, "not_found"},
		{"handler's own status", status.Error(codes.FailedPrecondition, "refusing to lock yourself"), codes.FailedPrecondition, "failed_precondition"},
		{"handler's status with a reason", errinfo.Error(codes.PermissionDenied, "x", "locked"), codes.PermissionDenied, "locked"},
		{"canceled", context.Canceled, codes.Canceled, ""},
		{"unavailable", status.Error(codes.Unavailable, "cannot check locks"), codes.Unavailable, ""},
		{"internal", errors.New("disk on fire"), codes.Internal, ""},
		{"token unavailable", fmt.Errorf("ca: signing %q: %w: lost", "n1", custody.ErrUnavailable), codes.Unavailable, "key_custody_unavailable"},
		{"token object deleted", fmt.Errorf("ca: signing %q: %w: object x", "n1", custody.ErrKeyMissing), codes.Unavailable, "key_custody_unavailable"},
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := toStatus(t.Context(), log, tt.err)
			if status.Code(err) != tt.code || errinfo.Reason(err) != tt.reason {
				t.Errorf("toStatus(%v) = %v with reason %q; want %v with %q", tt.err, err, errinfo.Reason(err), tt.code, tt.reason)
			}
			if tt.code == codes.Internal && status.Convert(err).Message() == tt.err.Error() {
				t.Errorf("internal detail reached the caller: %v", err)
			}
		})
	}
}

// TestToStatusLockUntil: a refusal for a lock with a TTL keeps its code,
// message and reason (DESIGN.md's) and adds when it ends, as a RetryInfo
// the agent waits by; one without carries no delay.
func TestToStatusLockUntil(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ref := &enroll.Refusal{Kind: enroll.KindPermissionDenied, Reason: enroll.ReasonLocked, Detail: "lock x",
		Until: time.Now().Add(10 * time.Minute)}
	err := toStatus(t.Context(), log, fmt.Errorf("renew: %w", ref))
	if status.Code(err) != codes.PermissionDenied || status.Convert(err).Message() != "locked" || errinfo.Reason(err) != "locked" {
		t.Fatalf("toStatus = %v with reason %q, want PERMISSION_DENIED locked", err, errinfo.Reason(err))
	}
	if d, ok := errinfo.RetryDelay(err); !ok || d <= 9*time.Minute || d > 10*time.Minute {
		t.Errorf("retry delay %v, %v; want about 10m", d, ok)
	}
	ref.Until = time.Time{}
	if d, ok := errinfo.RetryDelay(toStatus(t.Context(), log, ref)); ok {
		t.Errorf("a lock without a TTL carries a retry delay %v", d)
	}
}

// TestToStatusCallerGone: an error that reaches the mapping after the
// caller went away is the caller's cancellation or deadline, whatever the
// store answered the interrupted call with (SQLite's "interrupted" does not
// wrap ctx.Err()), never an internal error of the authority.
func TestToStatusCallerGone(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	interrupted := errors.New("sqlite: commit join: interrupted (9)")
	for _, tt := range []struct {
		name string
		ctx  context.Context
		err  error
		want codes.Code
		msg  string
	}{
		{"canceled", canceled, interrupted, codes.Canceled, enroll.ReasonCanceled},
		{"deadline", expired, interrupted, codes.DeadlineExceeded, enroll.ReasonDeadlineExceeded},
		{"context.Canceled wrapped", context.Background(), fmt.Errorf("x: %w", context.Canceled), codes.Canceled, enroll.ReasonCanceled},
		{"refusal after the caller left stays a refusal", canceled, &enroll.Refusal{Kind: enroll.KindPermissionDenied, Reason: enroll.ReasonLocked}, codes.PermissionDenied, enroll.ReasonLocked},
		{"caller still there", context.Background(), interrupted, codes.Internal, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := toStatus(tt.ctx, log, tt.err)
			if status.Code(err) != tt.want || (tt.msg != "" && status.Convert(err).Message() != tt.msg) {
				t.Errorf("toStatus = %v, want %v %q", err, tt.want, tt.msg)
			}
		})
	}
}

// TestToStatusStoreErrors: store sentinels reach the caller as the codes
// DESIGN.md gives them; a full disk is UNAVAILABLE (agents retry it),
// never INTERNAL (which they take as permanent).
func TestToStatusStoreErrors(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tt := range []struct {
		err  error
		want codes.Code
	}{
		{fmt.Errorf("sqlite: insert: %w: database or disk is full", store.ErrUnavailable), codes.Unavailable},
		{fmt.Errorf("x: %w", store.ErrNotFound), codes.NotFound},
		{fmt.Errorf("x: %w", store.ErrConflict), codes.AlreadyExists},
		{fmt.Errorf("sqlite: insert: database or disk is full"), codes.Internal},
	} {
		err := toStatus(context.Background(), log, tt.err)
		if status.Code(err) != tt.want {
			t.Errorf("toStatus(%v) = %v, want %v", tt.err, err, tt.want)
		}
		if tt.want == codes.Unavailable && (status.Convert(err).Message() != "the authority's store is unavailable; retry later" ||
			errinfo.Reason(err) != errinfo.ReasonStoreUnavailable) {
			t.Errorf("UNAVAILABLE message %q, reason %q", status.Convert(err).Message(), errinfo.Reason(err))
		}
	}
}

// TestCustodyRefusalSaysWhichAndTheWayOut: a call refused for its key
// says whether the token is away or the key gone from it, and what
// brings it back, rather than "see its log" for both.
func TestCustodyRefusalSaysWhichAndTheWayOut(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tt := range []struct {
		name string
		err  error
		want []string
	}{
		{"token away", fmt.Errorf("the stored new root: %w: login", custody.ErrUnavailable), []string{"PKCS#11 token is unavailable", "bring the token back"}},
		{"key gone", fmt.Errorf("ca: signing %q: %w: object x", "n1", custody.ErrKeyMissing), []string{"not in the authority's PKCS#11 token", "restore the token from its backup", `docs/hsm.md "A lost token"`}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			msg := status.Convert(toStatus(t.Context(), log, tt.err)).Message()
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("refusal %q does not say %q", msg, w)
				}
			}
		})
	}
}

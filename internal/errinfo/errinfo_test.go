package errinfo

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestReason(t *testing.T) {
	foreign, _ := status.New(codes.PermissionDenied, "no").WithDetails(&errdetails.ErrorInfo{Reason: "X", Domain: "example.com"})
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"muster refusal", Error(codes.PermissionDenied, "locked", "locked"), "locked"},
		{"wrapped", fmt.Errorf("renewal: %w", Error(codes.PermissionDenied, "instance superseded", "superseded")), "superseded"},
		{"no reason", Error(codes.Internal, "internal error", ""), ""},
		{"plain status", status.Error(codes.NotFound, "not found"), ""},
		{"another domain", foreign.Err(), ""},
		{"not a status", errors.New("boom"), ""},
		{"nil", nil, ""},
	}
	for _, tt := range tests {
		if got := Reason(tt.err); got != tt.want {
			t.Errorf("%s: Reason = %q, want %q", tt.name, got, tt.want)
		}
	}
	st := status.Convert(Error(codes.PermissionDenied, "copy detected", "copy_detected"))
	if st.Code() != codes.PermissionDenied || st.Message() != "copy detected" {
		t.Errorf("status = %v %q", st.Code(), st.Message())
	}
}

func TestCodeWord(t *testing.T) {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		w := CodeWord(c)
		if w == "unknown" && c != codes.Unknown {
			t.Errorf("CodeWord(%v) = unknown", c)
		}
		for _, r := range w {
			if (r < 'a' || r > 'z') && r != '_' {
				t.Errorf("CodeWord(%v) = %q, not lower snake case", c, w)
			}
		}
	}
	if got := CodeWord(codes.PermissionDenied); got != "permission_denied" {
		t.Errorf("CodeWord(PermissionDenied) = %q", got)
	}
}

// TestErrorUntil: a refusal that ends by itself carries its reason, the
// time it ends and the delay until then, never negative; any other error
// carries no delay.
func TestErrorUntil(t *testing.T) {
	now := time.Date(2026, 11, 27, 20, 0, 0, 0, time.UTC)
	tests := []struct {
		name  string
		until time.Time
		want  time.Duration
	}{
		{"ahead", now.Add(90 * time.Second), 90 * time.Second},
		{"passed", now.Add(-time.Second), 0},
	}
	for _, tt := range tests {
		err := fmt.Errorf("renewal: %w", ErrorUntil(codes.PermissionDenied, "locked", "locked", tt.until, now))
		if got := Reason(err); got != "locked" {
			t.Errorf("%s: Reason = %q", tt.name, got)
		}
		if got, ok := RetryDelay(err); !ok || got != tt.want {
			t.Errorf("%s: RetryDelay = %v, %v; want %v, true", tt.name, got, ok, tt.want)
		}
		var until string
		for _, d := range status.Convert(errors.Unwrap(err)).Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok {
				until = info.GetMetadata()[UntilKey]
			}
		}
		if until != tt.until.Format(time.RFC3339) {
			t.Errorf("%s: metadata %s = %q", tt.name, UntilKey, until)
		}
	}
	for _, err := range []error{Error(codes.PermissionDenied, "locked", "locked"), status.Error(codes.Unavailable, "down"), errors.New("boom"), nil} {
		if d, ok := RetryDelay(err); ok {
			t.Errorf("RetryDelay(%v) = %v, true; want none", err, d)
		}
	}
}

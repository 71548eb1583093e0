package errinfo

import (
	"errors"
	"fmt"
	"testing"

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

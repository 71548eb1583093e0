package authority

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/store"
)

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
		if tt.want == codes.Unavailable && status.Convert(err).Message() != "the authority cannot write to its store now; retry later" {
			t.Errorf("UNAVAILABLE message %q", status.Convert(err).Message())
		}
	}
}

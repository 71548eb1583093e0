package authority

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/store/sqlite"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestRefusalUnauditedKeepsItsAnswer: a refused call whose record cannot
// be written still answers its refusal (the way out the caller needs),
// and the log holds the record the chain could not take, with its reason.
// Before, the failure was logged without the refusal's reason, which was
// then nowhere.
func TestRefusalUnauditedKeepsItsAnswer(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s, buf := unauditedServer(t, st)
	ctx := context.WithValue(t.Context(), callerKey{}, Caller{CorrelationID: "corr-10"})
	_, err = (&adminService{s: s}).CreateLock(ctx, &musterv1.CreateLockRequest{Kind: "nonsense", Target: "x"})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "lock kind must be one of") {
		t.Fatalf("CreateLock = %v; want its refusal, InvalidArgument", err)
	}
	for _, want := range []string{"audit record not written", "action=lock.create", "result=denied", "lock kind must be one of", "corr-10", "disk on fire"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the log does not hold %q:\n%s", want, buf.String())
		}
	}
}

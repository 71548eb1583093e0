package cli

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/store"
)

type failingRecorder struct{ err error }

func (f failingRecorder) Record(context.Context, audit.Event) (store.AuditRecord, error) {
	return store.AuditRecord{}, f.err
}

// TestRefuseStartUnaudited: a refused start whose audit record cannot be
// written still fails with its refusal, says the record is missing, and
// logs it with the refusal's reason. Before, the record's error was
// dropped without a word.
func TestRefuseStartUnaudited(t *testing.T) {
	refusal := errors.New("the PKCS#11 token is not there: see muster custody show")
	var buf bytes.Buffer
	err := refuseStart(t.Context(), failingRecorder{errors.New("disk on fire")}, slog.New(slog.NewTextHandler(&buf, nil)), "auth-1", "key custody", refusal)
	if !errors.Is(err, refusal) || !strings.Contains(err.Error(), "not in the audit chain") || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("refuseStart = %v; want the refusal, saying its record is missing and why", err)
	}
	for _, want := range []string{"refused start not audited", "key custody: the PKCS#11 token is not there", "disk on fire"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the log does not hold %q:\n%s", want, buf.String())
		}
	}
	if err := refuseStart(t.Context(), failingRecorder{}, slog.New(slog.NewTextHandler(&buf, nil)), "auth-1", "key custody", refusal); err != refusal {
		t.Fatalf("refuseStart with its record written = %v; want the refusal as it is", err)
	}
}

// TestRecordFailureUnaudited: a failed command (ca migrate-custody, ca
// root export-key) whose audit record cannot be written still fails with
// its own error and says the record is missing and why. Before, the
// record's error was discarded.
func TestRecordFailureUnaudited(t *testing.T) {
	failure := errors.New("--custody pkcs11:token=LABEL names the token to move the keys into")
	e := audit.Event{Actor: "operator", Action: "ca.migrate_custody", Target: "pkcs11:token=x", Result: audit.ResultError, Reason: "nothing changed"}
	err := recordFailure(t.Context(), failingRecorder{errors.New("disk on fire")}, e, failure)
	if !errors.Is(err, failure) || !strings.Contains(err.Error(), "not in the audit chain") || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("recordFailure = %v; want the failure, saying its record is missing and why", err)
	}
	if err := recordFailure(t.Context(), failingRecorder{}, e, failure); err != failure {
		t.Fatalf("recordFailure with its record written = %v; want the failure as it is", err)
	}
}

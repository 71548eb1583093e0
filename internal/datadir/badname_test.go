package datadir

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestInitSaysWhatBreaksTheOperatorName: muster init --operator Admin is
// refused saying what in the name breaks muster's rule; before, "invalid
// SPIFFE ID".
func TestInitSaysWhatBreaksTheOperatorName(t *testing.T) {
	_, err := Init(context.Background(), InitOptions{Dir: Dir(t.TempDir()), Name: "test", OperatorName: "Admin", Now: time.Now()})
	const want = `--operator "Admin" is not a valid operator name: it has the capital 'A': names are lower-case`
	if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "SPIFFE") {
		t.Fatalf("Init = %v, want it to say %q", err, want)
	}
}

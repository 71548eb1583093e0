package cli

import (
	"github.com/muster-dev/muster/internal/loadgen"
	"strings"
	"testing"
)

// TestPrintBenchSaysWhenTheAuthorityIsNotMeasured: a run given
// --authority without --authority-pid has no authority CPU; the report
// says so and how to get it, instead of leaving cpu_efficiency out
// silently.
func TestPrintBenchSaysWhenTheAuthorityIsNotMeasured(t *testing.T) {
	var b strings.Builder
	printBench(&b, benchReport{Op: "renew", Connection: "new", Concurrency: 1, Authority: "127.0.0.1:1", Run: &loadgen.Outcome{}, Bound: &loadgen.Bound{}})
	if !strings.Contains(b.String(), "Authority:    not measured") || !strings.Contains(b.String(), "--authority-pid PID") {
		t.Errorf("the report does not say the authority was not measured:\n%s", b.String())
	}
}

package enroll

import (
	"strings"
	"testing"
)

// TestCertificateUnknownNamesANode: the join a certificate_unknown
// refusal names always has a node to paste, the leaf's or NODE for the
// operator to fill in, whichever caller refuses (standing check, renewal).
func TestCertificateUnknownNamesANode(t *testing.T) {
	for node, want := range map[string]string{"web-1": "--node web-1 ", "": "--node NODE "} {
		if got := certificateUnknown("0a", node).Detail; !strings.Contains(got, want) {
			t.Errorf("certificateUnknown(%q) = %q, want it to name %q", node, got, want)
		}
	}
}

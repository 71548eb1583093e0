package discovery

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// TestBadNodeNameSaysWhatBreaksIt: a node ID that breaks muster's name
// rule is denied (Admit) or refused (a join report) saying what in it
// breaks it; before, "invalid SPIFFE ID", which the agent never sent.
func TestBadNodeNameSaysWhatBreaksIt(t *testing.T) {
	const want = `node ID "Web_1" is not a valid node name: it has the capital 'W': names are lower-case`
	p := DefaultPolicy()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	err := p.Admit(netip.MustParseAddr("192.0.2.1"), "Web_1")
	var d *Denial
	if !errors.As(err, &d) || d.Reason != DenyInvalid || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "SPIFFE") {
		t.Errorf("Admit = %v, want a %s denial saying %q", err, DenyInvalid, want)
	}
	err = JoinReport{NodeID: "Web_1"}.Verify(nil, nil)
	if err == nil || !strings.Contains(err.Error(), "join report: "+want) || strings.Contains(err.Error(), "SPIFFE") {
		t.Errorf("Verify = %v, want it to say %q", err, want)
	}
}

package enroll

import (
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/ca"
)

// A certificate the store has no record of (the store restored from a
// backup taken before it was issued) is refused, on the stream (Standing)
// as at a renewal, with the way out in the audit record: the join over
// this identity, for the node the certificate names.
func TestCertificateUnknownNamesTheJoin(t *testing.T) {
	issued := newEnv(t, nil)
	tok := issued.token(t, 1)
	_, der := csr(t)
	joined, err := issued.svc.ExchangeJoinToken(t.Context(), Request{}, tok.Reveal(), "n1", der)
	if err != nil {
		t.Fatal(err)
	}
	chain, _ := ca.ParseCertsPEM(joined.ChainPEM)
	// The same CA, a store that never issued it.
	restored := newEnv(t, nil)
	const want = "join again over this identity: muster agent join --force --data ADIR --node n1 with a joining URI from muster token create --node n1"
	for name, err := range map[string]error{
		"stream": restored.svc.Standing(t.Context(), chain[0]),
		"renewal": func() error {
			_, der := csr(t)
			_, err := restored.svc.Renew(t.Context(), Request{}, chain[0], der)
			return err
		}(),
	} {
		wantRefusal(t, err, KindPermissionDenied, ReasonCertificateUnknown)
		if ref := err.(*Refusal); !strings.Contains(ref.AuditText(), want) {
			t.Errorf("%s: audit text %q, want %q", name, ref.AuditText(), want)
		}
	}
	restored.audit.mu.Lock()
	defer restored.audit.mu.Unlock()
	if n := len(restored.audit.refused); n != 1 || !strings.Contains(restored.audit.refused[0].Reason, want) {
		t.Errorf("renewal refusals audited: %+v, want one naming %q", restored.audit.refused, want)
	}
}

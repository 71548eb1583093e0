package cli

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/spiffeid"
)

func TestExpiryWarning(t *testing.T) {
	now := time.Now()
	h, err := ca.Create("test", now)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := spiffeid.New("td", spiffeid.RoleAdmin, "alice")
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	op, err := datadir.IssueOperator(h.Issuer(ca.RoleAdmin), h.Root, id, key, 30*24*time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	notAfter := op.Leaf().NotAfter
	for _, tc := range []struct {
		name string
		at   time.Time
		want string // "" for no warning
	}{
		{"far", now, ""},
		{"just outside 7 days", notAfter.Add(-operatorWarnAhead - time.Minute), ""},
		{"within 7 days", notAfter.Add(-operatorWarnAhead + time.Minute), "in 6d23h; renew it with muster admin renew"},
		{"minutes left", notAfter.Add(-90 * time.Second), "in 1m30s; renew it with muster admin renew --identity alice.pem"},
		{"expired", notAfter.Add(time.Second), "expired at " + notAfter.UTC().Format(time.RFC3339) + "; another operator issues a new one with muster admin add alice --out alice-new.pem, or, where the authority's data directory is, muster admin add alice --offline --data DIR --out alice-new.pem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := expiryWarning("alice.pem", op, "alice", "", " --identity alice.pem", tc.at)
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("expiryWarning = %q, want %q", got, tc.want)
			}
		})
	}
}

package authority

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/store"
)

// replicatedAs is a store that says whether it is replicated, and
// nothing else (the refusal reads no more of it).
type replicatedAs struct {
	store.Store
	replicated bool
}

func (r replicatedAs) Replicated() bool { return r.replicated }

// TestUnheldIssuerNamesTheRestoreSectionOfItsStore: the issuer_unknown
// refusal names the section on restoring the store in use, the operator
// guide's SQLite one on SQLite (before: high-availability's "Backup and
// restore", a pg_restore walk, on both), and the section named exists.
func TestUnheldIssuerNamesTheRestoreSectionOfItsStore(t *testing.T) {
	now := time.Now()
	held, err := ca.Create("restored", now.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	// The intermediates the backup's store lacked: same names, other keys.
	lost, err := ca.Create("restored", now.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(role ca.Role, id string) []*x509.Certificate {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		u, _ := url.Parse(id)
		c, err := lost.Issuer(role).Issue(ca.LeafRequest{PublicKey: key.Public(), SPIFFEID: u, CommonName: "n", ClientAuth: true, NotBefore: now, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return []*x509.Certificate{c}
	}
	for _, tc := range []struct {
		replicated bool
		want       string
	}{
		{false, `docs/operator-guide.md, "Backing up and restoring the SQLite store"`},
		{true, `docs/high-availability.md, "Backup and restore"`},
	} {
		s := &Server{info: datadir.Info{TrustDomain: "td"}, ca: held, store: replicatedAs{replicated: tc.replicated}}
		for _, certs := range [][]*x509.Certificate{leaf(ca.RoleAgent, "spiffe://td/agent/web-1"), leaf(ca.RoleAdmin, "spiffe://td/admin/alice")} {
			got := s.unheldIssuerReason(certs)
			if !strings.Contains(got, "("+tc.want+")") {
				t.Errorf("replicated %v: refusal %q, want it to name %s", tc.replicated, got, tc.want)
			}
		}
		docSectionExists(t, tc.want)
	}
}

// docSectionExists fails t unless ref (`docs/FILE.md, "Heading"`) names a
// heading of that file.
func docSectionExists(t *testing.T, ref string) {
	t.Helper()
	m := regexp.MustCompile(`^(docs/[a-z-]+\.md), "(.+)"$`).FindStringSubmatch(ref)
	if m == nil {
		t.Fatalf("%q names no docs section", ref)
	}
	f, err := os.Open("../../" + m[1])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if h := strings.TrimLeft(sc.Text(), "#"); h != sc.Text() && strings.TrimSpace(h) == m[2] {
			return
		}
	}
	t.Errorf("%s has no section %q", m[1], m[2])
}

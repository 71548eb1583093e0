package e2e

import (
	"bytes"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store/pgtest"
)

// TestCRLServedThroughAHungDatabase: with its PostgreSQL hung, an
// authority that read a list serves its copy, before the list's
// nextUpdate, rather than 503, counts it in muster_crl_served_copy_total
// and says so in its log. Before, each fetch read the store and got 503
// once the store's deadline (2 s here) passed, so relying parties that
// fail closed refused every agent.
func TestCRLServedThroughAHungDatabase(t *testing.T) {
	t.Parallel()
	own, url, dir := ownPostgres(t, (*pgtest.Server).Thaw)
	crlAddr := freePort(t)
	base := "http://" + crlAddr
	e := &agentEnv{dir: dir, auth: startAuthority(t, dir, "--store", url, "--store-timeout", "2s", "--crl-listen", crlAddr, "--crl-url", base)}
	adir := filepath.Join(t.TempDir(), "n1")
	if r := muster(t, nil, "agent", "join", "--data", adir, "--node", "n1", e.createToken(t).URI); r.code != 0 {
		t.Fatalf("agent join: exit %d\n%s", r.code, r.stderr)
	}
	inter := readCerts(t, filepath.Join(adir, "certs", "agent.crt"))[1]
	crlURL := base + "/crl/agent-" + inter.SerialNumber.Text(16) + ".crl"
	_, before := fetchCRL(t, crlURL, inter)

	if err := own.Freeze(); err != nil {
		t.Fatal(err)
	}
	// Thawed before the database is dropped, should the test stop here.
	t.Cleanup(func() { own.Thaw() })
	// Every fetch gets the list read before; the first past the second
	// within which the copy is served without asking reads the store,
	// which does not answer, and gets the copy.
	waitFor(t, 30*time.Second, "a fetch answered with the copy", func() bool {
		resp, err := crlClient.Get(crlURL)
		if err != nil {
			t.Fatal(err)
		}
		der, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !bytes.Equal(der, before) {
			t.Fatalf("a fetch with the database hung: %s %q, want the list read before", resp.Status, der)
		}
		m := metricsOf(t, e.auth.metrics)
		return strings.Contains(m, "\nmuster_crl_served_copy_total ") && !strings.Contains(m, "\nmuster_crl_served_copy_total 0\n")
	})
	// Logged when the read fails (the store's deadline), which may come
	// after a fetch had the copy at crlCopyWait: waited for, not assumed.
	waitFor(t, 30*time.Second, "the authority saying it serves its copy", func() bool {
		return strings.Contains(e.auth.Logs(), "serving this replica's copy of a certificate revocation list")
	})
	if err := own.Thaw(); err != nil {
		t.Fatal(err)
	}
}

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/workloadapi"
)

// A bound-keypair agent whose certificate expires while the authority is
// away keeps running to recover with its bound key; meanwhile its
// Workload API serves no SVID (a new FetchX509SVID waits), as the docs
// say of an expired certificate, rather than the expired one, which no
// peer accepts. Before, the snapshot loaded before the expiry stayed
// current and every new caller was handed it.
func TestWorkloadAPIServesNoExpiredSVID(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t, "--agent-cert-ttl", "8s")
	adir := filepath.Join(t.TempDir(), "agent")
	pubLine := strings.TrimSpace(mustRun(t, "keypair", "create", "--data", adir))
	keyFile := filepath.Join(t.TempDir(), "bot.pub")
	if err := os.WriteFile(keyFile, []byte(pubLine+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "bot", "add", "lapse", "--public-key", keyFile, "--data", e.dir)
	mustRun(t, "agent", "join", "--data", adir, "--bound-keypair", "lapse", "--authority", e.auth.addr, "--ca-fingerprint", e.fingerprint)

	sock := filepath.Join(socketDir(t), "agent.sock")
	addr := workloadapi.WithAddr("unix://" + sock)
	startProc(t, "agent", "agent started", "agent", "run", "--data", adir, "--log-format", "json",
		"--workload-api", "unix://"+sock)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := workloadapi.FetchX509SVID(ctx, addr); err != nil {
		t.Fatalf("the SVID before the authority stops: %v", err)
	}

	e.auth.stop(t)
	// The SVID last served before the stop expires within the 8 s
	// lifetime; one refreshed just before the stop may still be pushed,
	// so the one served is looked at again once it has expired.
	for {
		svid, err := workloadapi.FetchX509SVID(ctx, addr)
		if err != nil {
			t.Fatalf("the SVID after the authority stopped: %v", err)
		}
		notAfter := svid.Certificates[0].NotAfter
		if !time.Now().Before(notAfter) {
			t.Fatalf("an agent whose certificate expired at %s served it at %s", notAfter.UTC().Format(time.RFC3339),
				time.Now().UTC().Format(time.RFC3339))
		}
		time.Sleep(time.Until(notAfter) + time.Second)
		fctx, fcancel := context.WithTimeout(ctx, 3*time.Second)
		svid, err = workloadapi.FetchX509SVID(fctx, addr)
		fcancel()
		if err != nil {
			if fctx.Err() == nil {
				t.Fatalf("FetchX509SVID after the expiry: %v, want it to wait for a certificate", err)
			}
			return
		}
		if got := svid.Certificates[0].NotAfter; !time.Now().Before(got) {
			t.Fatalf("an agent whose certificate expired at %s served it at %s", got.UTC().Format(time.RFC3339),
				time.Now().UTC().Format(time.RFC3339))
		}
		if ctx.Err() != nil {
			t.Fatal(ctx.Err())
		}
	}
}

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
)

// TestWorkloadAPIJWTSVIDsAcrossRenewals: an agent with 4-second
// certificates renews every 2 seconds while a workload fetches a JWT-SVID
// for a new audience (a mint at the authority) after each renewal. Every
// renewal succeeds and the authority closes no connection of the agent
// for holding past its share (8). Before, the JWT-SVID connection each
// renewal replaced stayed open two call timeouts (60 s): the eighth
// renewal's connection was closed after its handshake ("a client identity
// holds its cap of open connections") and the agent logged "renewal
// failed; retrying" until old connections aged out.
func TestWorkloadAPIJWTSVIDsAcrossRenewals(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 80*time.Second)
	defer cancel()
	e := newAgentEnv(t, "--agent-cert-ttl", "4s")
	adir := joinedAgent(t, e, "minter")
	sock := filepath.Join(socketDir(t), "agent.sock")
	agent, _ := startProc(t, "agent", "agent started", "agent", "run", "--data", adir, "--log-format", "json", "--workload-api", "unix://"+sock)
	client, err := workloadapi.New(ctx, workloadapi.WithAddr("unix://"+sock))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	generation := func() int {
		g, _ := agentStatus(t, adir)["generation"].(float64)
		return int(g)
	}
	last := generation()
	for i := 0; last < 14; i++ {
		if ctx.Err() != nil {
			t.Fatalf("the agent renewed to generation %d only, want 14", last)
		}
		if g := generation(); g != last {
			last = g
			if _, err := client.FetchJWTSVID(ctx, jwtsvid.Params{Audience: fmt.Sprint("aud-", i)}); err != nil {
				t.Fatalf("FetchJWTSVID after renewal to generation %d: %v", g, err)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	m := metricsOf(t, e.auth.metrics)
	if strings.Contains(m, `muster_connections_refused_total{listener="api",reason="identity"}`) {
		t.Errorf("the authority closed connections of the agent past its share:\n%s", grepLines(m, "muster_connections_refused_total{"))
	}
	checkNoRefusedRenewal(t, m, "while minting JWT-SVIDs", true)
	if logs := agent.Logs(); strings.Contains(logs, "renewal failed") {
		t.Errorf("the agent logged a failed renewal:\n%s", grepLines(logs, "renewal failed"))
	}
}

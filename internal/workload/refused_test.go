package workload

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// stubJWT mints a fixed token.
type stubJWT struct{}

func (stubJWT) JWTSVID(context.Context, []string) (string, time.Time, error) {
	return "token", time.Now().Add(time.Minute), nil
}
func (stubJWT) JWTBundle(context.Context) ([]byte, map[string]time.Duration, error) {
	return []byte(`{"keys":[]}`), nil, nil
}

// lockedBuffer is a log sink safe for the server's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestOtherSPIFFEIDRefusedAndCounted: a JWT-SVID asked for an identity
// the agent does not serve is refused PERMISSION_DENIED naming the one it
// serves, and counted and logged with the caller's UID like the
// admission refusals (it was neither).
func TestOtherSPIFFEIDRefusedAndCounted(t *testing.T) {
	h := &holder{id: newIdentity(t, "td", 1)}
	src := NewSource(h.load, slog.New(slog.DiscardHandler))
	src.Reload()
	reg := prometheus.NewRegistry()
	var logs lockedBuffer
	addr := serve(t, src, Config{AllowUIDs: []uint32{uint32(os.Geteuid())}, JWT: stubJWT{}, Registerer: reg,
		Log: slog.New(slog.NewTextHandler(&logs, nil))}, 0o600)
	c := dialRaw(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.FetchJWTSVID(withHeader(ctx), &workloadpb.JWTSVIDRequest{Audience: []string{"db"}}); err != nil {
		t.Fatalf("a mint of the agent's own ID: %v", err)
	}
	_, err := c.FetchJWTSVID(withHeader(ctx), &workloadpb.JWTSVIDRequest{Audience: []string{"db"}, SpiffeId: "spiffe://td/agent/other"})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), "spiffe://td/agent/web-1") {
		t.Fatalf("a mint of another ID: %v, want PERMISSION_DENIED naming the served ID", err)
	}
	mf, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got float64
	for _, f := range mf {
		if f.GetName() != "muster_agent_workload_api_refusals_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == "other_spiffe_id" {
					got = m.GetCounter().GetValue()
				}
			}
		}
	}
	if got != 1 {
		t.Errorf("refusals{reason=other_spiffe_id} = %v, want 1", got)
	}
	if l := logs.String(); !strings.Contains(l, "other_spiffe_id") || !strings.Contains(l, "uid=") {
		t.Errorf("no log line of the refusal with the caller's UID:\n%s", l)
	}
}

package authority

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/muster-dev/muster/internal/h2window"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestCallsPerSourceCapped: with limits.max_calls_per_source 3, three
// calls whose request never comes hold the source's places; a fourth
// call of any kind from that source is refused RESOURCE_EXHAUSTED before
// its request is read, naming the setting, and audited with its source;
// an agent stream is not counted; another source is not affected; and a
// place is given back when its call ends. Before, one source could hold
// 100 calls on each of its 256 connections.
func TestCallsPerSourceCapped(t *testing.T) {
	const limit = 3
	a := startReplicas(t, nil, 1, func(c *Config) { c.MaxCallsPerSource = limit; c.CallTimeout = time.Hour })
	const wait = 10 * time.Second
	unary := "/" + musterv1.BootstrapService_ServiceDesc.ServiceName + "/" + musterv1.BootstrapService_ServiceDesc.Methods[0].MethodName

	var ends []context.CancelFunc
	for range limit {
		ctx, cancel := context.WithCancel(t.Context())
		ends = append(ends, cancel)
		// The headers go out at once; the request never does.
		cs, err := a.conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, unary)
		if err != nil {
			t.Fatal(err)
		}
		go cs.RecvMsg(&emptypb.Empty{})
	}
	defer func() {
		for _, end := range ends {
			end()
		}
	}()
	health := healthpb.NewHealthClient(a.conn)
	check := func(c healthpb.HealthClient) error {
		ctx, cancel := context.WithTimeout(t.Context(), wait)
		defer cancel()
		_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	// The held calls reach the server in their own time: the refusal
	// comes once all three are counted.
	var err error
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if err = check(health); err != nil {
			break
		}
	}
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "raise limits.max_calls_per_source") {
		t.Fatalf("a call past the source's %d in flight: %v, want RESOURCE_EXHAUSTED naming limits.max_calls_per_source", limit, err)
	}

	// An agent stream is not counted: an anonymous one is refused by
	// authorization, not by the cap.
	cs, err := musterv1.NewAgentServiceClient(a.conn).Connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Recv(); status.Code(err) != codes.Unauthenticated {
		t.Errorf("an agent stream at the source's cap: %v, want UNAUTHENTICATED (not counted)", err)
	}

	// Another source (127.0.0.2) has places of its own.
	want, _ := spiffeid.New(a.td, spiffeid.RoleAuthority, a.info.AuthorityID)
	other, err := grpc.NewClient(a.conn.Target(), append(h2window.DialOptions(),
		grpc.WithTransportCredentials(credentials.NewTLS(identity.ClientTLS(nil, a.h.RootPool(), identity.MatchID(want)))),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
			return d.DialContext(ctx, "tcp", addr)
		}))...)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := check(healthpb.NewHealthClient(other)); err != nil {
		t.Errorf("a call from another source while the first is at its cap: %v", err)
	}

	// A call that ends gives its place back.
	ends[0]()
	for deadline := time.Now().Add(wait); ; time.Sleep(10 * time.Millisecond) {
		if err = check(health); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Errorf("a call after one of the held calls ended: %v", err)
	}

	var found bool
	for deadline := time.Now().Add(wait); !found && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		recs, err := a.store.ListAudit(t.Context(), store.AuditFilter{Action: "api.access"})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			found = found || strings.Contains(r.Reason, "limits.max_calls_per_source (3)") && r.Result == "denied" && r.Source == "127.0.0.1" && r.Target == healthpb.Health_Check_FullMethodName
		}
	}
	if !found {
		t.Error("the refusal was not audited with its source, method and the setting")
	}
}

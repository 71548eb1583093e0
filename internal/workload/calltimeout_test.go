package workload

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// TestUnaryCallEndsAtCallTimeout: a unary call whose request never comes
// ends DEADLINE_EXCEEDED at Config.CallTimeout; before, it was held for
// as long as its connection, uncounted among its UID's streams.
func TestUnaryCallEndsAtCallTimeout(t *testing.T) {
	h := &holder{id: newIdentity(t, "td", 1)}
	src := NewSource(h.load, slog.New(slog.DiscardHandler))
	src.Reload()
	addr := serve(t, src, Config{AllowUIDs: []uint32{uint32(os.Geteuid())}, CallTimeout: 300 * time.Millisecond}, 0o600)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(withHeader(t.Context()))
	defer cancel()
	method := "/" + workloadpb.SpiffeWorkloadAPI_ServiceDesc.ServiceName + "/FetchJWTSVID"
	cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- cs.RecvMsg(&emptypb.Empty{}) }()
	select {
	case err := <-got:
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("a request never sent: %v, want DEADLINE_EXCEEDED", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("a request never sent was still waited for after 10 s")
	}
}

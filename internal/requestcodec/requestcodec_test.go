package requestcodec

import (
	"testing"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

func TestCodec(t *testing.T) {
	good, err := proto.Marshal(&musterv1.ExchangeJoinTokenRequest{NodeId: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	garbage := []byte{0xff, 0xff, 0xff}
	tests := []struct {
		name         string
		data         []byte
		msg          proto.Message
		wantErr      bool
		wantUnparsed bool
	}{
		{"a muster request", good, &musterv1.ExchangeJoinTokenRequest{}, false, false},
		{"a muster request that does not parse", garbage, &musterv1.ExchangeJoinTokenRequest{}, false, true},
		{"another package's message that does not parse", garbage, &healthpb.HealthCheckRequest{}, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := New().Unmarshal(mem.BufferSlice{mem.SliceBuffer(tt.data)}, tt.msg)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Unmarshal: %v, want error %v", err, tt.wantErr)
			}
			if got := Unparsed(tt.msg); got != tt.wantUnparsed {
				t.Fatalf("Unparsed = %v, want %v", got, tt.wantUnparsed)
			}
			if Unparsed(tt.msg) {
				t.Fatal("Unparsed is true a second time: the entry was not forgotten")
			}
		})
	}
}

func TestUnknownMethodReason(t *testing.T) {
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, healthpb.UnimplementedHealthServer{})
	tests := []struct{ method, want string }{
		{"/grpc.health.v1.Health/Nope", "unknown method Nope for service grpc.health.v1.Health"},
		{"/other.Service/Call", "unknown service other.Service"},
		{"garbage", "unknown method"},
	}
	for _, tt := range tests {
		if got := UnknownMethodReason(gs, tt.method); got != tt.want {
			t.Errorf("UnknownMethodReason(%q) = %q, want %q", tt.method, got, tt.want)
		}
	}
}

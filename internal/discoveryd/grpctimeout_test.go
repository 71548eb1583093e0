package discoveryd

import (
	"math"
	"testing"
	"time"
)

func TestGRPCTimeout(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"30S", 30 * time.Second, true},
		{"100m", 100 * time.Millisecond, true},
		{"1H", time.Hour, true},
		{"99999999n", 99999999, true},
		{"99999999H", math.MaxInt64, true}, // overflows a Duration: the longest, not negative
		{"2562048H", math.MaxInt64, true},  // the first hour count past the longest Duration
		{"", 0, false},
		{"S", 0, false},
		{"123456789S", 0, false}, // nine digits
		{"-1S", 0, false},
		{"10x", 0, false},
		{"1.5S", 0, false},
	}
	for _, tt := range tests {
		got, ok := grpcTimeout(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("grpcTimeout(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

// FuzzGRPCTimeout: a grpc-timeout header, from any caller, is never read
// as a negative duration (which would pass for shorter than the call
// timeout and keep the caller's), and a value read has gRPC's form.
func FuzzGRPCTimeout(f *testing.F) {
	for _, s := range []string{"30S", "99999999H", "1m", "", "-1S", "0n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := grpcTimeout(v)
		if !ok {
			return
		}
		if d < 0 {
			t.Fatalf("grpcTimeout(%q) = %v: negative", v, d)
		}
		if len(v) < 2 || len(v) > 9 {
			t.Fatalf("grpcTimeout(%q) read a value of %d bytes", v, len(v))
		}
	})
}

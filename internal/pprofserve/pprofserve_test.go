package pprofserve

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
)

func TestCheckAddr(t *testing.T) {
	for _, tt := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:6060", true}, {"127.0.0.2:0", true}, {"[::1]:6060", true}, {"localhost:6060", true},
		{":6060", false}, {"0.0.0.0:6060", false}, {"[::]:6060", false}, {"10.0.0.1:6060", false},
		{"example.com:6060", false}, {"127.0.0.1", false}, {"", false}, {"[::ffff:10.0.0.1]:1", false},
	} {
		err := CheckAddr(tt.addr)
		if (err == nil) != tt.ok {
			t.Errorf("CheckAddr(%q) = %v, want ok %v", tt.addr, err, tt.ok)
		}
		if err != nil && tt.addr != "" && tt.addr != "127.0.0.1" && !errors.Is(err, ErrNotLoopback) {
			t.Errorf("CheckAddr(%q) = %v, want ErrNotLoopback", tt.addr, err)
		}
	}
}

func TestServe(t *testing.T) {
	lis, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, lis) }()
	resp, err := http.Get("http://" + lis.Addr().String() + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(body) == 0 {
		t.Errorf("goroutine profile: %d, %d bytes", resp.StatusCode, len(body))
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve after cancel = %v", err)
	}
}

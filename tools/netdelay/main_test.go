package main

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// TestServeDelaysEachWay: an echo through the proxy comes back whole and
// no sooner than two delays.
func TestServeDelaysEachWay(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const delay = 20 * time.Millisecond
	go serve(l, echo.Addr().String(), delay)

	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := bytes.Repeat([]byte("muster "), 10000)
	start := time.Now()
	go func() { c.Write(msg); c.(*net.TCPConn).CloseWrite() }()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 2*delay {
		t.Errorf("echo took %v, want at least %v", took, 2*delay)
	}
	if !bytes.Equal(got, msg) {
		t.Errorf("echo: %d bytes back, want the %d sent", len(got), len(msg))
	}
}

package httpserve

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// serve runs NewServer(h, tm) on a loopback listener for the test's
// length and returns its address.
func serve(t *testing.T, h http.Handler, tm Timeouts) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, lis, NewServer(h, tm)) }()
	t.Cleanup(func() { cancel(); <-done })
	return lis.Addr().String()
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })

// TestServe: the handler answers while the context lasts, and Serve
// returns nil once it ends.
func TestServe(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, lis, NewServer(ok, Default)) }()
	resp, err := http.Get("http://" + lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ok" {
		t.Fatalf("answered %q", b)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve after the context ended: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after the context ended")
	}
}

// closedWithin fails the test unless the server closes c within d (it
// reads and drops whatever the server sends first).
func closedWithin(t *testing.T, c net.Conn, d time.Duration, what string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: the server still held the connection after %s", what, d)
	}
}

// TestConnectionsHeldBriefly: a connection that keeps its place by
// saying nothing after one request, by sending its headers or its body
// slowly, is closed by the server at its timeout; headers past
// MaxHeaderBytes are refused. Before, the servers set only a header
// timeout, so a kept-alive connection after one request, or a body
// never sent, held one of the metrics listener's 64 places for good.
func TestConnectionsHeldBriefly(t *testing.T) {
	tm := Timeouts{ReadHeader: 200 * time.Millisecond, Read: 300 * time.Millisecond, Write: 300 * time.Millisecond, Idle: 200 * time.Millisecond}
	addr := serve(t, ok, tm)
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	const wait = 5 * time.Second

	// Idle after one request, kept alive.
	c := dial()
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	closedWithin(t, c, wait, "idle after a request")

	// Headers never finished.
	c = dial()
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n")
	closedWithin(t, c, wait, "headers never finished")

	// A body announced and never sent.
	c = dial()
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nabc")
	closedWithin(t, c, wait, "a body never sent")

	// Headers past MaxHeaderBytes.
	c = dial()
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", 2*MaxHeaderBytes))
	resp, err = http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("headers of %d bytes: %s, want 431", 2*MaxHeaderBytes, resp.Status)
	}
}

// TestAnswerNotReadIsEnded: a client that never reads a large answer
// holds the server's write only until the write timeout: the handler's
// write fails then, and the connection is closed.
func TestAnswerNotReadIsEnded(t *testing.T) {
	wrote := make(chan error, 1)
	big := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		chunk := make([]byte, 64<<10)
		for range 1 << 12 { // 256 MiB, more than any socket buffers
			if _, err := w.Write(chunk); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	})
	addr := serve(t, big, Timeouts{ReadHeader: time.Second, Write: 300 * time.Millisecond, Idle: time.Second})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetReadBuffer(4 << 10)
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	select {
	case err := <-wrote:
		if err == nil {
			t.Fatal("256 MiB were written to a client that read nothing")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server still wrote to a client that read nothing after 10 s")
	}
}

// TestStreamingKeepsLongAnswers: Streaming does not cut an answer that
// takes longer than Default's timeouts would allow here (pprof's
// ?seconds=), and still closes an idle connection.
func TestStreamingKeepsLongAnswers(t *testing.T) {
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(500 * time.Millisecond):
			io.WriteString(w, "done")
		case <-r.Context().Done():
		}
	})
	tm := Streaming
	tm.Idle = 200 * time.Millisecond
	addr := serve(t, slow, tm)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "done" {
		t.Fatalf("answered %q", b)
	}
	closedWithin(t, c, 5*time.Second, "idle after a long answer")
}

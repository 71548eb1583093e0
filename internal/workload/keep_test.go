package workload

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
)

// A socket whose directory is removed while the API serves it (a cleaner
// of /tmp or /run, an operator's rm -r) is made again: a caller that
// connects afterwards gets the SVID, the socket has its mode again, and
// the stream opened before keeps working.
func TestSocketRemovedIsMadeAgain(t *testing.T) {
	h := &holder{id: newIdentity(t, "td", 1)}
	src := NewSource(h.load, slog.New(slog.DiscardHandler))
	src.Reload()
	base := shortTempDir(t)
	sock := Socket{Path: filepath.Join(base, "run", "agent.sock"), Mode: 0o600, UID: -1, GID: -1}
	ctx, cancel := context.WithCancel(context.Background())
	done := serveSocket(ctx, t, src, sock)
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if _, err := os.Lstat(sock.Path); !os.IsNotExist(err) {
			t.Errorf("the socket is left behind after Serve: %v", err)
		}
	})
	addr := "unix://" + sock.Path

	tctx, tcancel := context.WithTimeout(ctx, 60*time.Second)
	defer tcancel()
	before, err := dialRaw(t, addr).FetchX509SVID(withHeader(tctx), &workloadpb.X509SVIDRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := before.Recv(); err != nil {
		t.Fatal(err)
	}

	if err := os.RemoveAll(filepath.Dir(sock.Path)); err != nil {
		t.Fatal(err)
	}
	for {
		fi, err := os.Lstat(sock.Path)
		if err == nil && fi.Mode().Type() == os.ModeSocket {
			if fi.Mode().Perm() != sock.Mode {
				t.Fatalf("socket made again with mode %v, want %v", fi.Mode().Perm(), sock.Mode)
			}
			break
		}
		if tctx.Err() != nil {
			t.Fatal("the removed socket was not made again")
		}
		time.Sleep(50 * time.Millisecond)
	}
	after, err := dialRaw(t, addr).FetchX509SVID(withHeader(tctx), &workloadpb.X509SVIDRequest{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := after.Recv()
	if err != nil || len(resp.Svids) != 1 {
		t.Fatalf("a caller after the socket was made again: %v %v", resp, err)
	}

	// The stream from before still gets pushes.
	h.set(newIdentity(t, "td", 2))
	src.Reload()
	if resp, err := before.Recv(); err != nil || len(resp.Svids) != 1 {
		t.Fatalf("the stream opened before the removal: %v %v", resp, err)
	}
}

// A file another put at the socket's path while the API served (another
// agent's socket, after an operator removed this one's) is left alone
// when the API stops: the agent removes only the socket it made.
func TestSocketReplacedIsLeftAtStop(t *testing.T) {
	h := &holder{id: newIdentity(t, "td", 1)}
	src := NewSource(h.load, slog.New(slog.DiscardHandler))
	src.Reload()
	base := shortTempDir(t)
	sock := Socket{Path: filepath.Join(base, "agent.sock"), Mode: 0o600, UID: -1, GID: -1}
	ctx, cancel := context.WithCancel(context.Background())
	done := serveSocket(ctx, t, src, sock)
	// Replaced in one step, so that the path is never missing and the
	// agent never makes its socket again.
	other := filepath.Join(base, "other")
	if err := os.WriteFile(other, []byte("not the agent's"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(other, sock.Path); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if b, err := os.ReadFile(sock.Path); err != nil || string(b) != "not the agent's" {
		t.Errorf("the file put at the socket's path: %q, %v after the API stopped; want it left", b, err)
	}
}

// shortTempDir is a directory under /tmp, whose paths stay within a unix
// socket's 108 bytes (t.TempDir's may not).
func shortTempDir(t *testing.T) string {
	t.Helper()
	base, err := os.MkdirTemp("", "wapi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	return base
}

// serveSocket serves src at sock, kept (Config.Socket), until ctx ends;
// Serve's result arrives on the channel.
func serveSocket(ctx context.Context, t *testing.T, src *Source, sock Socket) <-chan error {
	t.Helper()
	lis, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- NewServer(src, Config{AllowUIDs: []uint32{uint32(os.Geteuid())}, Socket: &sock}).Serve(ctx, lis)
	}()
	return done
}

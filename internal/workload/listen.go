package workload

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ParseAddr returns the socket path of a Workload API address:
// unix:///run/muster/agent.sock (or unix:/path), the form of
// SPIFFE_ENDPOINT_SOCKET. Only Unix sockets are served: a TCP caller has
// no credentials to check.
func ParseAddr(addr string) (string, error) {
	u, err := url.Parse(addr)
	if err != nil {
		return "", fmt.Errorf("workload api address %q: %v", addr, err)
	}
	if u.Scheme != "unix" {
		return "", fmt.Errorf("workload api address %q: want unix:///PATH (only Unix sockets are served)", addr)
	}
	if u.Opaque != "" || u.Host != "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		return "", fmt.Errorf("workload api address %q: want unix:///PATH with an absolute path and nothing else", addr)
	}
	p := u.Path
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("workload api address %q: the socket path must be absolute and clean", addr)
	}
	return p, nil
}

// ParseMode reads a socket mode such as 0660 (octal); only permission
// bits are taken.
func ParseMode(s string) (fs.FileMode, error) {
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o777 {
		return 0, fmt.Errorf("socket mode %q: want octal permission bits such as 0660", s)
	}
	return fs.FileMode(m), nil
}

// Socket is where and how the API listens.
type Socket struct {
	Path string
	Mode fs.FileMode
	// UID and GID own the socket; -1 leaves the agent's.
	UID, GID int
}

// Listen creates the socket: its directory if missing (0755), a stale
// socket of an earlier run removed (never another kind of file), then
// the mode and owner set. Callers are checked by their credentials on
// every connection anyway, so the moment between creating and chmod is
// no gap.
func Listen(s Socket) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(s.Path), 0o755); err != nil {
		return nil, fmt.Errorf("workload api socket: %w", err)
	}
	if fi, err := os.Lstat(s.Path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("workload api socket: %s exists and is not a socket; remove it or choose another path", s.Path)
		}
		if c, err := net.Dial("unix", s.Path); err == nil {
			c.Close()
			return nil, fmt.Errorf("workload api socket: %s is served by another process (another agent?)", s.Path)
		}
		if err := os.Remove(s.Path); err != nil {
			return nil, fmt.Errorf("workload api socket: removing the stale %s: %w", s.Path, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("workload api socket: %w", err)
	}
	lis, err := net.Listen("unix", s.Path)
	if err != nil {
		return nil, fmt.Errorf("workload api socket: %w", err)
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(true)
	if err := os.Chmod(s.Path, s.Mode); err != nil {
		lis.Close()
		return nil, fmt.Errorf("workload api socket: %w", err)
	}
	if s.UID >= 0 || s.GID >= 0 {
		if err := os.Lchown(s.Path, s.UID, s.GID); err != nil {
			lis.Close()
			return nil, fmt.Errorf("workload api socket: setting its owner: %w", err)
		}
	}
	made, err := os.Lstat(s.Path)
	if err != nil {
		lis.Close()
		return nil, fmt.Errorf("workload api socket: %w", err)
	}
	return &listener{lis.(*net.UnixListener), made}, nil
}

// listener is a socket Listen made and the file it made at its path:
// the path may hold another's file later, which its Close must not
// unlink (keep).
type listener struct {
	*net.UnixListener
	made os.FileInfo
}

// keepInterval is how often a served socket's path is looked at.
var keepInterval = time.Second

// keep makes the socket again, and hands each new listener to serve,
// whenever its path is found missing while lis serves it, until ctx ends:
// a cleaner of /tmp or /run, or an operator removing its directory, leaves
// the agent accepting on a socket no new caller can reach by its path,
// and nothing else would say so. A path taken by another file is not
// touched: that is logged, once.
func (s *Server) keep(ctx context.Context, sock Socket, lis net.Listener, serve func(net.Listener)) {
	cur, _ := lis.(*listener)
	var held os.FileInfo
	if cur != nil {
		held = cur.made
	}
	defer func() {
		// The listener's Close unlinks the path, whatever is there by
		// then: not a file another put there.
		if fi, err := os.Lstat(sock.Path); cur != nil && (err != nil || !os.SameFile(fi, cur.made)) {
			cur.SetUnlinkOnClose(false)
		}
	}()
	var lastErr string
	once := func(msg string, args ...any) {
		if msg != lastErr {
			lastErr = msg
			s.log.Warn(msg, args...)
		}
	}
	t := time.NewTicker(keepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fi, err := os.Lstat(sock.Path)
		switch {
		case err == nil && held != nil && os.SameFile(fi, held):
			lastErr = ""
			continue
		case err == nil:
			once("workload api: the socket's path is now another file, which the agent leaves alone: callers reach it, not this agent; remove it and the agent makes its socket again", "path", sock.Path)
			continue
		case !errors.Is(err, fs.ErrNotExist):
			once("workload api: cannot look at the socket's path", "path", sock.Path, "err", err)
			continue
		}
		nl, err := Listen(sock)
		if err != nil {
			once("workload api: the socket was removed and cannot be made again, so no new caller can connect; the agent tries again every second", "path", sock.Path, "err", err)
			continue
		}
		lastErr = ""
		// The old listener must not remove the new socket when it is
		// closed at the end.
		if cur != nil {
			cur.SetUnlinkOnClose(false)
		}
		cur = nl.(*listener)
		held = cur.made
		s.log.Warn("workload api: the socket was removed while the agent served it; made it again", "path", sock.Path)
		serve(nl)
	}
}

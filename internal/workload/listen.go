package workload

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
	return lis, nil
}

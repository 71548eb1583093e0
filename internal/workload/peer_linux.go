package workload

import (
	"errors"
	"net"

	"golang.org/x/sys/unix"
)

// PeerCredsSupported reports whether callers' credentials can be read
// here (SO_PEERCRED).
const PeerCredsSupported = true

func peerCredsOf(conn net.Conn) (Creds, error) {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return Creds{}, errors.New("not a Unix socket connection")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return Creds{}, err
	}
	var (
		cred *unix.Ucred
		gerr error
	)
	if err := raw.Control(func(fd uintptr) {
		cred, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Creds{}, err
	}
	if gerr != nil {
		return Creds{}, gerr
	}
	return Creds{UID: cred.Uid, GID: cred.Gid, PID: cred.Pid}, nil
}

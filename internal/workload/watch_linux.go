package workload

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// watchDir signals events on every file created, written or renamed into
// dir, with inotify, until ctx ends. A directory that does not exist yet
// (no join so far) is looked for once a second.
func watchDir(ctx context.Context, dir string, events chan<- struct{}, log *slog.Logger) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		log.Warn("workload api: cannot watch the identity files; renewals by other processes are seen once a second", "err", err)
		pollDir(ctx, dir, events)
		return
	}
	// A non-blocking descriptor goes to the runtime's poller, so Close
	// ends a Read in progress.
	f := os.NewFile(uintptr(fd), "inotify")
	defer f.Close()
	for {
		_, err := unix.InotifyAddWatch(fd, dir, unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO|unix.IN_CREATE|unix.IN_DELETE|unix.IN_ATTRIB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.ENOENT) {
			log.Warn("workload api: cannot watch the identity files; renewals by other processes are seen once a second", "dir", dir, "err", err)
			pollDir(ctx, dir, events)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
	notify(events) // the directory may have been filled while we waited
	go func() { <-ctx.Done(); f.Close() }()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Read(buf); err != nil {
			if ctx.Err() == nil {
				log.Warn("workload api: watching the identity files failed; renewals by other processes are seen once a second", "err", err)
				pollDir(ctx, dir, events)
			}
			return
		}
		notify(events)
	}
}

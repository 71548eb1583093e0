package workload

import (
	"context"
	"os"
	"time"
)

// pollDir signals events when a file in dir changes its size, time or
// inode, looking once a second: the fallback where inotify is missing.
func pollDir(ctx context.Context, dir string, events chan<- struct{}) {
	var last string
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		if sig := dirSignature(dir); sig != last {
			last = sig
			notify(events)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func dirSignature(dir string) string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return ""
	}
	var sig []byte
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			continue
		}
		sig = append(sig, fi.Name()...)
		sig = append(sig, fi.ModTime().String()...)
		sig = append(sig, byte(fi.Size()), byte(fi.Size()>>8), byte(fi.Size()>>16))
	}
	return string(sig)
}

package oserr

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestReason(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	plain := errors.New("plain")

	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"path", os.Mkdir(file, 0o700), fs.ErrExist},
		{"link", os.Rename(filepath.Join(dir, "missing"), file), fs.ErrNotExist},
		{"bind", func() error { _, err := net.Listen("tcp", busy.Addr().String()); return err }(), syscall.EADDRINUSE},
		{"other", plain, plain},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.err == nil {
				t.Fatal("the operation did not fail")
			}
			got := Reason(tc.err)
			if !errors.Is(got, tc.want) {
				t.Errorf("Reason(%v) = %v, want %v", tc.err, got, tc.want)
			}
			if tc.err != plain && got.Error() == tc.err.Error() {
				t.Errorf("Reason(%v) kept the wrapper", tc.err)
			}
		})
	}
}

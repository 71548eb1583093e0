// Package atomicfile writes files so that a reader, or a machine that lost
// power, sees either the old content or the new, never a mix: the data goes
// to a temporary file beside the target, is synced, renamed over the
// target, and the directory is synced so the rename itself is durable.
package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// Write replaces path with data, mode perm.
func Write(path string, data []byte, perm os.FileMode) error {
	return place(path, data, perm, os.Rename)
}

// Create writes a new file at path and fails if one exists: link, unlike
// rename, refuses an existing target, so two writers cannot replace each
// other's file (a key, say).
func Create(path string, data []byte, perm os.FileMode) error {
	return place(path, data, perm, os.Link)
}

// place writes data to a synced temporary file beside path and puts it in
// place with put (rename or link).
func place(path string, data []byte, perm os.FileMode, put func(oldpath, newpath string) error) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // fails harmlessly once renamed
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := put(tmp, path); err != nil {
		return err
	}
	return SyncDir(dir)
}

// SyncDir makes the entries of dir (a new or renamed file) durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	// Some file systems cannot sync a directory; that is not a failure of
	// the write.
	if err := d.Sync(); err != nil && !errors.Is(err, fs.ErrInvalid) {
		return err
	}
	return nil
}

//go:build !linux

package pgtest

// clusterParent returns "" (os.TempDir): only Linux is known to have a
// tmpfs at /dev/shm (tmpfs_linux.go says why one is preferred).
func clusterParent() string { return "" }

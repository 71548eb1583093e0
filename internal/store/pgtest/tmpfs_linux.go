package pgtest

import "golang.org/x/sys/unix"

// shmDir is the tmpfs Linux mounts for shared memory, where the cluster
// goes when it has room (clusterParent).
const shmDir = "/dev/shm"

// minShmFree is the room shmDir must have left for the cluster to go
// there: a cluster with its WAL takes about 100 MB, each database copy of
// a test 8 MB; Docker's default 64 MB /dev/shm does not qualify.
const minShmFree = 1 << 30

// clusterParent returns the directory the cluster's temporary directory is
// made in: shmDir where it is a tmpfs with minShmFree bytes free, else ""
// (os.TempDir). Every database a test creates is some 300 files copied from
// its template and deleted when the test ends; on ext4 (/tmp on most
// machines) creating a file in a directory with many recently deleted
// files scans the inode bitmap past them (ext4's recently_deleted), so
// that the store's conformance suite spent 140 of its 153 CPU-seconds in
// the kernel doing so, against 20 of 33 on a tmpfs, measured here (2
// cores, Linux 6.x, ext4 /tmp). The data is throwaway either way: the
// server runs with fsync=off.
func clusterParent() string {
	var st unix.Statfs_t
	if err := unix.Statfs(shmDir, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		return ""
	}
	if st.Bavail*uint64(st.Bsize) < minShmFree {
		return ""
	}
	return shmDir
}

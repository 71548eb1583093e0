package agent

import (
	"os"
	"path/filepath"
)

// clean removes what a writer killed part-way left behind; lock calls it
// once it holds the directory, when no other writer can be mid-write:
//   - the temporary files of atomic writes (".NAME.tmp-*"), which are never
//     renamed into place once their writer is gone;
//   - without state.json, the certificate files of a join killed after
//     writing them but before state.json, which would otherwise look like
//     an identity, and the state it was to record (state.next.json).
//     The pending key stays: a retried join reuses it, in case the
//     authority already certified it.
func (d Dir) clean() {
	for _, dir := range []string{string(d), d.path("certs"), d.path("keys")} {
		tmps, _ := filepath.Glob(filepath.Join(dir, ".*.tmp-*"))
		for _, t := range tmps {
			os.Remove(t)
		}
	}
	if !d.HasIdentity() {
		d.removeCertFiles()
		d.removeNextState()
	}
}

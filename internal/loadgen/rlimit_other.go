//go:build !unix

package loadgen

import "errors"

// RaiseFileLimit is not available here.
func RaiseFileLimit() (uint64, error) {
	return 0, errors.New("loadgen: no file limit to raise on this system")
}

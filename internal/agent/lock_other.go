//go:build !unix

package agent

import "context"

// lock is a no-op where flock is not available: run one agent command at
// a time there.
func (d Dir) lock(context.Context) (func(), error) {
	if err := d.ensure(); err != nil {
		return nil, err
	}
	d.clean()
	return func() {}, nil
}

// LockRun is a no-op where flock is not available: run one agent per
// data directory there.
func (d Dir) LockRun() (func(), error) {
	if err := d.ensure(); err != nil {
		return nil, err
	}
	return func() {}, nil
}

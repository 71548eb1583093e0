package sqlite

import "context"

// RunAsLeader runs fn at once: an embedded database belongs to one
// authority process, which leads every background job.
func (s *SQLite) RunAsLeader(ctx context.Context, _ string, fn func(context.Context) error) error {
	return fn(ctx)
}

//go:build !linux

package workload

import (
	"context"
	"log/slog"
)

func watchDir(ctx context.Context, dir string, events chan<- struct{}, _ *slog.Logger) {
	pollDir(ctx, dir, events)
}

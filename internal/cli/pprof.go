package cli

import (
	"context"
	"log/slog"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/muster-dev/muster/internal/pprofserve"
)

const pprofFlagUsage = "loopback HOST:PORT serving Go profiles at /debug/pprof/ (empty: off; any other address is refused)"

func registerPprofFlag(cmd *cobra.Command, dst *string) {
	cmd.Flags().StringVar(dst, "pprof-listen", "", pprofFlagUsage)
}

// checkPprof refuses a non-loopback --pprof-listen before a command
// creates or opens anything.
func checkPprof(addr string) error {
	if addr == "" {
		return nil
	}
	return pprofserve.CheckAddr(addr)
}

// withPprof runs run, and beside it the profiles on addr when addr is set.
// The listener is opened first, so a refused address stops the command
// before it starts serving anything.
func withPprof(ctx context.Context, addr string, log *slog.Logger, run func(context.Context) error) error {
	if addr == "" {
		return run(ctx)
	}
	lis, err := pprofserve.Listen(addr)
	if err != nil {
		return err
	}
	defer lis.Close()
	log.Warn("serving Go profiles: they reveal memory contents; turn --pprof-listen off when done", "pprof_listen", lis.Addr().String())
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		// The command ending, for whatever reason, ends the profiles too.
		defer cancel()
		return run(ctx)
	})
	g.Go(func() error { return pprofserve.Serve(ctx, lis) })
	return g.Wait()
}

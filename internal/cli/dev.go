package cli

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/muster-dev/muster/internal/datadir"
)

func newDevCmd(env *Env) *cobra.Command {
	var (
		dir     string
		listen  string
		mlisten string
	)
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run an authority on loopback for trying muster out (initialises --data on first start)",
		Long: `dev is the quick start: it initialises DIR (default ./muster-data) if it
does not hold an authority yet, then runs the authority on loopback with the
embedded SQLite store, and prints what to do next.

It is not for production: everything, the CA keys included, lives in DIR.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d := datadir.Dir(dir)
			info, err := d.ReadInfo()
			if errors.Is(err, datadir.ErrNotInitialised) || os.IsNotExist(statErr(dir)) {
				res, err := datadir.Init(cmd.Context(), datadir.InitOptions{Dir: d, Name: "dev", Now: time.Now()})
				if err != nil {
					return fmt.Errorf("dev: %w", err)
				}
				fmt.Fprintf(env.Stdout, "Initialised a new authority in %s\n\n", res.Dir)
				if err := printInit(env, output{format: "text"}, res); err != nil {
					return err
				}
				info = res.Info
			} else if err != nil {
				return fmt.Errorf("dev: %w", err)
			}
			ready := func(addr string) {
				self := os.Args[0]
				fmt.Fprintf(env.Stdout, `
muster dev: authority %s is listening on %s (metrics on http://%s/metrics)

In another terminal, as the operator in %s:
  %s status --data %s
  %s audit list --data %s
  %s admin add alice --data %s

Stop with Ctrl-C; the state stays in %s for the next start.
`, info.AuthorityID, addr, mlisten, d, self, shellQuote(dir), self, shellQuote(dir), self, shellQuote(dir), d)
			}
			return runAuthority(cmd.Context(), env, authorityOptions{
				dir: dir, listen: listen, metricsListen: mlisten,
				agentCertTTL: defaultAgentCertTTL, logFormat: "text", logLevel: "info", ready: ready,
			})
		},
	}
	cmd.Flags().StringVar(&dir, "data", "muster-data", "data directory (created on first start)")
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:7443", "address of the API")
	cmd.Flags().StringVar(&mlisten, "metrics-listen", "127.0.0.1:7444", "address of /metrics")
	return cmd
}

func statErr(path string) error {
	_, err := os.Stat(path)
	return err
}

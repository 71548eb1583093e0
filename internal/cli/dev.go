package cli

import (
	"errors"
	"fmt"
	"os"
	"strings"
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
				m, q := devCommand(), shellQuote(dir)
				fmt.Fprintf(env.Stdout, `
muster dev: authority %s is listening on %s (metrics on http://%s/metrics)

In another terminal, as the operator in %s:
  1. Create a join token (it prints a joining URI):
       %s token create --data %s
  2. Join a machine with it (here, this one, into ./agent-data):
       %s agent join --data ./agent-data --node my-node 'URI-FROM-STEP-1'
  3. Keep its identity renewed:
       %s agent run --data ./agent-data
  4. Look at what happened:
       %s agents list --data %s
       %s audit list --data %s

Stop with Ctrl-C; the state stays in %s for the next start.
`, info.AuthorityID, addr, mlisten, d, m, q, m, m, m, q, m, q, d)
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

// devCommand is how the user ran muster: "go run ./cmd/muster" when the
// binary is go run's temporary build, so the printed commands work as
// pasted.
func devCommand() string {
	self := os.Args[0]
	if strings.Contains(self, "go-build") {
		return "go run ./cmd/muster"
	}
	return self
}

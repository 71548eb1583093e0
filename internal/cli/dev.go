package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"

	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/discovery"
	"github.com/muster-dev/muster/internal/discoveryd"
	"github.com/muster-dev/muster/internal/shellword"
)

func newDevCmd(env *Env) *cobra.Command {
	var (
		dir       string
		listen    string
		mlisten   string
		dlisten   string
		logFormat string
		// ttl and boundTTL are the agent certificate lifetimes, read as
		// the authority reads them (flag, MUSTER_*, DIR/authority.yaml).
		ttl, boundTTL string
	)
	cmd := &cobra.Command{
		Use: "dev",
		Example: `  muster dev
  muster dev --data ./dev-data --listen 127.0.0.1:8443 --discovery-listen ""`,
		Short: "Run an authority on loopback for trying muster out (initialises --data on first start)",
		Long: `dev is the quick start: it initialises DIR (default ./muster-data) if it
does not hold an authority yet, then runs the authority on loopback with the
embedded SQLite store, and an embedded discovery service (DIR/discovery) the
authority registers with, and prints what to do next. With the discovery,
PSK joins need its referral ticket, as in production; --discovery-listen ""
runs the authority alone.

The settings in DIR/authority.yaml hold as for muster authority, but for
two dev decides itself: it listens where --listen and --metrics-listen say
(loopback by default), whatever listen and metrics_listen say (it says so
when it starts), and with its embedded discovery it refuses
discovery.address and discovery.fingerprint (--discovery-listen "" runs
it registered with them instead).

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
				if err := printInitSummary(env, output{format: "text"}, res); err != nil {
					return err
				}
				info = res.Info
			} else if err != nil {
				return fmt.Errorf("dev: %w", err)
			}
			// A dev already running on DIR is named before its ports
			// are found taken.
			release, err := d.Lock()
			if errors.Is(err, datadir.ErrLocked) {
				return devRunning(d)
			} else if err != nil {
				return fmt.Errorf("dev: %w", err)
			}
			release()
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			g, ctx := errgroup.WithContext(ctx)
			o := authorityOptions{dir: dir, listen: listen, metricsListen: mlisten, logFormat: logFormat, logLevel: "info", pskRequired: true}
			if err := devSettings(env, cmd.Flags(), d, dlisten != "", ttl, boundTTL, &o); err != nil {
				return fmt.Errorf("dev: %w", err)
			}
			if dlisten != "" {
				own := discovery.AllowEntry{AuthorityID: info.AuthorityID, Fingerprint: info.CAFingerprint}
				disc, err := startDevDiscovery(ctx, g, env, filepath.Join(dir, "discovery"), dlisten, logFormat, own)
				if err != nil {
					return devListenErr(d, prefixed("dev", err))
				}
				o.discovery, o.discoveryFP = disc.Addr(), disc.Fingerprint()
			}
			o.ready = func(addr, metricsAddr string) {
				m, q := devCommand(), shellword.Quote(dir)
				fmt.Fprintf(env.Stdout, `
muster dev: authority %s is listening on %s (%s)

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
`, info.AuthorityID, addr, metricsNote(metricsAddr), d, m, q, m, m, m, q, m, q)
				if o.discovery != "" {
					fmt.Fprintf(env.Stdout, "  5. Or join with the bootstrap PSK (psk show --raw prints it) and a referral ticket:\n       %s\n",
						devPSKJoin(m, q, o.discovery, o.discoveryFP, info))
				}
				fmt.Fprint(env.Stdout, devAgentEnv(m, q, addr, o.discovery, o.discoveryFP, info))
				fmt.Fprintf(env.Stdout, "\nStop with Ctrl-C; the state stays in %s for the next start.\n", d)
			}
			g.Go(func() error {
				defer cancel()
				return runAuthority(ctx, env, o)
			})
			return devListenErr(d, g.Wait())
		},
	}
	cmd.Flags().StringVar(&dir, "data", "muster-data", "data directory (created on first start)")
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:7443", "address of the API")
	cmd.Flags().StringVar(&mlisten, "metrics-listen", "127.0.0.1:7444", "address of /metrics")
	cmd.Flags().StringVar(&dlisten, "discovery-listen", discoveryd.DefaultListen, `address of the embedded discovery service ("" : none)`)
	cmd.Flags().StringVar(&logFormat, "log-format", "", "log format: text or json (default: text on a terminal, json otherwise)")
	registerAgentCertTTLFlags(cmd.Flags(), &ttl, &boundTTL)
	return cmd
}

// devRunning says a dev (or an authority) already runs on d: use it, or
// stop it.
func devRunning(d datadir.Dir) error {
	stop := "Ctrl-C in its terminal"
	if pid := d.LockHolder(); pid > 0 {
		stop += fmt.Sprintf(", or kill %d", pid)
	}
	return fmt.Errorf("dev: a muster dev (or authority) already runs on %s: use it from another terminal, or stop it (%s) before starting this one", d, stop)
}

// devListenErr turns a listener's "address already in use" into what it
// most likely is with dev's fixed ports: another muster dev, on another
// data directory (one on d is found by its lock first).
func devListenErr(d datadir.Dir, err error) error {
	if err == nil || !errors.Is(err, syscall.EADDRINUSE) {
		return err
	}
	return fmt.Errorf("%w: most likely a muster dev runs there on another data directory than %s: stop it (Ctrl-C in its terminal), "+
		"or give this one other addresses (--listen, --metrics-listen, --discovery-listen)", err, d)
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

// startDevDiscovery runs a discovery service from dir (initialised on first
// start) in g and returns it once it listens. Only the authority allowed
// (dev's own) may register with it.
func startDevDiscovery(ctx context.Context, g *errgroup.Group, env *Env, dir, listen, logFormat string, allowed discovery.AllowEntry) (*discoveryd.Server, error) {
	log, err := newLogger(env.Stderr, logFormat, "info")
	if err != nil {
		return nil, err
	}
	id, err := discoveryd.Init(dir)
	if err != nil {
		return nil, err
	}
	_, st, err := openDiscoveryStore(ctx, id.Dir, "", log)
	if err != nil {
		return nil, err
	}
	ready := make(chan struct{})
	srv, err := discoveryd.New(discoveryd.Config{Dir: dir, Store: st, Listen: listen, Log: log.With("service", "discovery"),
		AllowedAuthorities: []discovery.AllowEntry{allowed}, Ready: func(string) { close(ready) }})
	if err != nil {
		st.Close()
		return nil, err
	}
	done := make(chan error, 1)
	g.Go(func() error {
		defer st.Close()
		err := srv.Run(ctx)
		done <- err
		if err != nil {
			return prefixed("discoveryd", err)
		}
		return nil
	})
	select {
	case <-ready:
		return srv, nil
	case err := <-done:
		if err == nil {
			err = ctx.Err()
		}
		return nil, prefixed("discoveryd", err)
	}
}

func metricsNote(addr string) string {
	if addr == "" {
		return "no metrics listener"
	}
	return "metrics on http://" + addr + "/metrics"
}

// devPSKJoin is the one command of the dev banner's PSK step: psk show
// --raw hands the PSK to the join on its standard input (never in a file
// or an argument), and the agent gets its referral ticket from dev's
// embedded discovery service.
func devPSKJoin(m, data, disc, discFP string, info datadir.Info) string {
	return fmt.Sprintf("%s psk show --data %s --raw | %s agent join --data ./agent-psk --node my-psk-node --psk-file - --discovery %s --discovery-fingerprint %s --authority-id %s --ca-fingerprint %s",
		m, data, m, disc, discFP, info.AuthorityID, info.CAFingerprint)
}

// devSettings sets o from d's settings file as muster authority
// reads it (applySettings), so a setting in it is never silently ignored:
// dev's own listen addresses stand, said on stderr, and a discovery
// service to register with is refused beside the embedded one (two would
// need two registrations dev does not make).
func devSettings(env *Env, f *pflag.FlagSet, d datadir.Dir, embeddedDiscovery bool, ttl, boundTTL string, o *authorityOptions) error {
	path := d.ConfigFile()
	cfg, err := loadAuthorityConfig(path, d)
	if err != nil {
		return err
	}
	for _, s := range []struct{ key, addr, flag, used string }{
		{"listen", cfg.Listen, "--listen", o.listen},
		{"metrics_listen", cfg.MetricsListen, "--metrics-listen", o.metricsListen},
	} {
		if s.addr != "" {
			fmt.Fprintf(env.Stderr, "dev: %s %s in %s is not used: dev listens on %s (%s), loopback unless it is given\n", s.key, s.addr, path, firstOf(s.used, `""`), s.flag)
		}
	}
	cfg.Listen, cfg.MetricsListen = "", ""
	if embeddedDiscovery {
		for _, s := range []struct{ key, v string }{{"discovery.address", cfg.Discovery.Address}, {"discovery.fingerprint", cfg.Discovery.Fingerprint}} {
			if s.v != "" {
				return fmt.Errorf("%s %s in %s: dev registers with its embedded discovery service; "+
					"run dev with --discovery-listen \"\" to register with %s instead", s.key, s.v, path, s.key)
			}
		}
	}
	st := defaultSettingText()
	st.ttl, st.boundTTL = ttl, boundTTL // dev's own flags (registerAgentCertTTLFlags)
	return applySettings(f, cfg, st, o)
}

// devAgentEnv is how agents deployed with environment variables join dev's
// authority, with its real address, pasteable as it is: the PSK comes from
// psk show --raw, and with the embedded discovery the agent is pointed at
// discovery (which refers it and issues the referral ticket dev's
// authority requires with the PSK), not at the authority.
func devAgentEnv(m, data, addr, disc, discFP string, info datadir.Info) string {
	var b strings.Builder
	b.WriteString("\nAgents deployed with environment variables read these (muster agent join, agent run);\npasted in a shell here, the last line joins ./agent-env:\n")
	vars := [][2]string{{"MUSTER_AUTHORITY", addr}}
	if disc != "" {
		vars = [][2]string{{"MUSTER_DISCOVERY", disc}, {"MUSTER_DISCOVERY_FINGERPRINT", discFP}}
	}
	vars = append(vars, [2]string{"MUSTER_AUTHORITY_ID", info.AuthorityID}, [2]string{"MUSTER_CA_FINGERPRINT", info.CAFingerprint})
	for _, v := range vars {
		fmt.Fprintf(&b, "  export %s=%s\n", v[0], shellword.Quote(v[1]))
	}
	fmt.Fprintf(&b, "  export MUSTER_BOOTSTRAP_PSK=\"$(%s psk show --data %s --raw)\"\n", m, data)
	fmt.Fprintf(&b, "  %s agent join --data ./agent-env --node my-env-node\n", m)
	return b.String()
}

package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/muster-dev/muster/internal/authority"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/postgres"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

// Limits on agent certificate lifetimes: a day survives an authority outage
// over a weekend night; a week is the most a stolen certificate may live.
const (
	defaultAgentCertTTL = 24 * time.Hour
	maxAgentCertTTL     = 7 * 24 * time.Hour
)

// authorityConfig is DIR/authority.yaml. Unknown keys are refused, so a
// misspelt setting cannot be silently ignored.
type authorityConfig struct {
	Listen          string   `yaml:"listen"`
	Advertise       string   `yaml:"advertise"`
	BootstrapListen string   `yaml:"bootstrap_listen"`
	MetricsListen   string   `yaml:"metrics_listen"`
	Store           string   `yaml:"store"`
	AgentCertTTL    string   `yaml:"agent_cert_ttl"`
	TrustedProxies  []string `yaml:"trusted_proxies"`
	Log             struct {
		Format string `yaml:"format"`
		Level  string `yaml:"level"`
	} `yaml:"log"`
}

func loadAuthorityConfig(path string) (authorityConfig, error) {
	var c authorityConfig
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return c, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return c, fmt.Errorf("%s: %v", path, oneLine(err.Error()))
	}
	return c, nil
}

// authorityOptions are the settings after flags override authority.yaml.
type authorityOptions struct {
	dir             string
	listen          string
	advertise       string
	bootstrapListen string
	metricsListen   string
	storeURL        string
	agentCertTTL    time.Duration
	trustedProxies  []string
	logFormat       string
	logLevel        string
	ready           func(addr string)
}

func newAuthorityCmd(env *Env) *cobra.Command {
	var o authorityOptions
	var ttl string
	cmd := &cobra.Command{
		Use:   "authority --data DIR",
		Short: "Run the authority: the CA, every join method, renewal, the admin API",
		Long: `authority serves muster's gRPC API over TLS from an initialised data
directory. Settings come from DIR/authority.yaml (unknown keys are refused);
flags override it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.dir == "" {
				o.dir = env.Getenv("MUSTER_DATA")
			}
			if o.dir == "" {
				return fmt.Errorf("authority: --data DIR is required")
			}
			cfg, err := loadAuthorityConfig(datadir.Dir(o.dir).ConfigFile())
			if err != nil {
				return fmt.Errorf("authority: %w", err)
			}
			f := cmd.Flags()
			pick := func(dst *string, flag, fromFile string) {
				if !f.Changed(flag) && fromFile != "" {
					*dst = fromFile
				}
			}
			pick(&o.listen, "listen", cfg.Listen)
			pick(&o.advertise, "advertise", cfg.Advertise)
			pick(&o.bootstrapListen, "bootstrap-listen", cfg.BootstrapListen)
			pick(&o.metricsListen, "metrics-listen", cfg.MetricsListen)
			pick(&o.storeURL, "store", cfg.Store)
			pick(&ttl, "agent-cert-ttl", cfg.AgentCertTTL)
			pick(&o.logFormat, "log-format", cfg.Log.Format)
			pick(&o.logLevel, "log-level", cfg.Log.Level)
			if !f.Changed("trusted-proxy") {
				o.trustedProxies = cfg.TrustedProxies
			}
			if o.agentCertTTL, err = time.ParseDuration(ttl); err != nil {
				return fmt.Errorf("authority: agent certificate ttl %q: %v", ttl, err)
			}
			return runAuthority(cmd.Context(), env, o)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.dir, "data", "", "data directory made by muster init (env MUSTER_DATA)")
	fl.StringVar(&o.listen, "listen", "127.0.0.1:7443", "address of the API")
	fl.StringVar(&o.advertise, "advertise", "", "address agents and operators reach the API at (default: the listen address)")
	fl.StringVar(&o.bootstrapListen, "bootstrap-listen", "", "optional address serving only the unauthenticated bootstrap RPCs")
	fl.StringVar(&o.metricsListen, "metrics-listen", "127.0.0.1:7444", "address of /metrics, /healthz and /readyz (empty: off)")
	fl.StringVar(&o.storeURL, "store", "", "store URL: sqlite://PATH or postgres://… (default: DIR/muster.db)")
	fl.StringVar(&ttl, "agent-cert-ttl", defaultAgentCertTTL.String(), "lifetime of agent certificates (at most 168h)")
	fl.StringVar(&o.logFormat, "log-format", "", "log format: text or json (default: text on a terminal, json otherwise)")
	fl.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fl.StringSliceVar(&o.trustedProxies, "trusted-proxy", nil, "IP or CIDR of a TCP load balancer whose PROXY protocol header gives the client address (repeatable)")
	return cmd
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	if format == "" {
		format = "json"
		if f, ok := w.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
			format = "text"
		}
	}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: use text or json", format)
}

// openStore opens the store a URL names.
func openStore(ctx context.Context, url string) (store.Store, error) {
	switch {
	case strings.HasPrefix(url, "sqlite://"):
		path := strings.TrimPrefix(url, "sqlite://")
		if path == "" {
			return nil, fmt.Errorf("store URL %q has no path", url)
		}
		return sqlite.Open(ctx, path)
	case strings.HasPrefix(url, "postgres://"), strings.HasPrefix(url, "postgresql://"):
		return postgres.Open(ctx, url)
	}
	return nil, fmt.Errorf("store URL must start with sqlite://, postgres:// or postgresql:// (got %q)", redactURL(url))
}

// redactURL drops the userinfo of a URL, where a database password lives.
func redactURL(u string) string {
	if i := strings.Index(u, "@"); i >= 0 {
		if j := strings.Index(u, "://"); j >= 0 && j < i {
			return u[:j+3] + "…" + u[i:]
		}
	}
	return u
}

func runAuthority(ctx context.Context, env *Env, o authorityOptions) error {
	log, err := newLogger(env.Stderr, o.logFormat, o.logLevel)
	if err != nil {
		return fmt.Errorf("authority: %w", err)
	}
	if o.agentCertTTL <= 0 || o.agentCertTTL > maxAgentCertTTL {
		return fmt.Errorf("authority: agent certificate ttl must be between 1s and %s", maxAgentCertTTL)
	}
	proxies, err := authority.ParseTrustedProxies(o.trustedProxies)
	if err != nil {
		return fmt.Errorf("authority: %w", err)
	}
	dir := datadir.Dir(o.dir)
	info, err := dir.ReadInfo()
	if err != nil {
		return fmt.Errorf("authority: %w", err)
	}
	h, err := ca.Load(dir.CADir())
	if err != nil {
		return fmt.Errorf("authority: %w", err)
	}
	if h.Fingerprint() != info.CAFingerprint {
		return fmt.Errorf("authority: the root CA in %s does not match the fingerprint in %s", dir.CADir(), dir.InfoFile())
	}
	sk, err := seal.LoadStorageKey(dir.StorageKeyFile())
	if err != nil {
		return fmt.Errorf("authority: %w", err)
	}
	if o.storeURL == "" {
		o.storeURL = dir.DefaultStoreURL()
	}
	st, err := openStore(ctx, o.storeURL)
	if err != nil {
		return fmt.Errorf("authority: %w", err)
	}
	defer st.Close()
	m := authority.NewMetrics(Version)
	logger, err := datadir.NewAuditLogger(st, sk, dir.CheckpointFile(), m.OnAudit)
	if err != nil {
		return fmt.Errorf("authority: %w", err)
	}
	srv, err := authority.New(authority.Config{
		Dir: dir, Info: info, CA: h, Store: st, Audit: logger, StorageKey: sk,
		Listen: o.listen, Advertise: o.advertise, BootstrapListen: o.bootstrapListen,
		MetricsListen: o.metricsListen, AgentCertTTL: o.agentCertTTL, TrustedProxies: proxies,
		Version: Version, Log: log, Ready: o.ready,
	}, m)
	if err != nil {
		return fmt.Errorf("authority: %w", err)
	}
	if err := srv.Run(ctx); err != nil {
		return err
	}
	log.Info("authority stopped")
	return nil
}

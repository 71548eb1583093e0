package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/authority"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/crl"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/discovery"
	"github.com/muster-dev/muster/internal/enroll"
	"github.com/muster-dev/muster/internal/listener"
	"github.com/muster-dev/muster/internal/referral"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/shellword"
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
	CRLListen       string   `yaml:"crl_listen"`
	CRLURL          string   `yaml:"crl_url"`
	CRLValidity     string   `yaml:"crl_validity"`
	Store           string   `yaml:"store"`
	AgentCertTTL    string   `yaml:"agent_cert_ttl"`
	TrustedProxies  []string `yaml:"trusted_proxies"`
	Discovery       struct {
		Address       string           `yaml:"address"`
		Fingerprint   string           `yaml:"fingerprint"`
		RegisterEvery string           `yaml:"register_every"`
		KeysRefresh   string           `yaml:"keys_refresh"`
		Endpoints     []string         `yaml:"endpoints"`
		Policy        discovery.Policy `yaml:"policy"`
	} `yaml:"discovery"`
	Bootstrap struct {
		PSKRequired      *bool  `yaml:"psk_required"`
		PSKOptionalUntil string `yaml:"psk_optional_until"`
	} `yaml:"bootstrap"`
	Log struct {
		Format string `yaml:"format"`
		Level  string `yaml:"level"`
	} `yaml:"log"`
	Signer struct {
		MinLeadTime string `yaml:"min_lead_time"`
	} `yaml:"signer"`
	BoundKeypair struct {
		// RecoveriesWarnAt: nil keeps the default.
		RecoveriesWarnAt *int64 `yaml:"recoveries_warn_at"`
		// CertTTL: empty keeps the default (1h, at most agent_cert_ttl).
		CertTTL string `yaml:"cert_ttl"`
	} `yaml:"bound_keypair"`
	CA struct {
		// IntermediateTTL: empty keeps the default (1 year).
		IntermediateTTL string `yaml:"intermediate_ttl"`
		// DraftTTL: empty keeps the default (1h).
		DraftTTL string `yaml:"draft_ttl"`
	} `yaml:"ca"`
	JWTSVID struct {
		// KeyRotationPeriod: empty keeps the default (30 days).
		KeyRotationPeriod string `yaml:"key_rotation_period"`
	} `yaml:"jwt_svid"`
	Limits struct {
		// MaxConnections: nil or 0 keeps the default (from the open-file
		// limit).
		MaxConnections *int `yaml:"max_connections"`
		// CallTimeout: empty keeps the default (1m).
		CallTimeout string `yaml:"call_timeout"`
		// MaxCallsPerSource: nil or 0 keeps the default (1024).
		MaxCallsPerSource *int `yaml:"max_calls_per_source"`
		// RenewalsPerLifetime: nil or 0 keeps the default (10).
		RenewalsPerLifetime *int `yaml:"renewals_per_lifetime"`
		// StoreTimeout: empty keeps the default (10s).
		StoreTimeout string `yaml:"store_timeout"`
	} `yaml:"limits"`
}

// defaultRecoveriesWarnAt is bound_keypair.recoveries_warn_at's default:
// warn when one recovery is left.
const defaultRecoveriesWarnAt = 1

// loadAuthorityConfig reads the settings file at path of the authority
// whose data directory is dir: a relative SQLite path in its store is
// under dir (storeUnder).
func loadAuthorityConfig(path string, dir datadir.Dir) (authorityConfig, error) {
	var c authorityConfig
	// Keys the file leaves out keep the default policy's values.
	c.Discovery.Policy = discovery.DefaultPolicy()
	err := readYAMLFile(path, &c)
	c.Store = storeUnder(string(dir), c.Store)
	return c, err
}

// storeUnder is a store URL read from a settings file, a relative SQLite
// path in it taken as under the data directory dir (docs/install.md): the
// authority under systemd runs in /, an operator's offline command
// wherever they stand, and both must open the same file, wherever the
// settings file is (DIR/authority.yaml, /etc/muster/authority.yaml). An
// absolute path and any other URL are as given; so is a --store or
// MUSTER_STORE, which are read where the command runs, like --data.
func storeUnder(dir, url string) string {
	p, ok := strings.CutPrefix(url, "sqlite://")
	if !ok || p == "" || filepath.IsAbs(p) {
		return url
	}
	return "sqlite://" + filepath.Join(dir, p)
}

// readYAMLFile decodes the YAML file at path into v, which keeps its values
// when the file does not exist. Unknown keys are refused, so a misspelt
// setting cannot be silently ignored.
func readYAMLFile(path string, v any) error {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%s: %v", path, oneLine(explainYAML(data, err).Error()))
	}
	return nil
}

// authorityOptions are the settings after flags override authority.yaml.
type authorityOptions struct {
	dir string
	// pkcs11Module and pkcs11PINFile replace authority.json's custody
	// module and PIN file (docs/hsm.md).
	pkcs11Module    string
	pkcs11PINFile   string
	listen          string
	advertise       string
	bootstrapListen string
	metricsListen   string
	crlListen       string
	crlURL          string
	crlValidity     time.Duration
	storeURL        string
	agentCertTTL    time.Duration
	// caIntermediateTTL is ca.intermediate_ttl.
	caIntermediateTTL time.Duration
	// caDraftTTL is ca.draft_ttl.
	caDraftTTL time.Duration
	// jwtKeyPeriod is jwt_svid.key_rotation_period.
	jwtKeyPeriod time.Duration
	// boundCertTTL is bound_keypair.cert_ttl (zero: 1h, but never longer
	// than agentCertTTL, so a short test or lab setting shortens both).
	boundCertTTL   time.Duration
	trustedProxies []string
	discovery      string
	discoveryFP    string
	registerEvery  time.Duration
	keysRefresh    time.Duration
	endpoints      []string
	policy         discovery.Policy
	pskRequired    bool
	pskOptional    string
	logFormat      string
	logLevel       string
	pprofListen    string
	ready          func(addr, metricsAddr string)
	// memoryLimit is --memory-limit in bytes (0: none; memlimit.go).
	memoryLimit int64

	// signerMinLead is signer.min_lead_time; 0 means the default.
	signerMinLead time.Duration
	// sharedGiven names, by key, the shared settings given rather than
	// left to their default, and where: a flag or the settings file.
	sharedGiven map[string]string
	// configPath is the settings file read.
	configPath string
	// recoveriesWarnAt is bound_keypair.recoveries_warn_at.
	recoveriesWarnAt int64
	// maxConnections is limits.max_connections; 0 means the default.
	maxConnections int
	// callTimeout is limits.call_timeout.
	callTimeout time.Duration
	// maxCallsPerSource is limits.max_calls_per_source.
	maxCallsPerSource int
	// renewalsPerLifetime is limits.renewals_per_lifetime.
	renewalsPerLifetime int
	// storeTimeout is limits.store_timeout.
	storeTimeout time.Duration
}

func newAuthorityCmd(env *Env) *cobra.Command {
	var o authorityOptions
	st := defaultSettingText()
	var configFile, memoryLimit string
	var checkOnly bool
	cmd := &cobra.Command{
		Use:   "authority --data DIR",
		Short: "Run the authority: the CA, every join method, renewal, the admin API",
		Long: `authority serves muster's gRPC API over TLS from an initialised data
directory. Settings come from DIR/authority.yaml, or the file --config
names (unknown keys are refused); MUSTER_* environment variables override
the file, and flags override both. --check-config validates the settings
and the data directory, prints the settings in force, and exits.`,
		Example: `  muster authority --data /var/lib/muster
  muster authority --data /var/lib/muster --config /etc/muster/authority.yaml --check-config
  MUSTER_STORE=postgres://muster@db.internal/muster PGPASSFILE=/run/secrets/pgpass muster authority --data /var/lib/muster`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.dir == "" {
				o.dir = env.Getenv("MUSTER_DATA")
			}
			if o.dir == "" {
				return fmt.Errorf("authority: --data DIR is required")
			}
			cfg, cfgPath, err := readAuthorityConfig(datadir.Dir(o.dir), configFile)
			if err != nil {
				return fmt.Errorf("authority: %w", err)
			}
			if err := applySettings(cmd.Flags(), cfg, st, &o); err != nil {
				return fmt.Errorf("authority: %w", err)
			}
			o.configPath = cfgPath
			// The flags hold MUSTER_PKCS11_* already (withEnv); read as
			// every command that opens the token reads them.
			ta := readTokenAccess(env, o.pkcs11Module, o.pkcs11PINFile)
			o.pkcs11Module, o.pkcs11PINFile = ta.module, ta.pinFile
			if o.memoryLimit, err = parseMemoryLimit(memoryLimit); err != nil {
				return fmt.Errorf("authority: %w", err)
			}
			if checkOnly {
				return checkAuthorityConfig(env, o, cfgPath)
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
	fl.StringVar(&o.crlListen, "crl-listen", "", "address serving the certificate revocation lists over plain HTTP at /crl/ROLE-SERIAL.crl (empty: off)")
	fl.StringVar(&o.crlURL, "crl-url", "", "base URL relying parties fetch the revocation lists from (http://HOST:PORT), named in every new certificate (empty: none)")
	fl.StringVar(&st.crlValidity, "crl-validity", st.crlValidity, "lifetime of each revocation list (nextUpdate); it is signed again at half of it")
	fl.StringVar(&o.storeURL, "store", "", "store URL: sqlite://PATH or postgres://… (default: the one DIR/authority.json records, without a password: PGPASSWORD or PGPASSFILE gives it; else DIR/muster.db)")
	fl.StringVar(&st.jwtPeriod, "jwt-key-rotation-period", st.jwtPeriod, "how long a JWT-SVID signing key signs before the next replaces it (jwt_svid.key_rotation_period; at least "+authority.MinJWTKeyRotationPeriod.String()+"; shared, kept in the store: see muster settings list)")
	fl.StringVar(&st.interTTL, "ca-intermediate-ttl", st.interTTL, "lifetime of the CA intermediates the authority prepares as it rotates them (ca.intermediate_ttl; at least 2m; shared, kept in the store: see muster settings list)")
	fl.StringVar(&st.draftTTL, "ca-draft-ttl", st.draftTTL, "how long a draft of muster ca rotate ROLE --root-key waits for its signed certificate before its key is destroyed (ca.draft_ttl; "+authority.MinCADraftTTL.String()+" to "+authority.MaxCADraftTTL.String()+"; shared, kept in the store: see muster settings list)")
	registerAgentCertTTLFlags(fl, &st.ttl, &st.boundTTL)
	fl.StringVar(&o.logFormat, "log-format", "", "log format: text or json (default: text on a terminal, json otherwise)")
	fl.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fl.StringVar(&o.discovery, "discovery", "", "HOST:PORT of the discovery service to register with; PSK bootstraps then need its referral tickets")
	fl.StringVar(&o.discoveryFP, "discovery-fingerprint", "", "sha256:… pin of the discovery's CA (muster discovery show); empty trusts the system roots")
	fl.BoolVar(&o.pskRequired, "psk-required", true, "require the bootstrap PSK; false only for a migration, with --psk-optional-until and --discovery")
	fl.StringVar(&o.pskOptional, "psk-optional-until", "", "RFC 3339 time until which a referral ticket alone admits an agent (with --psk-required=false)")
	fl.StringSliceVar(&o.trustedProxies, "trusted-proxy", nil, "IP or CIDR of a TCP load balancer whose PROXY protocol header gives the client address (repeatable)")
	fl.IntVar(&o.maxConnections, "max-connections", 0, "connections the api and bootstrap listeners hold open at once together, from all sources (limits.max_connections; 0: the open-file limit less 256, at least half of it)")
	fl.IntVar(&o.maxCallsPerSource, "max-calls-per-source", authority.DefaultMaxCallsPerSource, "calls one source address may have in flight at once, agents' streams aside; the next is refused RESOURCE_EXHAUSTED (limits.max_calls_per_source; 0: the default)")
	fl.IntVar(&o.renewalsPerLifetime, "renewals-per-lifetime", authority.DefaultRenewalsPerLifetime, "renewals one agent instance is given at once, and again in each lifetime of its certificates; the next is refused RESOURCE_EXHAUSTED (limits.renewals_per_lifetime; 0: the default)")
	fl.StringVar(&st.storeTimeout, "store-timeout", st.storeTimeout, "the longest a PostgreSQL store may leave one request (a statement, a transaction) unanswered before the authority treats the store as unavailable (limits.store_timeout; 1s to 20s)")
	fl.StringVar(&st.callTimeout, "call-timeout", st.callTimeout, "the longest a call may last, its request and reply included, unless its caller asks for less (limits.call_timeout; agents' streams, bound-keypair joins and health watches bound themselves)")
	fl.StringVar(&o.pkcs11Module, "pkcs11-module", "", "the PKCS#11 library of the token this authority's keys are in (default: the one muster init --custody or muster ca migrate-custody recorded in DIR/authority.json; needed where authority.json names no token but the store does)")
	fl.StringVar(&o.pkcs11PINFile, "pkcs11-pin-file", "", "file holding the token's user PIN, mode 0600 (default: the one recorded at init, else env MUSTER_PKCS11_PIN)")
	registerPprofFlag(cmd, &o.pprofListen)
	fl.StringVar(&memoryLimit, "memory-limit", "", "the memory this process may use, such as a container's limit (bytes, or with KiB, MiB, GiB): the Go collector's soft limit is set to 90% of it, unless GOMEMLIMIT is set (empty: none)")
	fl.StringVar(&configFile, "config", "", "settings file (default: DIR/authority.yaml)")
	fl.BoolVar(&checkOnly, "check-config", false, "validate the settings and the data directory, print the settings in force, and exit")
	return cmd
}

// authorityConfigPath is the settings file an authority of dir reads:
// configFile (--config), which must exist since it was named on purpose,
// else dir's authority.yaml, which is optional.
func authorityConfigPath(dir datadir.Dir, configFile string) (string, error) {
	if configFile == "" {
		return dir.ConfigFile(), nil
	}
	if _, err := os.Stat(configFile); err != nil {
		return "", fmt.Errorf("--config: %w", err)
	}
	return configFile, nil
}

// registerAgentCertTTLFlags defines --agent-cert-ttl and
// --bound-keypair-cert-ttl, which the authority and dev share.
func registerAgentCertTTLFlags(fl *pflag.FlagSet, ttl, boundTTL *string) {
	fl.StringVar(ttl, "agent-cert-ttl", defaultAgentCertTTL.String(), "lifetime of agent certificates (agent_cert_ttl; at most 168h)")
	fl.StringVar(boundTTL, "bound-keypair-cert-ttl", "", "lifetime of bound-keypair agents' certificates (bound_keypair.cert_ttl; default 1h, or --agent-cert-ttl if shorter; at most 168h)")
}

// settingText is the settings read as text before they are checked: a
// flag's value, else the settings file's, else the default.
type settingText struct {
	ttl, boundTTL, interTTL, draftTTL, jwtPeriod, crlValidity, callTimeout, storeTimeout string
}

func defaultSettingText() settingText {
	return settingText{
		ttl:          defaultAgentCertTTL.String(),
		interTTL:     ca.IntermediateTTL.String(),
		draftTTL:     authority.DefaultCADraftTTL.String(),
		jwtPeriod:    authority.DefaultJWTKeyRotationPeriod.String(),
		crlValidity:  crl.DefaultValidity.String(),
		callTimeout:  authority.DefaultCallTimeout.String(),
		storeTimeout: postgres.DefaultRequestTimeout.String(),
	}
}

// applySettings sets o from the settings file cfg where the flag of a
// setting was not given (f: muster authority's flags, or muster dev's,
// which lack most: the file's value, else the default, holds), and checks
// them: the one reading of authority.yaml the authority and dev share.
func applySettings(f *pflag.FlagSet, cfg authorityConfig, s settingText, o *authorityOptions) error {
	var err error
	pick := func(dst *string, flag, fromFile string) {
		if !f.Changed(flag) && fromFile != "" {
			*dst = fromFile
		}
	}
	pick(&o.listen, "listen", cfg.Listen)
	pick(&o.advertise, "advertise", cfg.Advertise)
	pick(&o.bootstrapListen, "bootstrap-listen", cfg.BootstrapListen)
	pick(&o.metricsListen, "metrics-listen", cfg.MetricsListen)
	pick(&o.crlListen, "crl-listen", cfg.CRLListen)
	pick(&o.crlURL, "crl-url", cfg.CRLURL)
	pick(&s.crlValidity, "crl-validity", cfg.CRLValidity)
	if o.crlValidity, err = parseCRLValidity(s.crlValidity); err != nil {
		return err
	}
	if err := checkCRLURL(o.crlURL); err != nil {
		return err
	}
	pick(&o.storeURL, "store", cfg.Store)
	pick(&s.ttl, "agent-cert-ttl", cfg.AgentCertTTL)
	pick(&s.boundTTL, "bound-keypair-cert-ttl", cfg.BoundKeypair.CertTTL)
	pick(&s.interTTL, "ca-intermediate-ttl", cfg.CA.IntermediateTTL)
	pick(&s.draftTTL, "ca-draft-ttl", cfg.CA.DraftTTL)
	pick(&s.jwtPeriod, "jwt-key-rotation-period", cfg.JWTSVID.KeyRotationPeriod)
	pick(&o.logFormat, "log-format", cfg.Log.Format)
	pick(&o.logLevel, "log-level", cfg.Log.Level)
	if !f.Changed("trusted-proxy") {
		o.trustedProxies = cfg.TrustedProxies
	}
	pick(&o.discovery, "discovery", cfg.Discovery.Address)
	pick(&o.discoveryFP, "discovery-fingerprint", cfg.Discovery.Fingerprint)
	pick(&o.pskOptional, "psk-optional-until", cfg.Bootstrap.PSKOptionalUntil)
	if !f.Changed("psk-required") && cfg.Bootstrap.PSKRequired != nil {
		o.pskRequired = *cfg.Bootstrap.PSKRequired
	}
	if o.signerMinLead, err = signerMinLeadTime(cfg.Signer.MinLeadTime); err != nil {
		return err
	}
	o.recoveriesWarnAt = defaultRecoveriesWarnAt
	if w := cfg.BoundKeypair.RecoveriesWarnAt; w != nil {
		o.recoveriesWarnAt = *w
	}
	if n := cfg.Limits.MaxConnections; n != nil && !f.Changed("max-connections") {
		o.maxConnections = *n
	}
	if o.maxConnections < 0 {
		return fmt.Errorf("limits.max_connections %d: want a number of connections, or 0 for the default (the open-file limit less 256, at least half of it)", o.maxConnections)
	}
	if n := cfg.Limits.MaxCallsPerSource; n != nil && !f.Changed("max-calls-per-source") {
		o.maxCallsPerSource = *n
	}
	if o.maxCallsPerSource == 0 {
		o.maxCallsPerSource = authority.DefaultMaxCallsPerSource
	}
	if o.maxCallsPerSource < 0 {
		return fmt.Errorf("limits.max_calls_per_source %d: want a number of calls, such as %d (the default)", o.maxCallsPerSource, authority.DefaultMaxCallsPerSource)
	}
	if n := cfg.Limits.RenewalsPerLifetime; n != nil && !f.Changed("renewals-per-lifetime") {
		o.renewalsPerLifetime = *n
	}
	if o.renewalsPerLifetime == 0 {
		o.renewalsPerLifetime = authority.DefaultRenewalsPerLifetime
	}
	if o.renewalsPerLifetime < 0 {
		return fmt.Errorf("limits.renewals_per_lifetime %d: want a number of renewals, such as %d (the default)", o.renewalsPerLifetime, authority.DefaultRenewalsPerLifetime)
	}
	pick(&s.storeTimeout, "store-timeout", cfg.Limits.StoreTimeout)
	if o.storeTimeout, err = parseStoreTimeout(s.storeTimeout); err != nil {
		return err
	}
	pick(&s.callTimeout, "call-timeout", cfg.Limits.CallTimeout)
	if o.callTimeout, err = time.ParseDuration(s.callTimeout); err != nil || o.callTimeout < time.Second {
		return fmt.Errorf("limits.call_timeout %q: want a duration of at least 1s, such as 1m", s.callTimeout)
	}
	o.policy, o.endpoints = cfg.Discovery.Policy, cfg.Discovery.Endpoints
	if cfg.Discovery.RegisterEvery != "" {
		if o.registerEvery, err = time.ParseDuration(cfg.Discovery.RegisterEvery); err != nil || o.registerEvery < time.Minute {
			return fmt.Errorf("discovery.register_every %q: want a duration of at least 1m", cfg.Discovery.RegisterEvery)
		}
	}
	if cfg.Discovery.KeysRefresh != "" {
		if o.keysRefresh, err = parseKeysRefresh(cfg.Discovery.KeysRefresh); err != nil {
			return err
		}
	}
	if o.agentCertTTL, o.boundCertTTL, err = parseAgentCertTTLs(s.ttl, s.boundTTL); err != nil {
		return err
	}
	if o.caIntermediateTTL, err = parseCAIntermediateTTL(s.interTTL); err != nil {
		return err
	}
	if o.caDraftTTL, err = parseCADraftTTL(s.draftTTL); err != nil {
		return err
	}
	if o.jwtKeyPeriod, err = authority.ParseSharedSetting(authority.SettingJWTKeyRotationPeriod, s.jwtPeriod); err != nil {
		return err
	}
	// Which shared settings were given (a flag, its variable, the
	// file), not left to the default: only those conflict with the
	// store's value at start (sharedsettings.go).
	o.sharedGiven = map[string]string{}
	given := func(key, flag, fromFile string) {
		switch {
		case f.Changed(flag):
			o.sharedGiven[key] = "--" + flag + " (or " + EnvName(flag) + ")"
		case fromFile != "":
			o.sharedGiven[key] = "" // the settings file, named at start
		}
	}
	given(authority.SettingSignerMinLeadTime, "", cfg.Signer.MinLeadTime)
	given(authority.SettingCAIntermediateTTL, "ca-intermediate-ttl", cfg.CA.IntermediateTTL)
	given(authority.SettingCADraftTTL, "ca-draft-ttl", cfg.CA.DraftTTL)
	given(authority.SettingJWTKeyRotationPeriod, "jwt-key-rotation-period", cfg.JWTSVID.KeyRotationPeriod)
	return nil
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

// parseKeysRefresh reads discovery.keys_refresh, the period of every
// replica's fetch of discovery's ticket keys: from 30s (3 times the 10 s
// an unknown key ID waits between two fetches) to 10m (how long a key
// discovery revoked may stay trusted).
func parseKeysRefresh(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d < referral.MinRefreshEvery || d > referral.MaxRefreshEvery {
		return 0, fmt.Errorf("discovery.keys_refresh %q: want a duration from %s to %s, such as %s (the default)", v, referral.MinRefreshEvery, referral.MaxRefreshEvery, referral.RefreshEvery)
	}
	return d, nil
}

// parseAgentCertTTLs reads agent_cert_ttl and bound_keypair.cert_ttl (a
// bound "" is zero: the default, worked out by runAuthority). The
// authority and dev both read them here, before anything starts.
func parseAgentCertTTLs(ttl, boundTTL string) (agent, bound time.Duration, err error) {
	if agent, err = time.ParseDuration(ttl); err != nil || agent <= 0 || agent > maxAgentCertTTL {
		return 0, 0, fmt.Errorf("agent_cert_ttl %q: want a duration of at most 168h, such as 24h", ttl)
	}
	if boundTTL != "" {
		if bound, err = time.ParseDuration(boundTTL); err != nil || bound <= 0 || bound > maxAgentCertTTL {
			return 0, 0, fmt.Errorf("bound_keypair.cert_ttl %q: want a duration of at most 168h, such as 1h", boundTTL)
		}
	}
	return agent, bound, nil
}

// parseCAIntermediateTTL reads ca.intermediate_ttl: a duration within
// [authority.MinCAIntermediateTTL, ca.RootTTL].
func parseCAIntermediateTTL(v string) (time.Duration, error) {
	return authority.ParseSharedSetting(authority.SettingCAIntermediateTTL, v)
}

// parseCADraftTTL reads ca.draft_ttl: a duration within
// [authority.MinCADraftTTL, authority.MaxCADraftTTL].
func parseCADraftTTL(v string) (time.Duration, error) {
	return authority.ParseSharedSetting(authority.SettingCADraftTTL, v)
}

// storeDefaultHelp is the store a command reading the data directory
// opens when --store is not given.
const storeDefaultHelp = "store: in DIR/authority.yaml, else the one DIR/authority.json records, without a password: PGPASSWORD or PGPASSFILE gives it, as to muster authority; else DIR/muster.db"

// checkStoreURL checks the form of a store URL without connecting.
func checkStoreURL(url string) error {
	switch {
	case url == "sqlite://":
		return fmt.Errorf("store URL %q has no path", url)
	case strings.HasPrefix(url, "sqlite://"), strings.HasPrefix(url, "postgres://"), strings.HasPrefix(url, "postgresql://"):
		return nil
	}
	return fmt.Errorf("store URL must start with sqlite://, postgres:// or postgresql:// (got %q)", storeURLWithoutPassword(url))
}

// openStore opens the store a URL names, a PostgreSQL one with the
// default request timeout.
func openStore(ctx context.Context, url string) (store.Store, error) {
	return openStoreWith(ctx, url, 0, nil)
}

// openStoreWith opens the store a URL names; a PostgreSQL store gives up a
// request unanswered after timeout (limits.store_timeout; 0: the
// default). A SQLite store is a file of this host's: it has no peer to
// hang. migrating, if not nil, hears of the migrations about to be
// applied.
func openStoreWith(ctx context.Context, url string, timeout time.Duration, migrating func(from, to int) error) (store.Store, error) {
	if err := checkStoreURL(url); err != nil {
		return nil, err
	}
	switch {
	case strings.HasPrefix(url, "sqlite://"):
		path := strings.TrimPrefix(url, "sqlite://")
		if path == "" {
			return nil, fmt.Errorf("store URL %q has no path", url)
		}
		return sqlite.Open(ctx, path, sqlite.WithMigrating(migrating))
	default:
		return postgres.Open(ctx, url, postgres.WithRequestTimeout(timeout), postgres.WithMigrating(migrating))
	}
}

// maxStoreTimeout is limits.store_timeout's ceiling: agents give a renewal
// 30 s, and pgx takes up to 5 s more to give up a request it cancelled,
// so a longer one would again leave agents with DEADLINE_EXCEEDED rather
// than UNAVAILABLE, which they retry.
const maxStoreTimeout = 20 * time.Second

// parseStoreTimeout reads limits.store_timeout.
func parseStoreTimeout(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Second || d > maxStoreTimeout {
		return 0, fmt.Errorf("limits.store_timeout %q: want a duration from 1s to %s, such as %s", s, maxStoreTimeout, postgres.DefaultRequestTimeout)
	}
	return d, nil
}

// logPool says how many connections a PostgreSQL store's pool opens at
// most, and what set it: the sizing an operator checks against the
// database's max_connections (docs/high-availability.md); and how long a
// request may go unanswered (limits.store_timeout).
func logPool(log *slog.Logger, st store.Store) {
	ps, ok := st.(*postgres.Store)
	if !ok {
		return
	}
	n, fromURL := ps.PoolMaxConns()
	from := "default"
	if fromURL {
		from = "pool_max_conns in the store URL"
	}
	log.Info("store connection pool", "pool_max_conns", n, "set_by", from, "outside_pool", 2, // the leader lock and the change listener
		"store_timeout", ps.RequestTimeout().String())
}

// authoritySetup is what runAuthority needs before it opens the store,
// each piece checked: what --check-config validates.
type authoritySetup struct {
	log     *slog.Logger
	proxies []netip.Prefix
	disc    *authority.DiscoveryConfig
	pskOpt  time.Time
	dir     datadir.Dir
	info    datadir.Info
	ca      *ca.Hierarchy
	sk      seal.StorageKey
	// data is the data directory as read, its store URL among it.
	data dataDir
}

// loadAuthority checks the settings and reads the data directory, opening
// nothing that serves or writes.
func loadAuthority(env *Env, o *authorityOptions) (*authoritySetup, error) {
	log, err := newLogger(env.Stderr, o.logFormat, o.logLevel)
	if err != nil {
		return nil, err
	}
	if err := checkPprof(o.pprofListen); err != nil {
		return nil, err
	}
	if o.agentCertTTL <= 0 || o.agentCertTTL > maxAgentCertTTL {
		return nil, fmt.Errorf("agent certificate ttl must be between 1s and %s", maxAgentCertTTL)
	}
	if o.boundCertTTL > maxAgentCertTTL {
		return nil, fmt.Errorf("bound-keypair certificate ttl must be between 1s and %s", maxAgentCertTTL)
	}
	if o.boundCertTTL == 0 {
		o.boundCertTTL = min(enroll.DefaultBoundKeypairCertTTL, o.agentCertTTL)
	}
	proxies, err := listener.ParseTrustedProxies(o.trustedProxies)
	if err != nil {
		return nil, err
	}
	disc, pskOptionalUntil, err := bootstrapSettings(*o, log)
	if err != nil {
		return nil, err
	}
	dir := datadir.Dir(o.dir)
	d, err := loadDataDir(dir, o.storeURL)
	if err != nil {
		return nil, err
	}
	o.storeURL = d.url
	return &authoritySetup{log: log, proxies: proxies, disc: disc, pskOpt: pskOptionalUntil, dir: dir, info: d.info, ca: d.ca, sk: d.sk, data: d}, nil
}

// dataDir is what an authority's data directory holds, checked: its
// info, its CA (matching the fingerprint recorded at init), its storage
// key, and the store URL in force.
type dataDir struct {
	info datadir.Info
	ca   *ca.Hierarchy
	sk   seal.StorageKey
	url  string
	// urlFromInfo: url is the one authority.json records, without a
	// password.
	urlFromInfo bool
	// migrating, if not nil, hears of the migrations the store's opening
	// is about to apply (store.WithMigrating).
	migrating func(from, to int) error
}

// loadDataDir reads and checks dir; storeURL, if given, overrides the
// store the directory names.
func loadDataDir(dir datadir.Dir, storeURL string) (dataDir, error) {
	info, err := dir.ReadInfo()
	if err != nil {
		return dataDir{}, err
	}
	h, err := ca.Load(dir.CADir())
	if err != nil {
		return dataDir{}, err
	}
	if h.Fingerprint() != info.CAFingerprint {
		return dataDir{}, fmt.Errorf("the root CA in %s does not match the fingerprint in %s", dir.CADir(), dir.InfoFile())
	}
	sk, err := seal.LoadStorageKey(dir.StorageKeyFile())
	if err != nil {
		return dataDir{}, err
	}
	url, fromInfo, err := dir.StoreURL(info, storeURL)
	if err != nil {
		return dataDir{}, err
	}
	if err := checkStoreURL(url); err != nil {
		return dataDir{}, err
	}
	return dataDir{info: info, ca: h, sk: sk, url: url, urlFromInfo: fromInfo}, nil
}

// openStore opens d's store. Failing to connect to the one authority.json
// records (no password in it) names where the password comes from and the
// way out, since the URL given nowhere by the user is not what they
// would think of.
func (d dataDir) openStore(ctx context.Context) (store.Store, error) {
	return d.openStoreWith(ctx, 0)
}

// openStoreWith is openStore with the PostgreSQL store's request timeout
// (0: the default).
func (d dataDir) openStoreWith(ctx context.Context, timeout time.Duration) (store.Store, error) {
	st, err := openStoreWith(ctx, d.url, timeout, d.migrating)
	return st, d.storeErr(err)
}

// storeErr is err, from opening d's store or taking its serving lock,
// with the way out.
func (d dataDir) storeErr(err error) error {
	if err != nil && errors.Is(err, store.ErrUnavailable) {
		// Not the password: the database did not answer, or refused the
		// connection (stopped, restarting, unreachable from here). The
		// URL given (not the recorded one) may hold a password.
		which := "the store authority.json records, " + d.url + ","
		if !d.urlFromInfo {
			which = "the store " + storeURLWithoutPassword(d.url)
		}
		return fmt.Errorf("%s is unavailable: %w; start the database or make it reachable from here, "+
			"then run this again (--store URL, store: in authority.yaml, or MUSTER_STORE names another)", which, err)
	}
	if err != nil && d.urlFromInfo {
		return fmt.Errorf("the store authority.json records, %s: %w; its password comes from PGPASSWORD or PGPASSFILE, as for muster authority: "+
			"set one, or give --store URL (or store: in authority.yaml, or MUSTER_STORE)", d.url, err)
	}
	return err
}

// servingHolder is a shared store (PostgreSQL), on which a serving
// authority holds a lock that keeps out the offline commands that need
// every authority stopped.
type servingHolder interface {
	HoldServing(ctx context.Context, onLost func(error)) (release func(), err error)
}

// lockAuthorityFiles takes the data directory's lock and, for an SQLite
// store (url), the database file's: what keeps a second authority off
// both, and the offline commands that need the authority stopped. holder
// (datadir.HolderAuthority, HolderReapply) is the command the lock files
// name to a process refused meanwhile.
func lockAuthorityFiles(dir datadir.Dir, url, holder string) (unlock func(), err error) {
	unlock, err = dir.LockAs(holder)
	if err != nil {
		return nil, err
	}
	if db, ok := strings.CutPrefix(url, "sqlite://"); ok && db != "" {
		unlockDB, err := datadir.LockSQLiteStoreAs(db, holder)
		if err != nil {
			unlock()
			return nil, err
		}
		unlockDir := unlock
		unlock = func() { unlockDB(); unlockDir() }
	}
	return unlock, nil
}

// openAuthorityStore does what comes before anything writes to an
// authority's store: the directory's lock (one writer at a time), the
// store opened and checked against the directory, the audit chain's head
// checked. onAppend hears of each record. configPath is the settings file
// the authority reads, named with --config in the ways out it prints.
// close undoes it all.
func openAuthorityStore(ctx context.Context, dir datadir.Dir, configPath string, d dataDir, timeout time.Duration,
	onAppend func(audit.Event), onServingLost func(error)) (st store.Store, logger *audit.Logger, close func(), err error) {
	info, sk, url := d.info, d.sk, d.url
	unlock, err := lockAuthorityFiles(dir, url, datadir.HolderAuthority)
	if err != nil {
		return nil, nil, nil, err
	}
	excluded := func(err error) error {
		if errors.Is(err, postgres.ErrExcluded) {
			return fmt.Errorf("%w (muster store reapply, which re-applies what a restore from a backup undid): start the authority again once it has finished", err)
		}
		return err
	}
	// The serving lock is taken before the store opens, which may
	// migrate it: never under an offline command that works on it.
	releaseOpening := func() {}
	if !strings.HasPrefix(url, "sqlite://") && checkStoreURL(url) == nil {
		release, err := postgres.HoldServingAt(ctx, url)
		switch {
		case errors.Is(err, postgres.ErrExcluded):
			unlock()
			return nil, nil, nil, excluded(err)
		case err != nil:
			// Not opened: should the database answer now, opening would
			// migrate the store without the lock. Said as opening says
			// a database that does not answer, with its way out.
			unlock()
			return nil, nil, nil, d.storeErr(err)
		}
		releaseOpening = release
	}
	defer releaseOpening()
	if st, err = d.openStoreWith(ctx, timeout); err != nil {
		unlock()
		return nil, nil, nil, err
	}
	close = func() { st.Close(); unlock() }
	// A shared store has no file to lock: every authority on it holds its
	// serving lock (shared) while it runs, which keeps out the offline
	// commands that need every authority stopped (store reapply).
	if s, ok := st.(servingHolder); ok {
		release, err := s.HoldServing(ctx, onServingLost)
		if err != nil {
			close()
			return nil, nil, nil, excluded(err)
		}
		closeStore := close
		close = func() { release(); closeStore() }
	}
	if err := datadir.CheckStore(ctx, st, dir, info, storeURLWithoutPassword(url)); err != nil {
		close()
		return nil, nil, nil, err
	}
	if logger, err = newAuditLogger(st, sk, dir, configPath, onAppend); err == nil {
		logger.SetRestoreDoc(restoreDoc(dir, configPath, d))
		err = logger.CheckHead(ctx)
	}
	if err != nil {
		close()
		return nil, nil, nil, err
	}
	return st, logger, close, nil
}

// errStopServing is what stops an authority whose serving lock an
// offline command took in a gap of its connection: the command
// (muster store reapply) rewrites the store under it.
var errStopServing = errors.New("store: an offline command that needs every authority stopped (muster store reapply) took the serving lock " +
	"while this authority's connection holding it had failed, and works on the store: this authority stopped serving rather than write " +
	"under it; start it again once the command has finished (systemctl start muster-authority)")

func runAuthority(ctx context.Context, env *Env, o authorityOptions) (err error) {
	// Not audited: the audit chain is in the store the offline command
	// rewrites, and a record appended now would land in its work.
	ctx, stopServing := context.WithCancelCause(ctx)
	defer func() {
		if cause := context.Cause(ctx); errors.Is(cause, errStopServing) {
			err = prefixed("authority", cause)
		}
		stopServing(nil)
	}()
	su, err := loadAuthority(env, &o)
	if err != nil {
		return prefixed("authority", err)
	}
	log, proxies, disc, pskOptionalUntil, dir, info, h, sk := su.log, su.proxies, su.disc, su.pskOpt, su.dir, su.info, su.ca, su.sk
	applyMemoryLimit(log, env.Getenv, o.memoryLimit)
	m := authority.NewMetrics(Version)
	if strings.HasPrefix(su.data.url, "sqlite://") {
		// Said before the store opens: its migrations are what may need
		// the space first.
		if _, err := sqlite.TempDir(); err != nil {
			log.Warn("store: " + err.Error())
		}
	}
	// A migration may take minutes on a large fleet, before the
	// listeners open (docs/install.md, "Upgrades"): say it is under way,
	// and when it is done, or the start reads as hung.
	ml := &migrationLog{log: log, then: "the authority serves once it is done"}
	su.data.migrating = ml.migrating
	st, logger, closeStore, err := openAuthorityStore(ctx, dir, o.configPath, su.data, o.storeTimeout, m.OnAudit, func(err error) {
		if err == nil {
			log.Info("store: the serving lock is held again")
			return
		}
		if errors.Is(err, postgres.ErrExcluded) {
			log.Error(errStopServing.Error(), "error", err)
			stopServing(errStopServing)
			return
		}
		log.Warn("store: the serving lock is lost; until it is held again (tried every 2 s), muster store reapply is not kept out while this authority serves", "error", err)
	})
	if err != nil {
		return prefixed("authority", err)
	}
	ml.done()
	defer closeStore()
	logPool(log, st)
	// The store is reachable: a refusal over the keys' custody is
	// audited, with the way out, as the operator reads it with
	// `muster audit list --offline` when no authority runs.
	denied := func(err error) error {
		return prefixed("authority", refuseStart(ctx, logger, log, info.AuthorityID, "key custody", err))
	}
	if err := reconcileShared(ctx, st, &o, logger, log); err != nil {
		return prefixed("authority", refuseStart(ctx, logger, log, info.AuthorityID, "shared settings", err))
	}
	rec, err := storeCustody(ctx, st, offlineDir{dir: dir, configPath: o.configPath}, info.Custody, o.pkcs11Module)
	if err != nil {
		return denied(err)
	}
	token, err := openToken(rec, o.pkcs11Module, o.pkcs11PINFile)
	if err != nil {
		if rec != nil {
			err = tokenWayOut(err, dir, rec, o.pkcs11Module, o.pkcs11PINFile)
		}
		return denied(err)
	}
	if token != nil {
		defer token.Close()
		// A key gone from the token names the commands that replace
		// it, with this authority's directory, to run pasted. Not
		// --config: those commands call the running authority, and
		// refuse it without --offline.
		od := offlineDir{dir: dir, configPath: o.configPath}
		token.NameDataDir(od.quoted())
	}
	srv, err := authority.New(authority.Config{
		Dir: dir, ConfigFile: o.configPath, Info: info, CA: h, Store: st, Audit: logger, StorageKey: sk, Token: token,
		Listen: o.listen, Advertise: o.advertise, BootstrapListen: o.bootstrapListen,
		MetricsListen: o.metricsListen, AgentCertTTL: o.agentCertTTL, TrustedProxies: proxies,
		CAIntermediateTTL: o.caIntermediateTTL, CADraftTTL: o.caDraftTTL, JWTKeyRotationPeriod: o.jwtKeyPeriod,
		Discovery: disc, PSKOptionalUntil: pskOptionalUntil,
		Version: reportedVersion(), Log: log, Ready: o.ready,
		SignerMinLeadTime:   o.signerMinLead,
		RecoveriesWarnAt:    o.recoveriesWarnAt,
		BoundKeypairCertTTL: o.boundCertTTL,
		MaxConnections:      o.maxConnections,
		CallTimeout:         o.callTimeout,
		MaxCallsPerSource:   o.maxCallsPerSource,
		RenewalsPerLifetime: o.renewalsPerLifetime,
		CRLListen:           o.crlListen,
		CRLURL:              o.crlURL,
		CRLValidity:         o.crlValidity,
	}, m)
	if err != nil {
		return prefixed("authority", err)
	}
	if err := withPprof(ctx, o.pprofListen, log, srv.Run); err != nil {
		if token != nil && errors.Is(err, custody.ErrKey) {
			return denied(fmt.Errorf("%w: the PKCS#11 token %s does not hold a key the store names (its object deleted, the token initialised again, "+
				"or another token with that label): restore the token from its backup (docs/hsm.md \"Production\") and start again: `muster-pkcs11 authority --data %s`, "+
				"with --pkcs11-module PATH if the token that holds the keys is another module's", err, rec.URI, shellword.Quote(string(dir))))
		}
		return prefixed("authority", err)
	}
	log.Info("authority stopped")
	return nil
}

// maxPSKOptional is the migration window past which the authority warns
// that it is long.
const maxPSKOptional = 30 * 24 * time.Hour

// bootstrapSettings checks the discovery and PSK settings together. The
// PSK may be made optional only for a migration: with an end date, and only
// while referral tickets are enforced (DESIGN.md); anything else refuses to
// start rather than admit agents on public information alone.
func bootstrapSettings(o authorityOptions, log *slog.Logger) (*authority.DiscoveryConfig, time.Time, error) {
	var disc *authority.DiscoveryConfig
	if o.discovery != "" {
		if o.discoveryFP != "" {
			fp, err := ca.ParseFingerprint(o.discoveryFP)
			if err != nil {
				return nil, time.Time{}, fmt.Errorf("discovery fingerprint: %w", err)
			}
			o.discoveryFP = fp
		} else {
			log.Warn("no --discovery-fingerprint: trusting the system roots for the discovery service's certificate")
		}
		if err := o.policy.Validate(); err != nil {
			return nil, time.Time{}, fmt.Errorf("discovery.policy: %w", err)
		}
		for _, ep := range o.endpoints {
			if err := discovery.CheckEndpoint(ep); err != nil {
				return nil, time.Time{}, fmt.Errorf("discovery.endpoints: %w", err)
			}
		}
		disc = &authority.DiscoveryConfig{Address: o.discovery, Fingerprint: o.discoveryFP, Policy: o.policy,
			RegisterEvery: o.registerEvery, KeysRefresh: o.keysRefresh, Endpoints: o.endpoints}
	} else if o.discoveryFP != "" {
		return nil, time.Time{}, errors.New("--discovery-fingerprint without --discovery")
	}
	var until time.Time
	if o.pskOptional != "" {
		t, err := time.Parse(time.RFC3339, o.pskOptional)
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("bootstrap.psk_optional_until %q: want an RFC 3339 time such as 2026-12-31T00:00:00Z", o.pskOptional)
		}
		until = t
	}
	switch {
	case o.pskRequired && !until.IsZero():
		log.Warn("bootstrap.psk_optional_until is ignored: bootstrap.psk_required is true")
		return disc, time.Time{}, nil
	case o.pskRequired:
		return disc, time.Time{}, nil
	case until.IsZero():
		return nil, time.Time{}, errors.New("bootstrap.psk_required false needs bootstrap.psk_optional_until: the end of the migration")
	case disc == nil:
		return nil, time.Time{}, errors.New("bootstrap.psk_required false needs referral tickets: configure a discovery service (--discovery)")
	case !until.After(time.Now()):
		log.Warn("bootstrap.psk_optional_until has passed: the bootstrap PSK is required", "psk_optional_until", until)
	case until.After(time.Now().Add(maxPSKOptional)):
		log.Warn("UNSAFE until the migration ends, and it ends far away: agents with a referral ticket but no bootstrap PSK are admitted; keep the window short",
			"psk_optional_until", until, "more_than", maxPSKOptional.String())
	default:
		log.Warn("UNSAFE until the migration ends: agents with a referral ticket but no bootstrap PSK are admitted",
			"psk_optional_until", until)
	}
	return disc, until, nil
}

// prefixed is err under "what: ", unless its message already starts so
// (the authority package names itself): one "authority: " per line.
func prefixed(what string, err error) error {
	if strings.HasPrefix(err.Error(), what+": ") {
		return err
	}
	return fmt.Errorf("%s: %w", what, err)
}

// parseCRLValidity reads crl_validity: a duration of at least
// crl.MinValidity.
func parseCRLValidity(v string) (time.Duration, error) {
	if v == "" {
		return crl.DefaultValidity, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < crl.MinValidity {
		return 0, fmt.Errorf("crl_validity %q: want a duration of at least %s, such as 24h", v, crl.MinValidity)
	}
	return d, nil
}

// checkCRLURL checks crl_url: an absolute http or https URL without a
// query, to which /crl/ROLE-SERIAL.crl is appended.
func checkCRLURL(v string) error {
	if v == "" {
		return nil
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("crl_url %q: want a URL such as http://crl.example.com:7445 (relying parties fetch BASE/crl/ROLE-SERIAL.crl)", v)
	}
	return nil
}

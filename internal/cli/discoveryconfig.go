package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/muster-dev/muster/internal/callcap"
	"github.com/muster-dev/muster/internal/discoveryd"
	"github.com/muster-dev/muster/internal/listener"
)

// discoverySettings completes o from the settings file (DIR/discovery.yaml,
// or configFile when given) where neither a flag nor a MUSTER_* variable
// set a value, and checks the key rotation period.
func discoverySettings(cmd *cobra.Command, o *discoveryOptions, configFile string) error {
	o.configFile = discoveryd.Dir(o.dir).ConfigFile()
	if configFile != "" {
		// A file named on purpose must exist; DIR/discovery.yaml is
		// optional.
		if _, err := os.Stat(configFile); err != nil {
			return fmt.Errorf("--config: %w", err)
		}
		o.configFile = configFile
	}
	cfg, err := loadDiscoveryConfig(o.configFile)
	if err != nil {
		return err
	}
	// A relative SQLite path is under the data directory, as the
	// authority's (storeUnder).
	cfg.Store = storeUnder(o.dir, cfg.Store)
	f := cmd.Flags()
	pick := func(dst *string, flag, fromFile string) {
		if !f.Changed(flag) && fromFile != "" {
			*dst = fromFile
		}
	}
	pick(&o.listen, "listen", cfg.Listen)
	pick(&o.advertise, "advertise", cfg.Advertise)
	pick(&o.storeURL, "store", cfg.Store)
	pick(&o.metricsListen, "metrics-listen", cfg.MetricsListen)
	pick(&o.logFormat, "log-format", cfg.Log.Format)
	pick(&o.logLevel, "log-level", cfg.Log.Level)
	if !f.Changed("trusted-proxy") && len(cfg.TrustedProxies) > 0 {
		o.trustedProxies = cfg.TrustedProxies
	}
	if !f.Changed("key-rotation") && cfg.KeyRotation != "" {
		if o.keyRotation, err = time.ParseDuration(cfg.KeyRotation); err != nil {
			return fmt.Errorf("%s: key_rotation %q: want a duration such as 720h", o.configFile, cfg.KeyRotation)
		}
	}
	if n := cfg.Limits.MaxCallsPerSource; n != nil && !f.Changed("max-calls-per-source") {
		o.maxCallsPerSource = *n
	}
	if o.maxCallsPerSource == 0 {
		o.maxCallsPerSource = callcap.DefaultPerSource
	}
	if o.maxCallsPerSource < 0 {
		return fmt.Errorf("limits.max_calls_per_source %d: want a number of calls, such as %d (the default)", o.maxCallsPerSource, callcap.DefaultPerSource)
	}
	if !f.Changed("call-timeout") && cfg.Limits.CallTimeout != "" {
		d, err := time.ParseDuration(cfg.Limits.CallTimeout)
		if err != nil || d < time.Second {
			return fmt.Errorf("%s: limits.call_timeout %q: want a duration of at least 1s, such as 1m", o.configFile, cfg.Limits.CallTimeout)
		}
		o.callTimeout = d
	}
	if o.callTimeout < time.Second {
		return fmt.Errorf("limits.call_timeout %s (--call-timeout): want a duration of at least 1s, such as 1m", o.callTimeout)
	}
	if o.keyRotation < minKeyRotation || o.keyRotation > maxKeyRotation {
		return fmt.Errorf("key rotation (--key-rotation, key_rotation) must be between %s and %s", minKeyRotation, maxKeyRotation)
	}
	return nil
}

// checkDiscoveryConfig validates what muster discovery would start with,
// without creating the data directory, opening the store or listening,
// and prints the settings in force (the store URL without its password).
func checkDiscoveryConfig(env *Env, o discoveryOptions) error {
	fail := func(err error) error { return fmt.Errorf("discovery: %w", err) }
	if _, err := newLogger(io.Discard, o.logFormat, o.logLevel); err != nil {
		return fail(err)
	}
	if err := checkPprof(o.pprofListen); err != nil {
		return fail(err)
	}
	if _, err := listener.ParseTrustedProxies(o.trustedProxies); err != nil {
		return fail(err)
	}
	if err := discoveryd.CheckAddresses(o.listen, o.advertise); err != nil {
		return fail(err)
	}
	// The allow-list's warnings (none allowed, open registration) are
	// part of the check's answer.
	log := slog.New(slog.NewTextHandler(env.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	allowed, err := registrationSettings(o.configFile, o.allow, o.openRegistration, log)
	if err != nil {
		return fail(err)
	}
	if fi, err := os.Stat(o.dir); err == nil && !fi.IsDir() {
		return fail(fmt.Errorf("--data %s is not a directory", o.dir))
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fail(err)
	}
	ids := make([]string, len(allowed))
	for i, e := range allowed {
		ids[i] = e.AuthorityID
	}
	w := env.Stdout
	fmt.Fprintln(w, "configuration OK: discovery")
	row := func(k, v string) {
		if v == "" {
			v = "(off)"
		}
		fmt.Fprintf(w, "  %-22s %s\n", k+":", v)
	}
	row("config file", o.configFile)
	row("data", o.dir)
	storeURL, _, err := discoveryd.Dir(o.dir).StoreURL(o.storeURL)
	if err != nil {
		return fail(err)
	}
	row("store", storeURLWithoutPassword(storeURL))
	row("listen", o.listen)
	row("advertise", o.advertise)
	row("metrics_listen", o.metricsListen)
	row("pprof_listen", o.pprofListen)
	row("key_rotation", o.keyRotation.String())
	row("limits.max_calls_per_source", fmt.Sprintf("%d (per source address)", o.maxCallsPerSource))
	row("limits.call_timeout", o.callTimeout.String())
	row("trusted_proxies", strings.Join(o.trustedProxies, ", "))
	row("allowed_authorities", strings.Join(ids, ", "))
	row("open_registration", fmt.Sprint(o.openRegistration))
	row("log.level", o.logLevel)
	return nil
}

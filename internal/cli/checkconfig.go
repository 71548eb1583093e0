package cli

import (
	"fmt"
	"os"
	"strings"

	"github.com/muster-dev/muster/internal/authority"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/listener"
	"github.com/muster-dev/muster/internal/signer"
)

// checkAuthorityConfig validates what muster authority would start with,
// without listening or opening the store, and prints the settings in force
// (the store URL without its password).
func checkAuthorityConfig(env *Env, o authorityOptions, cfgPath string) error {
	su, err := loadAuthority(env, &o)
	if err != nil {
		return fmt.Errorf("authority: %w", err)
	}
	keys, err := checkCustody(su.dir, su.info.Custody, o.pkcs11Module, o.pkcs11PINFile)
	if err != nil {
		return fmt.Errorf("authority: %w", err)
	}
	w := env.Stdout
	fmt.Fprintf(w, "configuration OK: authority %s, trust domain %s\n", su.info.AuthorityID, su.info.TrustDomain)
	row := func(k, v string) {
		if v == "" {
			v = "(off)"
		}
		fmt.Fprintf(w, "  %-22s %s\n", k+":", v)
	}
	// A shared setting's value in force is the store's, which this
	// command does not open: say whose value is printed, and where the
	// one in force is (a replica printed the default while the store
	// held another, as if it were the one in force).
	shared := func(k, v string) {
		switch from, given := o.sharedGiven[k]; {
		case !given:
			v += " (the default: not set here; a shared setting, the store's value is in force if it holds one: muster settings list)"
		case from == "":
			v += " (this settings file's; a shared setting: on SQLite the start writes it to the store, on PostgreSQL a store holding another refuses the start: muster settings list)"
		default:
			v += " (from " + from + "; a shared setting: on SQLite the start writes it to the store, on PostgreSQL a store holding another refuses the start: muster settings list)"
		}
		row(k, v)
	}
	row("config file", cfgPath)
	row("data", o.dir)
	row("store", storeURLWithoutPassword(o.storeURL))
	row("listen", o.listen)
	// Unset, agents are given the listen address (the port bound): say
	// so, as a join's or a hint's ADDR is read here (agent.rejoinTarget).
	advertise := o.advertise
	if advertise == "" {
		advertise = "(not set: agents are given the listen address, " + o.listen + ", as the API binds it)"
	}
	row("advertise", advertise)
	row("bootstrap_listen", o.bootstrapListen)
	row("metrics_listen", o.metricsListen)
	row("crl_listen", o.crlListen)
	row("crl_url", o.crlURL)
	row("crl_validity", o.crlValidity.String())
	row("pprof_listen", o.pprofListen)
	row("agent_cert_ttl", o.agentCertTTL.String())
	shared(authority.SettingCAIntermediateTTL, o.caIntermediateTTL.String())
	shared(authority.SettingCADraftTTL, o.caDraftTTL.String())
	shared(authority.SettingJWTKeyRotationPeriod, o.jwtKeyPeriod.String())
	row("bound_keypair.cert_ttl", o.boundCertTTL.String())
	row("trusted_proxies", strings.Join(o.trustedProxies, ", "))
	limit := fmt.Sprintf("%d (api and bootstrap listeners together)", listener.NewCap(o.maxConnections).Max())
	if o.maxConnections == 0 {
		limit += " (default: the open-file limit less 256, at least half of it)"
	}
	row("limits.max_connections", limit)
	row("limits.call_timeout", o.callTimeout.String())
	row("limits.max_calls_per_source", fmt.Sprintf("%d (per source address, agents' streams aside)", o.maxCallsPerSource))
	row("limits.renewals_per_lifetime", fmt.Sprintf("%d (per agent instance, in this replica's memory)", o.renewalsPerLifetime))
	row("limits.store_timeout", o.storeTimeout.String())
	// The cap's default comes from the open-file limit of the process that
	// reads it: this command's, here, which a service manager may set
	// otherwise for the authority it starts.
	row("open_file_limit", openFileLimit())
	row("memory_limit", describeMemoryLimit(o.memoryLimit, env.Getenv("GOMEMLIMIT")))
	row("discovery.address", o.discovery)
	if o.discovery != "" {
		row("discovery.fingerprint", o.discoveryFP)
		row("discovery.register_every", authority.RegisterEvery(o.registerEvery).String())
		row("discovery.keys_refresh", authority.KeysRefresh(o.keysRefresh).String()+" (how long a ticket key discovery revoked may still be accepted)")
		row("discovery.endpoints", strings.Join(o.endpoints, ", "))
	}
	row("bootstrap.psk_required", fmt.Sprint(o.pskRequired))
	row("bootstrap.psk_optional_until", o.pskOptional)
	shared(authority.SettingSignerMinLeadTime, signer.MinLeadTimeFor(o.signerMinLead).String())
	row("bound_keypair.recoveries_warn_at", fmt.Sprint(o.recoveriesWarnAt))
	format := o.logFormat
	if format == "" {
		format = "json (text on a terminal)"
	}
	row("log.format", format)
	row("log.level", o.logLevel)
	row("key_custody", keys)
	return nil
}

// checkCustody is what --check-config can tell of the token the keys are
// in, without the store or a login (a wrong PIN would spend one of the
// token's tries): that this build can open one, that the module is there
// and that the PIN can be read. The start refuses on each, so saying
// "configuration OK" past them was wrong.
func checkCustody(dir datadir.Dir, c *datadir.Custody, module, pinFile string) (string, error) {
	if c == nil {
		if module != "" || pinFile != "" {
			return "", fmt.Errorf("--pkcs11-module and --pkcs11-pin-file apply to an authority whose keys are in a PKCS#11 token; %s names none", dir.InfoFile())
		}
		return "sealed, as authority.json says (a token the store records, muster ca migrate-custody, is checked at start)", nil
	}
	if !custody.PKCS11Build {
		return "", tokenWayOut(custody.ErrNoPKCS11Build, dir, c, module, pinFile)
	}
	cfg := custody.PKCS11Config{URI: c.URI, Module: c.Module, PINFile: c.PINFile}
	if module != "" {
		cfg.Module = module
	}
	if pinFile != "" {
		cfg.PINFile = pinFile
	}
	u, err := custody.ParsePKCS11URI(cfg.URI)
	if err != nil {
		return "", err
	}
	if cfg.Module == "" {
		cfg.Module = u.ModulePath
	}
	if _, err := os.Stat(cfg.Module); err != nil {
		return "", tokenWayOut(fmt.Errorf("custody: the PKCS#11 module: %w", err), dir, c, module, pinFile)
	}
	if _, err := cfg.ReadPIN(u); err != nil {
		return "", tokenWayOut(err, dir, c, module, pinFile)
	}
	pin := "the PIN file " + cfg.PINFile
	if cfg.PINFile == "" && u.PINSource != "" {
		pin = "the PIN file " + u.PINSource
	} else if cfg.PINFile == "" {
		pin = "the PIN from " + custody.PINEnv
	}
	return fmt.Sprintf("%s, module %s, %s (the token is opened and logged in to at start)", c.URI, cfg.Module, pin), nil
}

// openFileLimit says the open-file limit --check-config read and that the
// running authority reads its own.
func openFileLimit() string {
	const own = "this command's: the authority reads its own at start (LimitNOFILE in its systemd unit, its container's ulimit) and logs the cap it applies (max_connections in \"authority started\")"
	n, ok := listener.FileLimit()
	if !ok {
		return fmt.Sprintf("unknown (the default cap is then %d); %s", listener.DefaultMaxConnsUnknown, own)
	}
	return fmt.Sprintf("%d, %s", n, own)
}

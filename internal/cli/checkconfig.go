package cli

import (
	"fmt"
	"strings"

	"github.com/muster-dev/muster/internal/authority"
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
	w := env.Stdout
	fmt.Fprintf(w, "configuration OK: authority %s, trust domain %s\n", su.info.AuthorityID, su.info.TrustDomain)
	row := func(k, v string) {
		if v == "" {
			v = "(off)"
		}
		fmt.Fprintf(w, "  %-22s %s\n", k+":", v)
	}
	row("config file", cfgPath)
	row("data", o.dir)
	row("store", redactURL(o.storeURL))
	row("listen", o.listen)
	row("advertise", o.advertise)
	row("bootstrap_listen", o.bootstrapListen)
	row("metrics_listen", o.metricsListen)
	row("crl_listen", o.crlListen)
	row("crl_url", o.crlURL)
	row("crl_validity", o.crlValidity.String())
	row("pprof_listen", o.pprofListen)
	row("agent_cert_ttl", o.agentCertTTL.String())
	row("ca.intermediate_ttl", o.caIntermediateTTL.String())
	row("ca.draft_ttl", o.caDraftTTL.String())
	row("jwt_svid.key_rotation_period", o.jwtKeyPeriod.String())
	row("bound_keypair.cert_ttl", o.boundCertTTL.String())
	row("trusted_proxies", strings.Join(o.trustedProxies, ", "))
	limit := fmt.Sprintf("%d (api and bootstrap listeners together)", listener.NewCap(o.maxConnections).Max())
	if o.maxConnections == 0 {
		limit += " (default: the open-file limit less 256, at least half of it)"
	}
	row("limits.max_connections", limit)
	row("limits.call_timeout", o.callTimeout.String())
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
		row("discovery.endpoints", strings.Join(o.endpoints, ", "))
	}
	row("bootstrap.psk_required", fmt.Sprint(o.pskRequired))
	row("bootstrap.psk_optional_until", o.pskOptional)
	row("signer.min_lead_time", signer.MinLeadTimeFor(o.signerMinLead).String())
	row("bound_keypair.recoveries_warn_at", fmt.Sprint(o.recoveriesWarnAt))
	format := o.logFormat
	if format == "" {
		format = "json (text on a terminal)"
	}
	row("log.format", format)
	row("log.level", o.logLevel)
	return nil
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

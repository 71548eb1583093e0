package cli

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/muster-dev/muster/internal/discovery"
)

// discoveryConfig is DIR/discovery.yaml. Unknown keys are refused, so a
// misspelt setting cannot be silently ignored. Open registration has no
// key on purpose: it is unsafe, and takes the --open-registration flag at
// every start.
type discoveryConfig struct {
	AllowedAuthorities []discovery.AllowEntry `yaml:"allowed_authorities"`
	// The server settings, as the flags of the same names; flags and
	// MUSTER_* variables override them.
	Listen         string   `yaml:"listen"`
	Advertise      string   `yaml:"advertise"`
	Store          string   `yaml:"store"`
	MetricsListen  string   `yaml:"metrics_listen"`
	KeyRotation    string   `yaml:"key_rotation"`
	TrustedProxies []string `yaml:"trusted_proxies"`
	Log            struct {
		Format string `yaml:"format"`
		Level  string `yaml:"level"`
	} `yaml:"log"`
	Limits struct {
		// MaxCallsPerSource: nil or 0 keeps the default (1024).
		MaxCallsPerSource *int `yaml:"max_calls_per_source"`
		// CallTimeout: empty keeps the default (1m).
		CallTimeout string `yaml:"call_timeout"`
	} `yaml:"limits"`
}

// loadDiscoveryConfig reads DIR/discovery.yaml, if there is one, and checks
// its entries.
func loadDiscoveryConfig(path string) (discoveryConfig, error) {
	var c discoveryConfig
	err := readYAMLFile(path, &c)
	if err != nil {
		return c, err
	}
	for i, e := range c.AllowedAuthorities {
		if c.AllowedAuthorities[i], err = e.Canonical(); err != nil {
			return c, fmt.Errorf("%s: allowed_authorities[%d]: %w", path, i, err)
		}
	}
	return c, nil
}

// registrationSettings is the allow-list discovery starts with: the
// entries of the settings file (DIR/discovery.yaml or --config) plus those of --allow-authority
// (ID=sha256:HEX). As the authority's bootstrapSettings does for the PSK,
// it refuses what cannot be right (a malformed entry, one ID with two
// roots) and warns about what is unsafe or refuses everything.
func registrationSettings(cfgPath string, flags []string, open bool, log *slog.Logger) ([]discovery.AllowEntry, error) {
	cfg, err := loadDiscoveryConfig(cfgPath)
	if err != nil {
		return nil, err
	}
	entries := cfg.AllowedAuthorities
	for _, f := range flags {
		e, err := discovery.ParseAllowEntry(f)
		if err != nil {
			return nil, fmt.Errorf("--allow-authority: %w", err)
		}
		entries = append(entries, e)
	}
	list, err := discovery.NewAllowlist(entries, open)
	if err != nil {
		return nil, err
	}
	entries = list.Entries()
	ids := make([]string, len(entries))
	for i, e := range entries {
		ids[i] = e.AuthorityID
	}
	switch {
	case open:
		log.Warn("UNSAFE: --open-registration: an authority ID not on the allow-list is locked to the first root that registers it; "+
			"anyone who grinds a key matching the 6 hex digits of an ID (minutes of CPU) can take that ID before its authority does, "+
			"lock it out of this discovery and have tickets issued for it under their own policy",
			"allowed_authorities", strings.Join(ids, ","))
	case len(entries) == 0:
		log.Warn("no authority is allowed to register: every registration is refused; allow each with --allow-authority AUTHORITY_ID=sha256:… (its ca_fingerprint) or in discovery.yaml",
			"config", cfgPath)
	default:
		log.Info("authorities allowed to register", "allowed_authorities", strings.Join(ids, ","))
	}
	return entries, nil
}

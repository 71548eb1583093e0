package discovery

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"regexp"
	"strings"

	"github.com/muster-dev/muster/internal/spiffeid"
)

// Policy is what an authority lets discovery do on its behalf: who may ask
// for a referral ticket, for which node IDs, how often. The authority signs
// it (inside its registration); discovery enforces it. Its JSON form is the
// wire and configuration format; Canonical gives the one encoding that is
// signed.
type Policy struct {
	// AllowedCIDRs are the sources that may ask for tickets; empty: any.
	AllowedCIDRs []string `json:"allowed_cidrs,omitempty" yaml:"allowed_cidrs"`
	// NodeIDPattern, if set, is an RE2 expression a node ID must match as
	// a whole.
	NodeIDPattern string `json:"node_id_pattern,omitempty" yaml:"node_id_pattern"`
	// NodeIDPrefixes, if set, are the prefixes a node ID must start with
	// (one of them).
	NodeIDPrefixes []string `json:"node_id_prefixes,omitempty" yaml:"node_id_prefixes"`
	// DeniedNodeIDPatterns are RE2 expressions; a node ID matching any of
	// them as a whole is refused.
	DeniedNodeIDPatterns []string `json:"denied_node_id_patterns,omitempty" yaml:"denied_node_id_patterns"`
	// RateLimits bound how often tickets are handed out.
	RateLimits RateLimits `json:"rate_limits" yaml:"rate_limits"`
	// NewAgentsPerDay bounds the joins the authority reported in the last
	// 24 hours; once reached, no ticket is handed out. 0: no quota.
	NewAgentsPerDay int64 `json:"new_agents_per_day" yaml:"new_agents_per_day"`

	// compiled forms, set by Validate.
	cidrs  []netip.Prefix
	nodeRE *regexp.Regexp
	denied []*regexp.Regexp
}

// RateLimits are token buckets, per (node ID, source), per source and per
// authority.
type RateLimits struct {
	PerNodeSource Rate `json:"per_node_source" yaml:"per_node_source"`
	PerSource     Rate `json:"per_source" yaml:"per_source"`
	PerAuthority  Rate `json:"per_authority" yaml:"per_authority"`
}

// Rate is a token bucket: PerMinute tokens a minute, at most Burst at once.
type Rate struct {
	PerMinute int64 `json:"per_minute" yaml:"per_minute"`
	Burst     int64 `json:"burst" yaml:"burst"`
}

// DefaultPolicy is what an authority registers when its configuration says
// nothing: any source, any node ID, modest rates and a daily quota, so that
// a leaked PSK plus an open discovery cannot admit a fleet overnight.
func DefaultPolicy() Policy {
	return Policy{
		RateLimits: RateLimits{
			PerNodeSource: Rate{PerMinute: 6, Burst: 3},
			PerSource:     Rate{PerMinute: 60, Burst: 20},
			PerAuthority:  Rate{PerMinute: 600, Burst: 100},
		},
		NewAgentsPerDay: 1000,
	}
}

// Limits on a policy's size, so a policy is cheap to check and store.
const (
	MaxPolicyBytes   = 16 << 10
	maxPolicyEntries = 64
	maxPatternLen    = 256
	maxRate          = 1_000_000
	// maxQuota keeps new_agents_per_day well inside the integers RFC 8785
	// writes exactly (below 2^53): a larger one would canonicalize to
	// another number, which would no longer parse as the same policy.
	maxQuota = 1_000_000_000
)

// ParsePolicy decodes and validates a policy's JSON. Unknown fields are
// refused, so an authority newer than its discovery is told rather than
// half-obeyed.
func ParsePolicy(data []byte) (Policy, error) {
	var p Policy
	if len(data) > MaxPolicyBytes {
		return p, fmt.Errorf("discovery: policy is larger than %d bytes", MaxPolicyBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return Policy{}, fmt.Errorf("discovery: policy: %w", err)
	}
	// dec.More is false before a stray '}' or ']', so only io.EOF proves
	// that nothing follows the object.
	if _, err := dec.Token(); err != io.EOF {
		return Policy{}, errors.New("discovery: policy: trailing data after the object")
	}
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	return p, nil
}

// Validate checks p and compiles its patterns; the checks of Admit need it.
// It sets the compiled forms only when every check passes, and never writes
// into memory a copy of p shares. Not safe for use concurrently with Admit
// on the same Policy.
func (p *Policy) Validate() error {
	if len(p.AllowedCIDRs) > maxPolicyEntries || len(p.NodeIDPrefixes) > maxPolicyEntries || len(p.DeniedNodeIDPatterns) > maxPolicyEntries {
		return fmt.Errorf("discovery: policy: at most %d entries in each list", maxPolicyEntries)
	}
	cidrs := make([]netip.Prefix, 0, len(p.AllowedCIDRs))
	for _, c := range p.AllowedCIDRs {
		pfx, err := netip.ParsePrefix(c)
		if err != nil {
			return fmt.Errorf("discovery: policy: allowed_cidrs: %w", err)
		}
		if pfx != pfx.Masked() {
			return fmt.Errorf("discovery: policy: allowed_cidrs: %s has host bits set (did you mean %s?)", c, pfx.Masked())
		}
		// Admit unmaps IPv4-mapped sources, so a mapped prefix must be
		// unmapped too or it could never match.
		if pfx.Addr().Is4In6() && pfx.Bits() >= 96 {
			pfx = netip.PrefixFrom(pfx.Addr().Unmap(), pfx.Bits()-96)
		}
		cidrs = append(cidrs, pfx)
	}
	var nodeRE *regexp.Regexp
	if p.NodeIDPattern != "" {
		var err error
		if nodeRE, err = compileWhole(p.NodeIDPattern); err != nil {
			return fmt.Errorf("discovery: policy: node_id_pattern: %w", err)
		}
	}
	for _, pre := range p.NodeIDPrefixes {
		if pre == "" || len(pre) > 63 || strings.Trim(pre, "abcdefghijklmnopqrstuvwxyz0123456789.-") != "" || pre[0] == '.' || pre[0] == '-' {
			return fmt.Errorf("discovery: policy: node_id_prefixes: %q is not the start of a node ID", pre)
		}
	}
	denied := make([]*regexp.Regexp, 0, len(p.DeniedNodeIDPatterns))
	for _, d := range p.DeniedNodeIDPatterns {
		re, err := compileWhole(d)
		if err != nil {
			return fmt.Errorf("discovery: policy: denied_node_id_patterns: %w", err)
		}
		denied = append(denied, re)
	}
	for _, r := range []struct {
		name string
		rate Rate
	}{{"per_node_source", p.RateLimits.PerNodeSource}, {"per_source", p.RateLimits.PerSource}, {"per_authority", p.RateLimits.PerAuthority}} {
		if r.rate.PerMinute <= 0 || r.rate.Burst <= 0 || r.rate.PerMinute > maxRate || r.rate.Burst > maxRate {
			return fmt.Errorf("discovery: policy: rate_limits.%s: per_minute and burst must be between 1 and %d", r.name, maxRate)
		}
	}
	if p.NewAgentsPerDay < 0 || p.NewAgentsPerDay > maxQuota {
		return fmt.Errorf("discovery: policy: new_agents_per_day must be between 0 (no quota) and %d", maxQuota)
	}
	p.cidrs, p.nodeRE, p.denied = cidrs, nodeRE, denied
	return nil
}

// validated reports whether the compiled forms are those of the lists, so
// that Admit fails closed on a policy Validate never accepted.
func (p *Policy) validated() bool {
	return len(p.cidrs) == len(p.AllowedCIDRs) && (p.nodeRE != nil) == (p.NodeIDPattern != "") && len(p.denied) == len(p.DeniedNodeIDPatterns)
}

// compileWhole compiles pattern to match a whole string. The pattern must
// compile on its own first: otherwise one with unbalanced parentheses,
// such as "web)|(.*", would escape the anchors and match anything.
func compileWhole(pattern string) (*regexp.Regexp, error) {
	if len(pattern) > maxPatternLen {
		return nil, fmt.Errorf("pattern longer than %d characters", maxPatternLen)
	}
	if _, err := regexp.Compile(pattern); err != nil {
		return nil, err
	}
	return regexp.Compile(`^(?:` + pattern + `)$`)
}

// Canonical returns the policy's canonical JSON (RFC 8785): the bytes that
// are signed and compared.
func (p Policy) Canonical() ([]byte, error) {
	return canonical(p)
}

// Denial reasons: the label of the denied-tickets metric and the start of
// the message the caller sees.
const (
	DenySource    = "source_not_allowed"
	DenyNodeID    = "node_id_not_allowed"
	DenyRateLimit = "rate_limited"
	DenyQuota     = "quota_exhausted"
	DenyUnknown   = "unknown_authority"
	DenyInvalid   = "invalid_request"
)

// Denial is a refused ticket request: a reason from the list above and a
// detail an operator can act on.
type Denial struct {
	Reason string
	Detail string
}

func (d *Denial) Error() string { return "discovery: " + d.Reason + ": " + d.Detail }

// Admit applies the policy's static rules to one request: the source
// address, then the node ID (valid, pattern, prefixes, denied patterns).
// Rates and the daily quota are the caller's (they need state). Validate
// must have succeeded: otherwise Admit refuses with an error that is not a
// *Denial rather than admit on rules it has not compiled. Safe for
// concurrent use once validated.
func (p *Policy) Admit(source netip.Addr, nodeID string) error {
	if !p.validated() {
		return errors.New("discovery: policy: Admit on a policy that was not validated")
	}
	if len(p.cidrs) > 0 {
		src := source.Unmap()
		ok := false
		for _, c := range p.cidrs {
			if c.Contains(src) {
				ok = true
				break
			}
		}
		if !ok {
			return &Denial{DenySource, fmt.Sprintf("source %s is not in the authority's allowed CIDRs", source)}
		}
	}
	if err := spiffeid.NameError("node ID", "node", nodeID); err != nil {
		return &Denial{DenyInvalid, err.Error()}
	}
	if p.nodeRE != nil && !p.nodeRE.MatchString(nodeID) {
		return &Denial{DenyNodeID, fmt.Sprintf("node ID %q does not match the authority's node ID pattern", nodeID)}
	}
	if len(p.NodeIDPrefixes) > 0 {
		ok := false
		for _, pre := range p.NodeIDPrefixes {
			if strings.HasPrefix(nodeID, pre) {
				ok = true
				break
			}
		}
		if !ok {
			return &Denial{DenyNodeID, fmt.Sprintf("node ID %q does not start with one of the authority's prefixes", nodeID)}
		}
	}
	for i, re := range p.denied {
		if re.MatchString(nodeID) {
			return &Denial{DenyNodeID, fmt.Sprintf("node ID %q matches denied pattern %q", nodeID, p.DeniedNodeIDPatterns[i])}
		}
	}
	return nil
}

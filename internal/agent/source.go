package agent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/joinuri"
	"github.com/muster-dev/muster/internal/psk"
)

// Environment variables of the agent (DESIGN.md "Command-line contract").
const (
	// EnvData is the agent's data directory: not MUSTER_DATA, which
	// names the authority's (or discovery's), so one shell can hold both.
	EnvData          = "MUSTER_AGENT_DATA"
	EnvJoinToken     = "MUSTER_JOIN_TOKEN"
	EnvJoinURI       = "MUSTER_JOIN_URI"
	EnvNodeID        = "MUSTER_NODE_ID"
	EnvAuthority     = "MUSTER_AUTHORITY"
	EnvCAFingerprint = "MUSTER_CA_FINGERPRINT"
	EnvBootstrapPSK  = "MUSTER_BOOTSTRAP_PSK"
	EnvAuthorityID   = "MUSTER_AUTHORITY_ID"
	EnvDiscovery     = "MUSTER_DISCOVERY"
	// EnvDiscoveryFingerprint pins discovery's CA.
	EnvDiscoveryFingerprint = "MUSTER_DISCOVERY_FINGERPRINT"
	// EnvRegistrationSecret binds the agent's key to a bound-keypair
	// token on its first join.
	EnvRegistrationSecret = "MUSTER_REGISTRATION_SECRET"
)

// Token sources, as ResolveJoin names them.
const (
	SourceTokenFlag = "--token"
	SourceTokenFile = "--token-file"
	SourcePSKFlag   = "--psk"
	SourcePSKFile   = "--psk-file"
	SourceEnvPSK    = EnvBootstrapPSK
	SourceURIArg    = "joining URI argument"
	SourceEnvToken  = EnvJoinToken
	SourceEnvURI    = EnvJoinURI
	SourceConfig    = "agent.yaml"
	SourceBound     = "--bound-keypair"
)

// maxTokenFile bounds a token or PSK file: a token is 23 bytes, a PSK 75.
const maxTokenFile = 4 << 10

// JoinInputs are every place a join's parameters can come from.
type JoinInputs struct {
	// The command line: flags, and a joining URI argument.
	Token, TokenFile, URI           string
	PSK, PSKFile                    string
	Node, Authority, CAFingerprint  string
	AuthorityID                     string
	Discovery, DiscoveryFingerprint string
	// BoundKeypair names a bound-keypair token; RegistrationSecretFile
	// holds the secret that binds the key on the first join.
	BoundKeypair, RegistrationSecretFile string
	// Getenv reads the MUSTER_* variables; nil reads none.
	Getenv func(string) string
	// Stdin is read for --token-file -.
	Stdin io.Reader
	// Config is agent.yaml.
	Config Config
}

// ResolvedJoin is a join request, where its token came from, and warnings
// for the operator.
type ResolvedJoin struct {
	Request     JoinRequest
	TokenSource string
	Warnings    []string
}

// layer is one level of precedence: every value it gives beats the layers
// after it.
type layer struct {
	// secret is a join token or (method psk) a bootstrap PSK.
	secret, method, source                    string
	node, authority, fingerprint, authorityID string
	discovery, discoveryFP                    string
	// boundName names a bound-keypair token, regSecret its registration
	// secret.
	boundName, regSecret string
}

// ResolveJoin picks each parameter from the first layer that gives it: the
// command line (flags before the joining URI), then the environment
// (MUSTER_JOIN_TOKEN or MUSTER_BOOTSTRAP_PSK, MUSTER_NODE_ID,
// MUSTER_AUTHORITY, MUSTER_AUTHORITY_ID, MUSTER_CA_FINGERPRINT,
// MUSTER_DISCOVERY, MUSTER_DISCOVERY_FINGERPRINT before MUSTER_JOIN_URI),
// then agent.yaml. The secret, a join token or the bootstrap PSK, comes
// whole from the first layer that gives one; through discovery it may be
// absent (an authority migrating to the PSK admits on the ticket alone).
// At most one of --token, --token-file, --psk, --psk-file and a URI
// argument may be given. Errors never quote a secret.
func ResolveJoin(in JoinInputs) (ResolvedJoin, error) {
	var res ResolvedJoin
	getenv := in.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}

	// The command line.
	cli := layer{node: in.Node, authority: in.Authority, fingerprint: in.CAFingerprint, authorityID: in.AuthorityID,
		discovery: in.Discovery, discoveryFP: in.DiscoveryFingerprint}
	n := 0
	for _, s := range []string{in.Token, in.TokenFile, in.PSK, in.PSKFile, in.URI, in.BoundKeypair} {
		if s != "" {
			n++
		}
	}
	if n > 1 {
		return res, errors.New("give only one of --token, --token-file, --psk, --psk-file, --bound-keypair and a joining URI")
	}
	if in.RegistrationSecretFile != "" {
		sec, err := readSecretFile("--registration-secret-file", in.RegistrationSecretFile, in.Stdin)
		if err != nil {
			return res, err
		}
		cli.regSecret = sec
	}
	switch {
	case in.BoundKeypair != "":
		cli.boundName, cli.method, cli.source = in.BoundKeypair, JoinMethodBoundKeypair, SourceBound
	case in.Token != "":
		cli.secret, cli.method, cli.source = in.Token, JoinMethodToken, SourceTokenFlag
		res.Warnings = append(res.Warnings, "--token is visible to other users of this machine; prefer --token-file or MUSTER_JOIN_TOKEN")
	case in.TokenFile != "":
		tok, err := readSecretFile(SourceTokenFile, in.TokenFile, in.Stdin)
		if err != nil {
			return res, err
		}
		cli.secret, cli.method, cli.source = tok, JoinMethodToken, SourceTokenFile
	case in.PSK != "":
		cli.secret, cli.method, cli.source = in.PSK, JoinMethodPSK, SourcePSKFlag
		res.Warnings = append(res.Warnings, "--psk is visible to other users of this machine; prefer --psk-file or MUSTER_BOOTSTRAP_PSK")
	case in.PSKFile != "":
		p, err := readSecretFile(SourcePSKFile, in.PSKFile, in.Stdin)
		if err != nil {
			return res, err
		}
		cli.secret, cli.method, cli.source = p, JoinMethodPSK, SourcePSKFile
	case in.URI != "":
		res.Warnings = append(res.Warnings, "a joining URI on the command line is visible to other users of this machine; prefer MUSTER_JOIN_URI")
		if err := fromURI(&cli, in.URI, SourceURIArg); err != nil {
			return res, err
		}
	}

	// The environment.
	env := layer{node: getenv(EnvNodeID), authority: getenv(EnvAuthority), fingerprint: getenv(EnvCAFingerprint),
		authorityID: getenv(EnvAuthorityID), discovery: getenv(EnvDiscovery), discoveryFP: getenv(EnvDiscoveryFingerprint),
		regSecret: getenv(EnvRegistrationSecret)}
	if u := getenv(EnvJoinURI); u != "" {
		if err := fromURI(&env, u, SourceEnvURI); err != nil {
			return res, fmt.Errorf("%s: %w", EnvJoinURI, err)
		}
	}
	envToken, envPSK := getenv(EnvJoinToken), getenv(EnvBootstrapPSK)
	switch {
	case envToken != "" && envPSK != "":
		return res, fmt.Errorf("set only one of %s and %s", EnvJoinToken, EnvBootstrapPSK)
	case envToken != "":
		env.secret, env.method, env.source = envToken, JoinMethodToken, SourceEnvToken
	case envPSK != "":
		env.secret, env.method, env.source = envPSK, JoinMethodPSK, SourceEnvPSK
	}

	// agent.yaml.
	switch m := in.Config.JoinMethod; m {
	case "", JoinMethodToken, JoinMethodPSK:
	case JoinMethodBoundKeypair:
		if in.Config.BoundKeypair == "" {
			return res, errors.New("agent.yaml: join method bound-keypair needs bound_keypair (the token's name)")
		}
	default:
		return res, fmt.Errorf("agent.yaml: join method %q is not supported by this agent: use a join token, the bootstrap PSK or a bound-keypair token", m)
	}
	if in.Config.Token != "" && in.Config.PSK != "" {
		return res, errors.New("agent.yaml: give token or psk, not both")
	}
	file := layer{node: in.Config.Node, authority: in.Config.Authority, fingerprint: in.Config.CAFingerprint,
		authorityID: in.Config.AuthorityID, discovery: in.Config.Discovery, discoveryFP: in.Config.DiscoveryFingerprint}
	switch {
	case in.Config.Token != "":
		file.secret, file.method, file.source = in.Config.Token, JoinMethodToken, SourceConfig
	case in.Config.PSK != "":
		file.secret, file.method, file.source = in.Config.PSK, JoinMethodPSK, SourceConfig
	case in.Config.JoinMethod == JoinMethodBoundKeypair:
		file.boundName, file.method, file.source = in.Config.BoundKeypair, JoinMethodBoundKeypair, SourceConfig
	}
	file.regSecret = in.Config.RegistrationSecret

	layers := []layer{cli, env, file}
	pick := func(get func(layer) string) string {
		for _, l := range layers {
			if v := get(l); v != "" {
				return v
			}
		}
		return ""
	}
	var secret, method, boundName string
	for _, l := range layers {
		if l.secret != "" || l.boundName != "" {
			secret, method, boundName, res.TokenSource = l.secret, l.method, l.boundName, l.source
			break
		}
	}
	// Where to join is one choice, made by the first layer that names an
	// authority or a discovery (discovery first within a layer, as
	// agent.yaml after a join through discovery holds both): an explicit
	// --authority is not overridden by a discovery from the environment
	// or agent.yaml, nor the other way round.
	var authority, discovery string
	for _, l := range layers {
		if l.discovery != "" || l.authority != "" {
			if discovery = l.discovery; discovery == "" {
				authority = l.authority
			}
			break
		}
	}
	switch {
	case boundName != "":
	case secret == "" && discovery != "":
		method = JoinMethodPSK
		res.Warnings = append(res.Warnings, "no bootstrap PSK: joining on the referral ticket alone, which the authority accepts only while it migrates to the PSK")
	case secret == "":
		return res, errors.New("no join token or bootstrap PSK: give --token-file FILE, --psk-file FILE, --bound-keypair NAME, MUSTER_JOIN_TOKEN, MUSTER_BOOTSTRAP_PSK, a joining URI, or token or psk in agent.yaml")
	}
	switch {
	case secret == "" || boundName != "":
	case method == JoinMethodPSK:
		p, err := psk.Parse(strings.TrimSpace(secret))
		if errors.Is(err, psk.ErrMalformed) {
			// A file in KEY=VALUE form, upper-case hex, the hex alone:
			// say what the value must be, and where it comes from.
			return res, fmt.Errorf("%s: %w; give it as muster psk show --raw prints it on the authority (the PSK alone, on one line)", res.TokenSource, err)
		}
		if err != nil {
			return res, fmt.Errorf("%s: %w", res.TokenSource, err)
		}
		res.Request.PSK = p
	default:
		t, err := jointoken.Parse(strings.TrimSpace(secret))
		if err != nil {
			return res, fmt.Errorf("%s: %w", res.TokenSource, err)
		}
		res.Request.Token = t
	}
	res.Request = JoinRequest{
		Token:         res.Request.Token,
		PSK:           res.Request.PSK,
		AuthorityID:   pick(func(l layer) string { return l.authorityID }),
		Node:          pick(func(l layer) string { return l.node }),
		Authority:     authority,
		CAFingerprint: pick(func(l layer) string { return l.fingerprint }),
		Discovery:     discovery,
		BoundKeypair:  boundName,
	}
	if boundName != "" {
		if res.Request.Node == "" {
			// muster bot add NAME makes the token of node NAME.
			res.Request.Node = boundName
		}
		res.Request.RegistrationSecret = pick(func(l layer) string { return l.regSecret })
	}
	if discovery != "" {
		res.Request.DiscoveryFingerprint = pick(func(l layer) string { return l.discoveryFP })
		if fp := res.Request.DiscoveryFingerprint; fp != "" {
			canon, err := ca.ParseFingerprint(fp)
			if err != nil {
				return res, fmt.Errorf("discovery fingerprint: %w", err)
			}
			res.Request.DiscoveryFingerprint = canon
		}
	}
	switch {
	case res.Request.Node == "":
		return res, errors.New("no node ID: give --node NODE (or MUSTER_NODE_ID, node= in the joining URI, node in agent.yaml)")
	case discovery != "" && res.Request.AuthorityID == "":
		return res, errors.New("a join through discovery needs the authority ID: give --authority-id ID (or MUSTER_AUTHORITY_ID, authority_id= in the joining URI)")
	case res.Request.Authority == "" && discovery == "":
		return res, errors.New("no authority address: give --authority HOST:PORT (or MUSTER_AUTHORITY, a joining URI, authority in agent.yaml)")
	}
	if fp := res.Request.CAFingerprint; fp != "" {
		canon, err := ca.ParseFingerprint(fp)
		if err != nil {
			return res, err
		}
		res.Request.CAFingerprint = canon
	} else if method == JoinMethodPSK {
		return res, errors.New("a bootstrap PSK join needs the CA fingerprint: give --ca-fingerprint sha256:… (or MUSTER_CA_FINGERPRINT, a muster+psk:// URI, ca_fingerprint in agent.yaml)")
	} else if boundName != "" {
		return res, errors.New("a bound-keypair join needs the CA fingerprint: give --ca-fingerprint sha256:… (or MUSTER_CA_FINGERPRINT, a muster+bound-keypair:// URI, ca_fingerprint in agent.yaml)")
	}
	return res, nil
}

// fromURI fills l from a joining URI; the URI's values rank below the
// flags or variables already in l.
func fromURI(l *layer, s, source string) error {
	u, err := joinuri.Parse(s)
	if err != nil {
		return err
	}
	switch u.Method {
	case joinuri.MethodToken:
		l.secret, l.method = u.Token.Reveal(), JoinMethodToken
	case joinuri.MethodPSK:
		l.secret, l.method = u.PSK.Reveal(), JoinMethodPSK
	case joinuri.MethodBoundKeypair:
		l.boundName, l.method = u.KeypairName, JoinMethodBoundKeypair
		l.regSecret = firstNonEmpty(l.regSecret, u.KeypairSecret)
	default:
		return fmt.Errorf("join method %s is not supported by this agent", u.Method)
	}
	l.source = source
	l.node = firstNonEmpty(l.node, u.Node)
	l.fingerprint = firstNonEmpty(l.fingerprint, u.Fingerprint)
	if u.AuthorityID != "" {
		// With authority_id= the address is discovery's.
		if u.Method == joinuri.MethodToken {
			return errors.New("a join token goes to the authority's address, not through discovery (authority_id=)")
		}
		l.discovery = firstNonEmpty(l.discovery, u.Address)
		l.discoveryFP = firstNonEmpty(l.discoveryFP, u.DiscoveryFingerprint)
		l.authorityID = firstNonEmpty(l.authorityID, u.AuthorityID)
		return nil
	}
	l.authority = firstNonEmpty(l.authority, u.Address)
	return nil
}

// readSecretFile reads a token or PSK from the file of flag (- is stdin).
func readSecretFile(flag, path string, stdin io.Reader) (string, error) {
	var r io.Reader
	if path == "-" {
		if stdin == nil {
			return "", fmt.Errorf("%s -: no standard input", flag)
		}
		r = stdin
	} else {
		f, err := os.Open(path)
		if err != nil {
			return "", fmt.Errorf("%s: %w", flag, err)
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, maxTokenFile+1))
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	if len(data) > maxTokenFile {
		return "", fmt.Errorf("%s %s: larger than a join token or PSK", flag, path)
	}
	tok := strings.TrimSpace(string(data))
	if tok == "" {
		return "", fmt.Errorf("%s %s is empty", flag, path)
	}
	return tok, nil
}

func firstNonEmpty(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

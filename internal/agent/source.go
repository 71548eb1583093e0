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
)

// Environment variables of the agent (DESIGN.md "Command-line contract").
const (
	EnvData          = "MUSTER_DATA"
	EnvJoinToken     = "MUSTER_JOIN_TOKEN"
	EnvJoinURI       = "MUSTER_JOIN_URI"
	EnvNodeID        = "MUSTER_NODE_ID"
	EnvAuthority     = "MUSTER_AUTHORITY"
	EnvCAFingerprint = "MUSTER_CA_FINGERPRINT"
)

// Token sources, as ResolveJoin names them.
const (
	SourceTokenFlag = "--token"
	SourceTokenFile = "--token-file"
	SourceURIArg    = "joining URI argument"
	SourceEnvToken  = EnvJoinToken
	SourceEnvURI    = EnvJoinURI
	SourceConfig    = "agent.yaml"
)

// maxTokenFile bounds a token file: a token is 23 bytes.
const maxTokenFile = 4 << 10

// JoinInputs are every place a join's parameters can come from.
type JoinInputs struct {
	// The command line: flags, and a joining URI argument.
	Token, TokenFile, URI          string
	Node, Authority, CAFingerprint string
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
	token, source, node, authority, fingerprint string
}

// ResolveJoin picks each parameter from the first layer that gives it: the
// command line (flags before the joining URI), then the environment
// (MUSTER_JOIN_TOKEN, MUSTER_NODE_ID, MUSTER_AUTHORITY,
// MUSTER_CA_FINGERPRINT before MUSTER_JOIN_URI), then agent.yaml. At most
// one of --token, --token-file and a URI argument may be given. Errors
// never quote a secret.
func ResolveJoin(in JoinInputs) (ResolvedJoin, error) {
	var res ResolvedJoin
	getenv := in.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}

	// The command line.
	cli := layer{node: in.Node, authority: in.Authority, fingerprint: in.CAFingerprint}
	n := 0
	for _, s := range []string{in.Token, in.TokenFile, in.URI} {
		if s != "" {
			n++
		}
	}
	if n > 1 {
		return res, errors.New("give only one of --token, --token-file and a joining URI")
	}
	switch {
	case in.Token != "":
		cli.token, cli.source = in.Token, SourceTokenFlag
		res.Warnings = append(res.Warnings, "--token is visible to other users of this machine; prefer --token-file or MUSTER_JOIN_TOKEN")
	case in.TokenFile != "":
		tok, err := readTokenFile(in.TokenFile, in.Stdin)
		if err != nil {
			return res, err
		}
		cli.token, cli.source = tok, SourceTokenFile
	case in.URI != "":
		res.Warnings = append(res.Warnings, "a joining URI on the command line is visible to other users of this machine; prefer MUSTER_JOIN_URI")
		if err := fromURI(&cli, in.URI, SourceURIArg); err != nil {
			return res, err
		}
	}

	// The environment.
	env := layer{node: getenv(EnvNodeID), authority: getenv(EnvAuthority), fingerprint: getenv(EnvCAFingerprint)}
	if u := getenv(EnvJoinURI); u != "" {
		if err := fromURI(&env, u, SourceEnvURI); err != nil {
			return res, fmt.Errorf("%s: %w", EnvJoinURI, err)
		}
	}
	if t := getenv(EnvJoinToken); t != "" {
		env.token, env.source = t, SourceEnvToken
	}

	// agent.yaml.
	if m := in.Config.JoinMethod; m != "" && m != JoinMethodToken {
		return res, fmt.Errorf("agent.yaml: join method %q is not supported by this agent yet: use a join token", m)
	}
	file := layer{token: in.Config.Token, node: in.Config.Node, authority: in.Config.Authority, fingerprint: in.Config.CAFingerprint}
	if file.token != "" {
		file.source = SourceConfig
	}

	layers := []layer{cli, env, file}
	pick := func(get func(layer) string) string {
		for _, l := range layers {
			if v := get(l); v != "" {
				return v
			}
		}
		return ""
	}
	var tok string
	for _, l := range layers {
		if l.token != "" {
			tok, res.TokenSource = l.token, l.source
			break
		}
	}
	if tok == "" {
		return res, errors.New("no join token: give --token-file FILE, MUSTER_JOIN_TOKEN, a joining URI, or token in agent.yaml")
	}
	t, err := jointoken.Parse(strings.TrimSpace(tok))
	if err != nil {
		return res, fmt.Errorf("%s: %w", res.TokenSource, err)
	}
	res.Request = JoinRequest{
		Token:         t,
		Node:          pick(func(l layer) string { return l.node }),
		Authority:     pick(func(l layer) string { return l.authority }),
		CAFingerprint: pick(func(l layer) string { return l.fingerprint }),
	}
	switch {
	case res.Request.Node == "":
		return res, errors.New("no node ID: give --node NODE (or MUSTER_NODE_ID, node= in the joining URI, node in agent.yaml)")
	case res.Request.Authority == "":
		return res, errors.New("no authority address: give --authority HOST:PORT (or MUSTER_AUTHORITY, a joining URI, authority in agent.yaml)")
	}
	if fp := res.Request.CAFingerprint; fp != "" {
		canon, err := ca.ParseFingerprint(fp)
		if err != nil {
			return res, err
		}
		res.Request.CAFingerprint = canon
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
	if u.Method != joinuri.MethodToken {
		return fmt.Errorf("join method %s is not supported by this agent yet: use a join token", u.Method)
	}
	if u.AuthorityID != "" {
		return errors.New("joining through discovery (authority_id=) is not supported by this agent yet: use the authority's address")
	}
	l.token, l.source = u.Token.Reveal(), source
	l.node = firstNonEmpty(l.node, u.Node)
	l.authority = firstNonEmpty(l.authority, u.Address)
	l.fingerprint = firstNonEmpty(l.fingerprint, u.Fingerprint)
	return nil
}

func readTokenFile(path string, stdin io.Reader) (string, error) {
	var r io.Reader
	if path == "-" {
		if stdin == nil {
			return "", errors.New("--token-file -: no standard input")
		}
		r = stdin
	} else {
		f, err := os.Open(path)
		if err != nil {
			return "", fmt.Errorf("--token-file: %w", err)
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, maxTokenFile+1))
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	if len(data) > maxTokenFile {
		return "", fmt.Errorf("--token-file %s: larger than a join token", path)
	}
	tok := strings.TrimSpace(string(data))
	if tok == "" {
		return "", fmt.Errorf("--token-file %s is empty", path)
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

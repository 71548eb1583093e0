package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestResolveJoin(t *testing.T) {
	const (
		flagTok = "aaaaaa.aaaaaaaaaaaaaaaa"
		fileTok = "bbbbbb.bbbbbbbbbbbbbbbb"
		uriTok  = "cccccc.cccccccccccccccc"
		envTok  = "dddddd.dddddddddddddddd"
		envUTok = "eeeeee.eeeeeeeeeeeeeeee"
		cfgTok  = "ffffff.ffffffffffffffff"
		fpU     = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
		fpE     = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
		fpC     = "sha256:3333333333333333333333333333333333333333333333333333333333333333"
	)
	tokFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokFile, []byte(fileTok+"\n"), 0o600)
	uri := "muster+token://" + uriTok + "@uri-host:1?fingerprint=" + fpU + "&node=uri-node"
	envURI := "muster+token://" + envUTok + "@env-uri-host:2?node=env-uri-node"
	cfg := Config{Token: cfgTok, Node: "cfg-node", Authority: "cfg-host:3", CAFingerprint: fpC}
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	type want struct {
		token, source, node, authority, fp string
		warn                               bool
	}
	tests := []struct {
		name string
		in   JoinInputs
		want want
		err  string
	}{
		{"config only", JoinInputs{Config: cfg},
			want{cfgTok, SourceConfig, "cfg-node", "cfg-host:3", fpC, false}, ""},
		{"env URI beats config", JoinInputs{Config: cfg, Getenv: env(EnvJoinURI, envURI)},
			want{envUTok, SourceEnvURI, "env-uri-node", "env-uri-host:2", fpC, false}, ""},
		{"env variables beat env URI", JoinInputs{Config: cfg, Getenv: env(EnvJoinURI, envURI, EnvJoinToken, envTok,
			EnvNodeID, "env-node", EnvAuthority, "env-host:4", EnvCAFingerprint, fpE)},
			want{envTok, SourceEnvToken, "env-node", "env-host:4", fpE, false}, ""},
		{"URI argument beats env", JoinInputs{URI: uri, Config: cfg, Getenv: env(EnvJoinToken, envTok, EnvNodeID, "env-node")},
			want{uriTok, SourceURIArg, "uri-node", "uri-host:1", fpU, true}, ""},
		{"flags beat URI argument", JoinInputs{URI: uri, Node: "flag-node", Authority: "flag-host:5"},
			want{uriTok, SourceURIArg, "flag-node", "flag-host:5", fpU, true}, ""},
		{"--token beats env", JoinInputs{Token: flagTok, Node: "n", Authority: "h:1", Getenv: env(EnvJoinToken, envTok)},
			want{flagTok, SourceTokenFlag, "n", "h:1", "", true}, ""},
		{"--token-file beats env", JoinInputs{TokenFile: tokFile, Getenv: env(EnvJoinToken, envTok, EnvNodeID, "n", EnvAuthority, "h:1")},
			want{fileTok, SourceTokenFile, "n", "h:1", "", false}, ""},
		{"--token-file - reads stdin", JoinInputs{TokenFile: "-", Stdin: strings.NewReader(fileTok + "\n"), Node: "n", Authority: "h:1"},
			want{fileTok, SourceTokenFile, "n", "h:1", "", false}, ""},
		{"fingerprint canonicalised", JoinInputs{Token: flagTok, Node: "n", Authority: "h:1", CAFingerprint: "sha256:" + strings.ToUpper(fpE[7:])},
			want{flagTok, SourceTokenFlag, "n", "h:1", fpE, true}, ""},
		{"bad fingerprint", JoinInputs{Token: flagTok, Node: "n", Authority: "h:1", CAFingerprint: "sha256:xyz"}, want{}, "CA fingerprint"},
		{"two token sources", JoinInputs{Token: flagTok, URI: uri}, want{}, "only one of"},
		{"no token", JoinInputs{Node: "n", Authority: "h:1"}, want{}, "no join token"},
		{"no node", JoinInputs{Token: flagTok, Authority: "h:1"}, want{}, "no node ID"},
		{"no authority", JoinInputs{Token: flagTok, Node: "n"}, want{}, "no authority address"},
		{"malformed token", JoinInputs{Token: "nope.secretsecretsecret", Node: "n", Authority: "h:1"}, want{}, "malformed"},
		{"PSK URI without a node", JoinInputs{URI: "muster+psk://" + strings.Repeat("a", 64) + "@h:1?fingerprint=" + fpE}, want{}, "no node ID"},
		{"bad env URI", JoinInputs{Getenv: env(EnvJoinURI, "https://x")}, want{}, EnvJoinURI},
		{"empty token file", JoinInputs{TokenFile: "-", Stdin: strings.NewReader("\n")}, want{}, "empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := ResolveJoin(tt.in)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got %v, want an error containing %q", err, tt.err)
				}
				for _, secret := range []string{"secretsecretsecret", strings.Repeat("a", 64)} {
					if strings.Contains(err.Error(), secret) {
						t.Errorf("the error quotes a secret: %v", err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := want{res.Request.Token.Reveal(), res.TokenSource, res.Request.Node, res.Request.Authority,
				res.Request.CAFingerprint, len(res.Warnings) > 0}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestResolveJoinPSK(t *testing.T) {
	const fp = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	pskA := "muster-psk:" + strings.Repeat("a", 64)
	pskB := "muster-psk:" + strings.Repeat("b", 64)
	pskFile := filepath.Join(t.TempDir(), "psk")
	os.WriteFile(pskFile, []byte(pskB+"\n"), 0o600)
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	tests := []struct {
		name        string
		in          JoinInputs
		psk, source string
		authorityID string
		err         string
	}{
		{name: "flag", in: JoinInputs{PSK: pskA, Node: "n", Authority: "h:1", CAFingerprint: fp}, psk: pskA, source: SourcePSKFlag},
		{name: "file", in: JoinInputs{PSKFile: pskFile, Node: "n", Authority: "h:1", CAFingerprint: fp}, psk: pskB, source: SourcePSKFile},
		{name: "environment alone", in: JoinInputs{Getenv: env(EnvBootstrapPSK, pskA, EnvNodeID, "n", EnvAuthority, "h:1",
			EnvCAFingerprint, fp, EnvAuthorityID, "prod-abcdef")}, psk: pskA, source: SourceEnvPSK, authorityID: "prod-abcdef"},
		{name: "URI", in: JoinInputs{URI: "muster+psk://" + strings.Repeat("a", 64) + "@h:1?fingerprint=" + fp, Node: "n"}, psk: pskA, source: SourceURIArg},
		{name: "flag beats the environment's token", in: JoinInputs{PSK: pskA, Node: "n", Authority: "h:1", CAFingerprint: fp,
			Getenv: env(EnvJoinToken, "aaaaaa.aaaaaaaaaaaaaaaa")}, psk: pskA, source: SourcePSKFlag},
		{name: "agent.yaml", in: JoinInputs{Config: Config{PSK: pskB, Node: "n", Authority: "h:1", CAFingerprint: fp, JoinMethod: JoinMethodPSK}},
			psk: pskB, source: SourceConfig},
		{name: "no fingerprint", in: JoinInputs{PSK: pskA, Node: "n", Authority: "h:1"}, err: "needs the CA fingerprint"},
		{name: "malformed", in: JoinInputs{PSK: "muster-psk:nope", Node: "n", Authority: "h:1", CAFingerprint: fp}, err: "malformed"},
		{name: "token and PSK flags", in: JoinInputs{PSK: pskA, Token: "aaaaaa.aaaaaaaaaaaaaaaa"}, err: "only one"},
		{name: "token and PSK variables", in: JoinInputs{Getenv: env(EnvBootstrapPSK, pskA, EnvJoinToken, "aaaaaa.aaaaaaaaaaaaaaaa")}, err: "only one"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := ResolveJoin(tt.in)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got %v, want an error containing %q", err, tt.err)
				}
				if err != nil && strings.Contains(err.Error(), strings.Repeat("a", 64)) {
					t.Fatalf("error quotes the PSK: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Request.PSK.Reveal() != tt.psk || res.TokenSource != tt.source || res.Request.Token.ID != "" ||
				res.Request.AuthorityID != tt.authorityID || res.Request.method() != JoinMethodPSK {
				t.Fatalf("got PSK from %s, authority ID %q, method %s", res.TokenSource, res.Request.AuthorityID, res.Request.method())
			}
		})
	}
}

func TestResolveJoinDiscovery(t *testing.T) {
	const (
		fp  = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
		dfp = "sha256:4444444444444444444444444444444444444444444444444444444444444444"
	)
	pskA := "muster-psk:" + strings.Repeat("a", 64)
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	type want struct {
		psk, discovery, discoveryFP, authorityID, authority string
	}
	tests := []struct {
		name string
		in   JoinInputs
		want want
		err  string
	}{
		{"flags", JoinInputs{PSK: pskA, Node: "n", Discovery: "disc:7450", DiscoveryFingerprint: dfp, AuthorityID: "prod-abcdef", CAFingerprint: fp},
			want{pskA, "disc:7450", dfp, "prod-abcdef", ""}, ""},
		{"environment alone", JoinInputs{Getenv: env(EnvBootstrapPSK, pskA, EnvNodeID, "n", EnvDiscovery, "disc:7450",
			EnvDiscoveryFingerprint, dfp, EnvAuthorityID, "prod-abcdef", EnvCAFingerprint, fp)},
			want{pskA, "disc:7450", dfp, "prod-abcdef", ""}, ""},
		{"URI with authority_id names discovery", JoinInputs{Node: "n", URI: "muster+psk://" + strings.Repeat("a", 64) +
			"@disc:7450?fingerprint=" + fp + "&authority_id=prod-abcdef&discovery_fingerprint=" + dfp},
			want{pskA, "disc:7450", dfp, "prod-abcdef", ""}, ""},
		{"agent.yaml after a discovery join", JoinInputs{Config: Config{PSK: pskA, Node: "n", CAFingerprint: fp, Discovery: "disc:7450",
			AuthorityID: "prod-abcdef", Authority: "auth:7443"}},
			want{pskA, "disc:7450", "", "prod-abcdef", ""}, ""},
		{"--authority beats a discovery in agent.yaml", JoinInputs{PSK: pskA, Node: "n", Authority: "auth:7443", CAFingerprint: fp,
			Config: Config{Discovery: "disc:7450", AuthorityID: "prod-abcdef"}},
			want{pskA, "", "", "prod-abcdef", "auth:7443"}, ""},
		{"--authority beats MUSTER_DISCOVERY", JoinInputs{PSK: pskA, Node: "n", Authority: "auth:7443", CAFingerprint: fp,
			Getenv: env(EnvDiscovery, "disc:7450")},
			want{pskA, "", "", "", "auth:7443"}, ""},
		{"--discovery beats MUSTER_AUTHORITY", JoinInputs{PSK: pskA, Node: "n", Discovery: "disc:7450", AuthorityID: "prod-abcdef", CAFingerprint: fp,
			Getenv: env(EnvAuthority, "auth:7443")},
			want{pskA, "disc:7450", "", "prod-abcdef", ""}, ""},
		{"no PSK: the ticket alone", JoinInputs{Node: "n", Discovery: "disc:7450", AuthorityID: "prod-abcdef", CAFingerprint: fp},
			want{"", "disc:7450", "", "prod-abcdef", ""}, ""},
		{"no authority ID", JoinInputs{PSK: pskA, Node: "n", Discovery: "disc:7450", CAFingerprint: fp}, want{}, "needs the authority ID"},
		{"no CA fingerprint", JoinInputs{PSK: pskA, Node: "n", Discovery: "disc:7450", AuthorityID: "prod-abcdef"}, want{}, "CA fingerprint"},
		{"bad discovery fingerprint", JoinInputs{PSK: pskA, Node: "n", Discovery: "disc:7450", AuthorityID: "prod-abcdef", CAFingerprint: fp,
			DiscoveryFingerprint: "sha256:nope"}, want{}, "discovery fingerprint"},
		{"a token through discovery", JoinInputs{URI: "muster+token://aaaaaa.aaaaaaaaaaaaaaaa@disc:7450?authority_id=prod-abcdef", Node: "n"},
			want{}, "not through discovery"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := ResolveJoin(tt.in)
			if err == nil {
				err = res.Request.check()
			}
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got %v, want an error containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			r := res.Request
			got := want{r.PSK.Reveal(), r.Discovery, r.DiscoveryFingerprint, r.AuthorityID, r.Authority}
			if r.PSK.IsZero() {
				got.psk = ""
			}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if r.method() != JoinMethodPSK {
				t.Errorf("method %s, want psk", r.method())
			}
		})
	}
}

// TestResolveBoundKeypair: where a bound-keypair join's name, registration
// secret, node and pin come from, and what it refuses.
func TestResolveBoundKeypair(t *testing.T) {
	const fp = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	secFile := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secFile, []byte("file-secret\n"), 0o600)
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	const dfp = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	type want struct{ name, secret, node, authority, discovery, discoveryFP, authorityID string }
	tests := []struct {
		name string
		in   JoinInputs
		want want
		err  string
	}{
		{"flags", JoinInputs{BoundKeypair: "bot", Node: "n", Authority: "h:1", CAFingerprint: fp},
			want{"bot", "", "n", "h:1", "", "", ""}, ""},
		{"node defaults to the name", JoinInputs{BoundKeypair: "bot", Authority: "h:1", CAFingerprint: fp},
			want{"bot", "", "bot", "h:1", "", "", ""}, ""},
		{"secret file beats env", JoinInputs{BoundKeypair: "bot", RegistrationSecretFile: secFile, Authority: "h:1", CAFingerprint: fp,
			Getenv: env(EnvRegistrationSecret, "env-secret")}, want{"bot", "file-secret", "bot", "h:1", "", "", ""}, ""},
		{"env secret", JoinInputs{BoundKeypair: "bot", Authority: "h:1", CAFingerprint: fp,
			Getenv: env(EnvRegistrationSecret, "env-secret")}, want{"bot", "env-secret", "bot", "h:1", "", "", ""}, ""},
		{"URI with a secret", JoinInputs{Getenv: env(EnvJoinURI, "muster+bound-keypair://bot:uri-secret@h:2?fingerprint="+fp)},
			want{"bot", "uri-secret", "bot", "h:2", "", "", ""}, ""},
		{"agent.yaml after a join", JoinInputs{Config: Config{JoinMethod: JoinMethodBoundKeypair, BoundKeypair: "bot", Node: "n",
			Authority: "h:3", CAFingerprint: fp}}, want{"bot", "", "n", "h:3", "", "", ""}, ""},
		{"agent.yaml without the name", JoinInputs{Config: Config{JoinMethod: JoinMethodBoundKeypair}}, want{}, "needs bound_keypair"},
		{"no fingerprint", JoinInputs{BoundKeypair: "bot", Authority: "h:1"}, want{}, "needs the CA fingerprint"},
		{"with a token", JoinInputs{BoundKeypair: "bot", Token: "aaaaaa.aaaaaaaaaaaaaaaa"}, want{}, "only one of"},
		{"through discovery", JoinInputs{BoundKeypair: "bot", Discovery: "d:1", AuthorityID: "prod-a", CAFingerprint: fp, DiscoveryFingerprint: dfp},
			want{"bot", "", "bot", "", "d:1", dfp, "prod-a"}, ""},
		{"URI through discovery", JoinInputs{URI: "muster+bound-keypair://bot:uri-secret@d:2?fingerprint=" + fp +
			"&authority_id=prod-a&discovery_fingerprint=" + dfp}, want{"bot", "uri-secret", "bot", "", "d:2", dfp, "prod-a"}, ""},
		{"environment through discovery", JoinInputs{BoundKeypair: "bot", CAFingerprint: fp,
			Getenv: env(EnvDiscovery, "d:3", EnvAuthorityID, "prod-a")}, want{"bot", "", "bot", "", "d:3", "", "prod-a"}, ""},
		{"agent.yaml after a discovery join", JoinInputs{Config: Config{JoinMethod: JoinMethodBoundKeypair, BoundKeypair: "bot",
			Node: "n", Authority: "h:3", Discovery: "d:4", AuthorityID: "prod-a", CAFingerprint: fp}},
			want{"bot", "", "n", "", "d:4", "", "prod-a"}, ""},
		{"--authority beats a discovery in agent.yaml", JoinInputs{BoundKeypair: "bot", Authority: "h:1", CAFingerprint: fp,
			Config: Config{Discovery: "d:4", AuthorityID: "prod-a"}}, want{"bot", "", "bot", "h:1", "", "", "prod-a"}, ""},
		{"through discovery without the authority ID", JoinInputs{BoundKeypair: "bot", Discovery: "d:1", CAFingerprint: fp}, want{}, "needs the authority ID"},
		{"through discovery without the CA fingerprint", JoinInputs{BoundKeypair: "bot", Discovery: "d:1", AuthorityID: "prod-a"}, want{}, "needs the CA fingerprint"},
		{"through discovery, bad discovery fingerprint", JoinInputs{BoundKeypair: "bot", Discovery: "d:1", AuthorityID: "prod-a", CAFingerprint: fp,
			DiscoveryFingerprint: "sha256:nope"}, want{}, "discovery fingerprint"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := ResolveJoin(tt.in)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got %v, want an error containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			r := res.Request
			got := want{r.BoundKeypair, r.RegistrationSecret, r.Node, r.Authority, r.Discovery, r.DiscoveryFingerprint, r.AuthorityID}
			if got != tt.want || r.method() != JoinMethodBoundKeypair || r.CAFingerprint != fp {
				t.Fatalf("got %+v (method %s, fp %s), want %+v", got, r.method(), r.CAFingerprint, tt.want)
			}
			if err := r.check(); err != nil {
				t.Fatalf("check: %v", err)
			}
		})
	}
}

// A forced join to an address, after a join through discovery, replaces
// agent.yaml's discovery settings: a later join with no flags (the
// bound key, a PSK in agent.yaml) goes to the address joined last, not
// back through the discovery service and to the authority the operator
// moved away from. A join through discovery sets them, and a join whose
// state.next.json does not say how it went (joinConfigOf) keeps them.
func TestForcedJoinToAnAddressReplacesDiscovery(t *testing.T) {
	const fp = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	pskA := "muster-psk:" + strings.Repeat("a", 64)
	discovered := Config{PSK: pskA, Node: "n", CAFingerprint: fp, Authority: "old:7443",
		Discovery: "disc:7450", DiscoveryFingerprint: fp, AuthorityID: "old-abcdef"}
	tests := []struct {
		name string
		join *joinConfig
		want JoinRequest
	}{
		{"to an address", &joinConfig{Authority: "new:7443", Node: "n", JoinMethod: JoinMethodPSK, CAFingerprint: fp},
			JoinRequest{Authority: "new:7443"}},
		{"to an address with its authority ID", &joinConfig{Authority: "new:7443", Node: "n", JoinMethod: JoinMethodPSK, CAFingerprint: fp, AuthorityID: "new-123456"},
			JoinRequest{Authority: "new:7443", AuthorityID: "new-123456"}},
		{"through another discovery", &joinConfig{Authority: "new:7443", Node: "n", JoinMethod: JoinMethodPSK, CAFingerprint: fp,
			Discovery: "disc2:7450", AuthorityID: "new-123456"},
			JoinRequest{Discovery: "disc2:7450", AuthorityID: "new-123456"}},
		{"not saying how", func() *joinConfig {
			j := joinConfigOf(&State{Authority: "new:7443", NodeID: "n", JoinMethod: JoinMethodPSK}, nil, fp)
			j.CAFingerprint = fp // no roots to take it from here
			return j
		}(),
			JoinRequest{Discovery: "disc:7450", DiscoveryFingerprint: fp, AuthorityID: "old-abcdef"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := discovered
			tt.join.apply(&cfg)
			res, err := ResolveJoin(JoinInputs{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			got := res.Request
			if got.Authority != tt.want.Authority || got.Discovery != tt.want.Discovery ||
				got.DiscoveryFingerprint != tt.want.DiscoveryFingerprint || got.AuthorityID != tt.want.AuthorityID {
				t.Errorf("a join with no flags after it: authority %q, discovery %q (pin %q), authority ID %q; want %q, %q (%q), %q",
					got.Authority, got.Discovery, got.DiscoveryFingerprint, got.AuthorityID,
					tt.want.Authority, tt.want.Discovery, tt.want.DiscoveryFingerprint, tt.want.AuthorityID)
			}
		})
	}
}

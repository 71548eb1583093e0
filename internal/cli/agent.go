package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/muster-dev/muster/internal/agent"
)

func newAgentCmd(env *Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the agent on a machine: join once, then keep its identity fresh",
	}
	cmd.AddCommand(newAgentJoinCmd(env), withEnv(env, newAgentRunCmd(env)), newAgentRenewCmd(env), newAgentStatusCmd(env), newAgentTrustCmd(env))
	return cmd
}

// agentDir is --data, else MUSTER_AGENT_DATA, refused where it is an
// authority's or a discovery service's data directory: the agent would
// write its identity among their keys.
func agentDir(env *Env, flag string) (agent.Dir, error) {
	d := firstOf(flag, env.Getenv(agent.EnvData))
	if d == "" {
		if env.Getenv("MUSTER_DATA") != "" {
			return "", fmt.Errorf("--data ADIR is required (or %s; MUSTER_DATA names the authority's directory, not the agent's)", agent.EnvData)
		}
		return "", fmt.Errorf("--data ADIR is required (or %s)", agent.EnvData)
	}
	if err := notServerDir(d); err != nil {
		return "", err
	}
	return agent.Dir(d), nil
}

// notServerDir refuses the data directory of an authority (authority.json)
// or of a discovery service (its TLS CA, tls/ca.key): an agent needs a
// directory of its own.
func notServerDir(d string) error {
	for _, c := range []struct{ file, what string }{
		{"authority.json", "an authority's"},
		{filepath.Join("tls", "ca.key"), "a discovery service's"},
	} {
		if _, err := os.Stat(filepath.Join(d, c.file)); err == nil {
			return fmt.Errorf("%s is %s data directory (it holds %s): give the agent a directory of its own (--data ADIR or %s)", d, c.what, c.file, agent.EnvData)
		}
	}
	return nil
}

// agentFailure renders an agent error as "join failed: CODE: message".
func agentFailure(err error) error {
	if errors.Is(err, agent.ErrNoIdentity) {
		err = noIdentity(err)
	}
	var op *agent.OpError
	if errors.As(err, &op) {
		return fmt.Errorf("%s failed: %s", op.Op, describe(op.Err))
	}
	return err
}

// noIdentity says what to do about a directory that has not joined.
func noIdentity(err error) error {
	var op *agent.OpError
	if errors.As(err, &op) {
		return fmt.Errorf("%s failed: the data directory holds no identity: join first (muster agent join)", op.Op)
	}
	return errors.New("the data directory holds no identity: join first (muster agent join)")
}

func newAgentJoinCmd(env *Env) *cobra.Command {
	var (
		data    string
		in      agent.JoinInputs
		force   bool
		timeout time.Duration
		out     output
	)
	cmd := &cobra.Command{
		Use: "join --data ADIR [--token-file F | --psk-file F | --bound-keypair NAME [--registration-secret-file F] | URI] --node NODE (--authority HOST:PORT | --discovery HOST:PORT --authority-id ID) [--ca-fingerprint sha256:…]",
		Example: `  muster agent join --data ./agent-data --node web-1 'muster+token://…'
  muster agent join --data ./agent-data --node web-1 --token-file token.txt --authority authority.example.org:7443
  muster agent join --data ./agent-data --node web-1 --psk-file psk.txt --discovery discovery.example.org:7450 --authority-id prod-a3f2e1
  muster agent join --data ./agent-data --bound-keypair build-runner-01 --authority authority.example.org:7443 --ca-fingerprint sha256:…
  muster agent join --data ./agent-data --bound-keypair build-runner-01 --discovery discovery.example.org:7450 --authority-id prod-a3f2e1 --ca-fingerprint sha256:…`,
		Short: "Join an authority with a join token, the bootstrap PSK or a bound keypair, once",
		Long: `join admits this machine with a join token or the authority's bootstrap PSK
and writes its identity to ADIR.

The secret comes from the first of: --token, --token-file, --psk, --psk-file
(- reads standard input), a joining URI argument (muster+token:// or
muster+psk://), MUSTER_JOIN_TOKEN or MUSTER_BOOTSTRAP_PSK, MUSTER_JOIN_URI,
or token or psk in ADIR/agent.yaml. The node, authority, authority ID and CA
fingerprint come from their flags, then the joining URI, then
MUSTER_NODE_ID, MUSTER_AUTHORITY, MUSTER_AUTHORITY_ID and
MUSTER_CA_FINGERPRINT, then MUSTER_JOIN_URI, then ADIR/agent.yaml.

Before it sends a token's secret, the agent fetches the authority's trust
bundle with the token ID alone and accepts it only if it is signed with the
token (and holds the root of --ca-fingerprint when given); it then sends the
token only to a server that proves it is that authority. The PSK always
needs --ca-fingerprint: it is sent only to a server whose chain ends at that
root and whose certificate names an authority (--authority-id, when given).

With --discovery (MUSTER_DISCOVERY, or a joining URI with authority_id=),
the agent looks --authority-id up at the discovery service (pinned by
--discovery-fingerprint, else the system roots), probes the endpoints it
lists until one proves to be that authority by --ca-fingerprint's root and
the authority's SPIFFE ID, asks discovery for a referral ticket for the node,
and sends the ticket and the PSK to that authority. Discovery never sees
the PSK, and a discovery posing as the authority gets nothing. A
bound-keypair join through discovery finds and proves the authority the
same way, then answers its challenge there; it needs no referral ticket.

With --bound-keypair NAME (or a muster+bound-keypair:// URI, or
join_method bound-keypair in agent.yaml) the agent proves the Ed25519 key
in ADIR/keys/bound.key by signing the authority's challenge, only for an
authority proved by --ca-fingerprint's root. The key is made beforehand
with muster keypair create, or here on a first join that registers it with
the token's registration secret (--registration-secret-file,
MUSTER_REGISTRATION_SECRET, or NAME:SECRET in the URI). The node defaults
to NAME. The join state document the authority returns is kept in
state.json for the next refresh or recovery (muster agent run).

join tries once and exits non-zero on any failure, leaving no certificate
files. One exception: a PSK join through discovery whose ticket the
authority refuses for its key (discovery's key revoked or rotated since it
signed) asks discovery for a fresh ticket, 4 tickets in all, 2, 4 and 8 s
apart, and logs each retry on standard error. It refuses to replace an identity unless --force is given; the old
identity stays until the new join succeeds.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.check(); err != nil {
				return err
			}
			dir, err := agentDir(env, data)
			if err != nil {
				return fmt.Errorf("join failed: %w", err)
			}
			if len(args) == 1 {
				in.URI = args[0]
			}
			in.Getenv, in.Stdin = env.Getenv, env.Stdin
			if in.Config, err = dir.ReadConfig(); err != nil {
				return fmt.Errorf("join failed: %w", err)
			}
			res, err := agent.ResolveJoin(in)
			for _, w := range res.Warnings {
				fmt.Fprintf(env.Stderr, "warning: %s\n", w)
			}
			if err != nil {
				return fmt.Errorf("join failed: %w", err)
			}
			if res.TokenSource == agent.SourceConfig && dir.ConfigReadableByOthers() {
				fmt.Fprintf(env.Stderr, "warning: %s holds a join secret and other users can read it; run chmod 600 on it\n", dir.ConfigFile())
			}
			res.Request.Force = force
			a := agent.New(agent.Options{Dir: dir, Timeout: timeout, Log: joinLog(env.Stderr)})
			st, err := a.Join(cmd.Context(), res.Request)
			if err != nil {
				return agentFailure(err)
			}
			return printAgentState(env, out, dir, "Joined", st)
		},
	}
	f := cmd.Flags()
	f.StringVar(&data, "data", "", "agent data directory (env MUSTER_AGENT_DATA)")
	f.StringVar(&in.Token, "token", "", "join token ID.SECRET (visible to other users: prefer --token-file or MUSTER_JOIN_TOKEN)")
	f.StringVar(&in.TokenFile, "token-file", "", "file holding the join token; - reads standard input")
	f.StringVar(&in.PSK, "psk", "", "bootstrap PSK muster-psk:HEX (visible to other users: prefer --psk-file or MUSTER_BOOTSTRAP_PSK)")
	f.StringVar(&in.PSKFile, "psk-file", "", "file holding the bootstrap PSK; - reads standard input")
	f.StringVar(&in.AuthorityID, "authority-id", "", "authority ID the authority must prove (env MUSTER_AUTHORITY_ID)")
	f.StringVar(&in.Node, "node", "", "node ID of this machine (env MUSTER_NODE_ID)")
	f.StringVar(&in.Authority, "authority", "", "authority address HOST:PORT (env MUSTER_AUTHORITY)")
	f.StringVar(&in.CAFingerprint, "ca-fingerprint", "", "pin of the authority's root CA, sha256:HEX (env MUSTER_CA_FINGERPRINT)")
	f.StringVar(&in.Discovery, "discovery", "", "discovery service HOST:PORT to look the authority up and get a referral ticket (env MUSTER_DISCOVERY)")
	f.StringVar(&in.DiscoveryFingerprint, "discovery-fingerprint", "", "pin of the discovery's CA, sha256:HEX (env MUSTER_DISCOVERY_FINGERPRINT; default: system roots)")
	f.StringVar(&in.BoundKeypair, "bound-keypair", "", "name of the bound-keypair token to join with (the key is ADIR/keys/bound.key)")
	f.StringVar(&in.RegistrationSecretFile, "registration-secret-file", "", "file holding the bound-keypair token's registration secret (env MUSTER_REGISTRATION_SECRET); - reads standard input")
	f.BoolVar(&force, "force", false, "join again over an existing identity")
	f.DurationVar(&timeout, "timeout", agent.DefaultTimeout, "how long to wait for each answer of the authority")
	out.register(cmd)
	return cmd
}

// joinLog is the log of a one-shot join: its warnings, such as each
// retry with a fresh referral ticket (up to 14 s of waits that would
// otherwise pass in silence), on w; the join's own outcome is printed.
func joinLog(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}}))
}

func newAgentRenewCmd(env *Env) *cobra.Command {
	var (
		data    string
		timeout time.Duration
		out     output
	)
	cmd := &cobra.Command{
		Use: "renew --data ADIR",
		Example: `  muster agent renew --data /var/lib/muster-agent
  muster agent renew --data ./agent-data -o json`,
		Short: "Renew the agent's certificate once, now",
		Long: `Renew the agent's certificate once, now. A token or PSK agent renews over
mTLS with its current certificate; a bound-keypair agent refreshes by repeating
the challenge with its bound key (keys/bound.key), as agent run does, so a
deleted token or a lock refuses it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			dir, err := agentDir(env, data)
			if err != nil {
				return fmt.Errorf("renewal failed: %w", err)
			}
			a := agent.New(agent.Options{Dir: dir, Timeout: timeout, Authority: env.Getenv(agent.EnvAuthority)})
			st, err := a.Renew(cmd.Context())
			if err != nil {
				return agentFailure(err)
			}
			return printAgentState(env, out, dir, "Renewed", st)
		},
	}
	cmd.Flags().StringVar(&data, "data", "", "agent data directory (env MUSTER_AGENT_DATA)")
	cmd.Flags().DurationVar(&timeout, "timeout", agent.DefaultTimeout, "how long to wait for the authority")
	out.register(cmd)
	return cmd
}

func printAgentState(env *Env, out output, dir agent.Dir, verb string, st *agent.State) error {
	if out.json() {
		return out.write(env.Stdout, st)
	}
	fmt.Fprintf(env.Stdout, "%s: node %s, instance %s, generation %d, of authority %s at %s\nCertificate valid until %s, in %s\n",
		verb, st.NodeID, st.InstanceID, st.Generation, st.AuthorityID, st.Authority,
		st.NotAfter.UTC().Format(time.RFC3339), dir.CertFile())
	return nil
}

func newAgentRunCmd(env *Env) *cobra.Command {
	var (
		data, metricsListen string
		logFormat, logLevel string
		pprofListen         string
		timeout             time.Duration
		wl                  workloadFlags
	)
	cmd := &cobra.Command{
		Use: "run --data ADIR",
		Example: `  muster agent run --data /var/lib/muster-agent --metrics-listen 127.0.0.1:9464
  MUSTER_JOIN_URI='muster+token://…' MUSTER_NODE_ID=web-1 muster agent run --data ./agent-data`,
		Short: "Run the agent: join if needed, then renew the identity before it expires",
		Long: `run keeps this machine's identity fresh. If ADIR holds no identity it joins
first, with the token or PSK, node and authority from MUSTER_JOIN_TOKEN,
MUSTER_BOOTSTRAP_PSK, MUSTER_JOIN_URI, MUSTER_NODE_ID, MUSTER_AUTHORITY,
MUSTER_AUTHORITY_ID, MUSTER_CA_FINGERPRINT or ADIR/agent.yaml. It renews at about half of each certificate's lifetime,
retries UNAVAILABLE, DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED with backoff,
and exits non-zero on any other refusal. SIGINT or SIGTERM stop it.

A bound-keypair agent (MUSTER_JOIN_URI muster+bound-keypair://, or
join_method bound-keypair in agent.yaml) refreshes by repeating the
challenge with its valid certificate, which consumes nothing. With no
valid certificate (stopped past its TTL) it recovers: the authority issues
a new instance and, under standard mode, takes one recovery of the budget.
A spent budget (recovery_exhausted) is retried with backoff, so raising the
token's recovery limit (muster token apply) brings the agent back as it is.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, err := agentDir(env, data)
			if err != nil {
				return fmt.Errorf("agent run: %w", err)
			}
			log, err := newLogger(env.Stderr, logFormat, logLevel)
			if err != nil {
				return fmt.Errorf("agent run: %w", err)
			}
			unlock, err := dir.LockRun()
			if err != nil {
				return fmt.Errorf("agent run: %w", err)
			}
			defer unlock()
			var m *agent.Metrics
			var lis net.Listener
			if metricsListen != "" {
				m = agent.NewMetrics()
				if lis, err = net.Listen("tcp", metricsListen); err != nil {
					return fmt.Errorf("agent run: cannot listen on %s (metrics): %w", metricsListen, err)
				}
				defer lis.Close()
			}
			wapi, err := wl.setup(cmd, env.Getenv, dir, log, m)
			if err != nil {
				return fmt.Errorf("agent run: %w", err)
			}
			if wapi != nil {
				defer wapi.lis.Close()
			}
			a := agent.New(agent.Options{Dir: dir, Log: log, Metrics: m, Timeout: timeout, Authority: env.Getenv(agent.EnvAuthority),
				StaticVerifiers: env.Getenv(agent.StaticVerifiersEnv), OnIdentity: wapi.onIdentity()})
			join := func() (agent.JoinRequest, error) {
				cfg, err := dir.ReadConfig()
				if err != nil {
					return agent.JoinRequest{}, err
				}
				res, err := agent.ResolveJoin(agent.JoinInputs{Getenv: env.Getenv, Config: cfg})
				if err != nil {
					return agent.JoinRequest{}, err
				}
				if res.TokenSource == agent.SourceConfig && dir.ConfigReadableByOthers() {
					log.Warn("agent.yaml holds a join secret and other users can read it; run chmod 600 on it", "path", dir.ConfigFile())
				}
				return res.Request, nil
			}
			args := []any{"data", string(dir)}
			if lis != nil {
				args = append(args, "metrics_listen", lis.Addr().String())
			}
			if wapi != nil {
				args = append(args, "workload_api", wapi.path)
				if wapi.passed {
					args = append(args, "workload_api_socket", "systemd")
				}
			}
			log.Info("agent started", args...)

			var runErr error
			err = withPprof(cmd.Context(), pprofListen, log, func(ctx context.Context) error {
				ctx, cancel := context.WithCancel(ctx)
				defer cancel()
				g, ctx := errgroup.WithContext(ctx)
				g.Go(func() error {
					// The agent ending, for whatever reason, ends the
					// metrics listener too.
					defer cancel()
					runErr = a.Run(ctx, join)
					return runErr
				})
				if lis != nil {
					g.Go(func() error { return m.Serve(ctx, lis) })
				}
				wapi.start(ctx, g, dir, a)
				return g.Wait()
			})
			switch {
			case runErr != nil:
				return agentFailure(runErr)
			case err != nil:
				return fmt.Errorf("agent run: %w", err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&data, "data", "", "agent data directory (env MUSTER_AGENT_DATA)")
	// Not MUSTER_DATA, the authority's directory (withEnv reads this).
	_ = f.SetAnnotation("data", envAnnotation, []string{agent.EnvData})
	f.StringVar(&metricsListen, "metrics-listen", "", "address of /metrics, /healthz and /readyz (empty: off)")
	registerPprofFlag(cmd, &pprofListen)
	f.StringVar(&logFormat, "log-format", "", "log format: text or json (default: text on a terminal, json otherwise)")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	f.DurationVar(&timeout, "timeout", agent.DefaultTimeout, "how long to wait for each answer of the authority")
	wl.register(cmd)
	return cmd
}

func newAgentStatusCmd(env *Env) *cobra.Command {
	var (
		data string
		out  output
	)
	cmd := &cobra.Command{
		Use: "status --data ADIR",
		Example: `  muster agent status --data /var/lib/muster-agent
  muster agent status --data ./agent-data -o json`,
		Short: "Show the agent's identity: node, instance, authority, generation, expiry",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			dir, err := agentDir(env, data)
			if err != nil {
				return fmt.Errorf("agent status: %w", err)
			}
			s, err := agent.New(agent.Options{Dir: dir, Authority: env.Getenv(agent.EnvAuthority),
				StaticVerifiers: env.Getenv(agent.StaticVerifiersEnv)}).Status()
			if errors.Is(err, agent.ErrNoIdentity) {
				return fmt.Errorf("agent status: %w", noIdentity(err))
			} else if err != nil {
				return fmt.Errorf("agent status: %w", err)
			}
			if out.json() {
				return out.write(env.Stdout, s)
			}
			valid := s.NotAfter.Format(time.RFC3339) + validNote(s, dir, time.Now())
			last := "never"
			if s.LastRenewal != nil {
				last = s.LastRenewal.UTC().Format(time.RFC3339)
			}
			if s.RenewalPending {
				last += " (a renewal is pending: its key waits in keys/pending.key)"
			}
			fmt.Fprintf(env.Stdout, `Node:          %s (%s)
Instance:      %s
Authority:     %s at %s
Generation:    %d
Valid until:   %s
Last renewal:  %s
Joined:        %s with join method %s
`, s.NodeID, s.SPIFFEID, s.InstanceID, s.AuthorityID, s.Authority, s.Generation, valid, last,
				s.JoinedAt.UTC().Format(time.RFC3339), s.JoinMethod)
			printTaskTrust(env.Stdout, s)
			if s.JoinMethod == agent.JoinMethodBoundKeypair {
				fmt.Fprintln(env.Stdout, boundKeypairLine(s))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&data, "data", "", "agent data directory (env MUSTER_AGENT_DATA)")
	out.register(cmd)
	return cmd
}

// boundKeypairLine is agent status's line on a bound-keypair agent's
// token, key and recoveries left.
func boundKeypairLine(s *agent.Status) string {
	left := "not counted (the token's mode does not count)"
	if s.RecoveriesRemaining != nil && *s.RecoveriesRemaining >= 0 {
		left = fmt.Sprint(*s.RecoveriesRemaining)
	}
	key := "none in keys/bound.key"
	switch {
	case s.BoundKeyFingerprint != "":
		key = s.BoundKeyFingerprint
	case s.BoundKeyProblem != "":
		// It exists but gives no key: not "none", which would send the
		// operator to make one.
		key = "UNUSABLE (" + s.BoundKeyProblem + ")"
	}
	line := fmt.Sprintf("Bound keypair: token %s, key %s, recoveries remaining %s", s.BoundKeypair, key, left)
	switch {
	case s.BoundKeyNextFingerprint != "":
		line += fmt.Sprintf("\nBound key rotation pending: keys/bound.next.key (%s) waits for the authority to bind it; the next refresh or recovery (muster agent renew) completes it, or discards a key the authority did not bind", s.BoundKeyNextFingerprint)
	case s.BoundKeyRotationPending:
		line += fmt.Sprintf("\nBound key rotation pending: keys/bound.next.key is UNUSABLE (%s)", s.BoundKeyNextProblem)
	}
	return line
}

// validNote is what agent status says after the certificate's end: how
// long is left, or, expired, the way back for this join method.
func validNote(s *agent.Status, dir agent.Dir, now time.Time) string {
	switch {
	case s.Expired && s.JoinMethod == agent.JoinMethodBoundKeypair && s.RecoveriesRemaining != nil && *s.RecoveriesRemaining == 0:
		// As of the last answer: an operator may have raised it since.
		return fmt.Sprintf(" (EXPIRED, and the last answer left no recovery: raise the token's spec.bound_keypair.recovery.limit with muster token apply, then muster agent run recovers with the bound key; muster token get %s shows the budget)", s.BoundKeypair)
	case s.Expired && s.JoinMethod == agent.JoinMethodBoundKeypair:
		return " (EXPIRED: muster agent run recovers with the bound key)"
	case s.Expired:
		return " (EXPIRED: join again with a new token: " + agent.RejoinCommand(dir, s.NodeID) + ")"
	}
	return fmt.Sprintf(" (in %s)", s.NotAfter.Sub(now).Round(time.Second))
}

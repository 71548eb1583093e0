package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/joinuri"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

func newBotCmd(env *Env) *cobra.Command {
	cmd := &cobra.Command{Use: "bot", Short: "Add bound-keypair tokens for machines and bots"}
	cmd.AddCommand(newBotAddCmd(env))
	return cmd
}

// boundKeypairJSON is a bound-keypair token's spec and status as printed.
type boundKeypairJSON struct {
	InitialPublicKey    string     `json:"initial_public_key,omitempty"`
	MustRegisterBefore  *time.Time `json:"must_register_before,omitempty"`
	RecoveryLimit       int64      `json:"recovery_limit"`
	RecoveryMode        string     `json:"recovery_mode"`
	RotateAfter         *time.Time `json:"rotate_after,omitempty"`
	RegistrationSecret  string     `json:"registration_secret,omitempty"`
	BoundPublicKey      string     `json:"bound_public_key,omitempty"`
	BoundKeyFingerprint string     `json:"bound_key_fingerprint,omitempty"`
	BoundInstanceID     string     `json:"bound_instance_id,omitempty"`
	RecoveryCount       int64      `json:"recovery_count"`
	RecoverySequence    int64      `json:"recovery_sequence"`
	RecoveriesRemaining int64      `json:"recoveries_remaining"`
	LastRecoveredAt     *time.Time `json:"last_recovered_at,omitempty"`
	LastRotatedAt       *time.Time `json:"last_rotated_at,omitempty"`
	Epoch               string     `json:"epoch,omitempty"`
}

// write prints the bound-keypair part of token get: the key, the budget
// and the rotation, never the registration secret.
func (b *boundKeypairJSON) write(w io.Writer) {
	when := func(t *time.Time) string {
		if t == nil {
			return "never"
		}
		return t.UTC().Format(time.RFC3339)
	}
	remaining := "not counted (mode " + b.RecoveryMode + ")"
	if b.RecoveriesRemaining >= 0 {
		remaining = fmt.Sprint(b.RecoveriesRemaining)
	}
	bound := b.BoundKeyFingerprint
	if bound == "" {
		bound = "none yet (registration open until " + when(b.MustRegisterBefore) + ")"
	}
	rotation := "not asked"
	if b.RotateAfter != nil {
		rotation = "after " + when(b.RotateAfter)
	}
	fmt.Fprintf(w, "Bound key:   %s\nInstance:    %s\nRecoveries:  %d of %d used (mode %s), %s remaining, sequence %d, last %s\nRotation:    %s, last rotated %s\n",
		bound, b.BoundInstanceID, b.RecoveryCount, b.RecoveryLimit, b.RecoveryMode, remaining, b.RecoverySequence,
		when(b.LastRecoveredAt), rotation, when(b.LastRotatedAt))
	if b.Epoch != "" {
		fmt.Fprintf(w, "Epoch:       %s (brought forward or recovered in that resync epoch)\n", b.Epoch)
	}
}

func timePtr(ts *timestamppb.Timestamp) *time.Time {
	if ts == nil {
		return nil
	}
	t := ts.AsTime()
	return &t
}

func boundKeypairOf(t *musterv1.Token) *boundKeypairJSON {
	sp, st := t.GetBoundKeypair(), t.GetBoundKeypairStatus()
	if sp == nil {
		return nil
	}
	return &boundKeypairJSON{InitialPublicKey: sp.GetInitialPublicKey(), MustRegisterBefore: timePtr(sp.GetMustRegisterBefore()),
		RecoveryLimit: sp.GetRecoveryLimit(), RecoveryMode: sp.GetRecoveryMode(), RotateAfter: timePtr(sp.GetRotateAfter()),
		RegistrationSecret: st.GetRegistrationSecret(), BoundPublicKey: st.GetBoundPublicKey(),
		BoundKeyFingerprint: st.GetBoundKeyFingerprint(), BoundInstanceID: st.GetBoundInstanceId(),
		RecoveryCount: st.GetRecoveryCount(), RecoverySequence: st.GetRecoverySequence(),
		RecoveriesRemaining: st.GetRecoveriesRemaining(), LastRecoveredAt: timePtr(st.GetLastRecoveredAt()),
		LastRotatedAt: timePtr(st.GetLastRotatedAt()), Epoch: st.GetEpoch()}
}

func newBotAddCmd(env *Env) *cobra.Command {
	var (
		af             adminFlags
		out            output
		keyFile        string
		limit          int64
		mode           string
		registerBefore string
		disc, discFP   string
		svidUsage      string
	)
	cmd := &cobra.Command{
		Use:   "add NAME",
		Short: "Add a bound-keypair token for node NAME",
		Example: `  muster bot add build-runner-01
  muster bot add build-runner-01 --public-key runner.pub --recovery-limit 3
  muster bot add gpu-7 --recovery-mode relaxed --register-before 24h -o json
  muster bot add mesh-4 --svid-usage client,server
  muster bot add edge-3 --discovery discovery.example:8443 --discovery-fingerprint sha256:4be1…`,
		Long: `Add a bound-keypair token named NAME for node NAME. With --public-key the
token is bound to that key now (static binding: the file holds an
ssh-ed25519 key in authorized_keys form, as "muster keypair create" prints
it). Without it the authority generates a one-use registration secret, shown
now and by "muster token get NAME" until used, with which the agent binds
its own key before --register-before (default: in 1h).

The first join counts as a recovery: --recovery-limit 1 admits the first
join and no recovery under the standard mode.

With --discovery, the joining URI through that discovery service is printed
as well (the agent looks the authority up there, then proves it by the CA
fingerprint before signing anything).

--svid-usage client,server lets the agent's certificates serve TLS too (so
machines can mTLS each other with their SPIFFE identities; see
docs/workload-api.md). Unlike a join token's, a bound-keypair token's usage
holds for as long as the token: each refresh and recovery takes it as it
is then, so "muster token apply" can change it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.check(); err != nil {
				return err
			}
			spec := &musterv1.BoundKeypairSpec{RecoveryLimit: limit, RecoveryMode: mode}
			if keyFile != "" {
				data, err := os.ReadFile(keyFile)
				if err != nil {
					return fmt.Errorf("bot add: --public-key: %w", err)
				}
				k, err := boundkeypair.ParsePublicKey(strings.TrimSpace(string(data)))
				if err != nil {
					return fmt.Errorf("bot add: --public-key %s: %w", keyFile, err)
				}
				spec.InitialPublicKey = k.String()
			} else {
				deadline, err := parseDeadline(registerBefore, time.Now())
				if err != nil {
					return fmt.Errorf("bot add: --register-before: %w", err)
				}
				spec.MustRegisterBefore = timestamppb.New(deadline)
			}
			if discFP != "" && disc == "" {
				return fmt.Errorf("bot add: --discovery-fingerprint needs --discovery")
			}
			if discFP != "" {
				fp, err := ca.ParseFingerprint(discFP)
				if err != nil {
					return fmt.Errorf("bot add: --discovery-fingerprint: %w", err)
				}
				discFP = fp
			}
			if mode == boundkeypair.ModeInsecure {
				fmt.Fprintln(env.Stderr, "warning: recovery mode insecure skips the join state check: a copied key can recover without being detected")
			}
			return af.call(cmd, env, "bot add", func(ctx context.Context, c *adminClient) error {
				var authorityID string
				if disc != "" {
					// Checked before the token is made, so a bad address
					// leaves nothing behind.
					st, err := c.GetStatus(ctx, &musterv1.GetStatusRequest{})
					if err != nil {
						return err
					}
					authorityID = st.GetAuthorityId()
					if _, err := throughDiscovery(placeholderURI, disc, authorityID, discFP); err != nil {
						return fmt.Errorf("bot add: --discovery: %w", err)
					}
				}
				resp, err := c.ApplyToken(ctx, &musterv1.ApplyTokenRequest{Name: args[0], NodeId: args[0], BoundKeypair: spec, CreateOnly: true, SvidUsage: svidUsage})
				if err != nil {
					return err
				}
				t := tokenOf(resp.GetToken())
				var discURI string
				if disc != "" {
					if discURI, err = throughDiscovery(resp.GetUri(), disc, authorityID, discFP); err != nil {
						return fmt.Errorf("bot add: --discovery: %w", err)
					}
				}
				if out.json() {
					return out.write(env.Stdout, struct {
						URI          string `json:"uri"`
						DiscoveryURI string `json:"discovery_uri,omitempty"`
						tokenJSON
					}{resp.GetUri(), discURI, t})
				}
				b := t.BoundKeypair
				fmt.Fprintf(env.Stdout, "Token:         %s (bound-keypair)\nNode:          %s\nRecovery:      limit %d, mode %s\n",
					t.ID, t.NodeID, b.RecoveryLimit, b.RecoveryMode)
				if b.BoundKeyFingerprint != "" {
					fmt.Fprintf(env.Stdout, "Bound key:     %s\n", b.BoundKeyFingerprint)
				}
				if b.RegistrationSecret != "" {
					fmt.Fprintf(env.Stdout, "Registration secret: %s\nRegister before:     %s\n", b.RegistrationSecret,
						b.MustRegisterBefore.UTC().Format(time.RFC3339))
				}
				if t.SVIDUsage != "" {
					fmt.Fprintf(env.Stdout, "SVID usage:    %s (its certificates may serve TLS)\n", t.SVIDUsage)
				}
				fmt.Fprintf(env.Stdout, "Joining URI:   %s\n", resp.GetUri())
				if discURI != "" {
					fmt.Fprintf(env.Stdout, "Through discovery: %s\n", discURI)
				}
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&keyFile, "public-key", "", "file holding the agent's ssh-ed25519 public key (static binding)")
	f.Int64Var(&limit, "recovery-limit", boundkeypair.DefaultRecoveryLimit, "recoveries allowed under the standard mode; the first join counts")
	f.StringVar(&mode, "recovery-mode", boundkeypair.ModeStandard, "standard, relaxed or insecure")
	f.StringVar(&disc, "discovery", "", "also print the joining URI through this discovery service, HOST:PORT")
	f.StringVar(&discFP, "discovery-fingerprint", "", "pin of the discovery's CA in that URI, sha256:HEX (default: the agent trusts the system roots for it)")
	f.StringVar(&svidUsage, "svid-usage", "client", "what the machine's certificates may do: client, or client,server to serve TLS too")
	f.StringVar(&registerBefore, "register-before", boundkeypair.DefaultRegisterWithin.String(), "registration deadline: RFC 3339 time or a duration from now")
	af.register(cmd)
	out.register(cmd)
	return cmd
}

// parseDeadline reads an RFC 3339 time or a duration from now.
func parseDeadline(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a positive duration", s)
	}
	return now.Add(d), nil
}

// throughDiscovery turns a bound-keypair joining URI for the authority into
// the same URI through a discovery service (DESIGN.md: the discovery's
// address, and authority_id added), checked by the parser agents use.
func throughDiscovery(direct, discovery, authorityID, discoveryFingerprint string) (string, error) {
	u, err := joinuri.Parse(direct)
	if err != nil {
		return "", err
	}
	u.Address, u.AuthorityID, u.DiscoveryFingerprint = discovery, authorityID, discoveryFingerprint
	out := u.Reveal()
	if _, err := joinuri.Parse(out); err != nil {
		return "", err
	}
	return out, nil
}

// placeholderURI is a well-formed bound-keypair URI, to check a discovery
// address before anything is created.
var placeholderURI = "muster+bound-keypair://check@127.0.0.1:1?fingerprint=sha256:" + strings.Repeat("0", 64)

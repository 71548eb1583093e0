package cli

import (
	"context"
	"crypto"
	"crypto/x509"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/shellword"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

func newCARootCmd(env *Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "root",
		Short: "Rotate the root CA in phases",
		Long: `Root rotation replaces the root CA without a machine joining again, in
phases: rotate makes a new root and the two cross-certificates (phase
init: both roots trusted, agents learn the new one); next-phase moves to
update_agents, then update_servers (intermediates signed by the new root,
so every new certificate chains to it; new joining URIs pin it), then
standby (the old root is no longer trusted). rollback goes one phase back;
from init it abandons the new root, once no agent certificate issued under
it in update_servers can still be valid (--abandon-now: at once). See
docs/ca-lifecycle.md.`,
	}
	var (
		abandonNow bool
		backFrom   string
	)
	rollback := newCARootStepCmd(env, "rollback", "Move the root rotation back one phase (from init: abandon the new root)",
		"  muster ca root rollback\n  muster ca root rollback --abandon-now   # from init, the new root's key compromised\n  muster ca root rollback --from update_agents",
		func(ctx context.Context, c *adminClient) (*musterv1.RootRotation, error) {
			if abandonNow {
				fmt.Fprintln(env.Stderr, "warning: --abandon-now: from init, an agent still holding a certificate under the new root cannot renew and must join again (muster agent join --force)")
			}
			// Back from the phase read now (as next-phase): a second
			// rollback a moment after another is refused, not a second
			// step back (from init, abandoning the new root).
			req := &musterv1.RollbackRootPhaseRequest{AbandonNow: abandonNow, FromPhase: backFrom}
			if req.FromPhase == "" {
				st, err := c.GetRootRotation(ctx, &musterv1.GetRootRotationRequest{})
				if err != nil {
					return nil, err
				}
				req.FromPhase = st.GetPhase()
			}
			return c.RollbackRootPhase(ctx, req)
		})
	rollback.Flags().StringVar(&backFrom, "from", "",
		"go back only if the rotation is still in this phase (muster ca root status); default: the phase read just before")
	rollback.Flags().BoolVar(&abandonNow, "abandon-now", false,
		"from init, abandon the new root even while agent certificates issued under it may be valid (unsafe: agents holding one must join again; for a new root whose key is compromised)")
	cmd.AddCommand(newCARootStatusCmd(env), newCARootRotateCmd(env), newCARootExportKeyCmd(env),
		newCARootNextPhaseCmd(env),
		rollback,
	)
	return cmd
}

// newCARootNextPhaseCmd is muster ca root next-phase. It moves on from
// the phase it read just before (or --from PHASE), so that a second call
// a moment after another (another operator, or a retry through another
// replica) is refused instead of advancing a second phase.
func newCARootNextPhaseCmd(env *Env) *cobra.Command {
	var (
		fromPhase string
		leaveAway bool
	)
	cmd := newCARootStepCmd(env, "next-phase", "Move the root rotation to its next phase",
		"  muster ca root next-phase\n  muster ca root next-phase --from update_agents\n  muster ca root next-phase --from update_servers --leave-away",
		func(ctx context.Context, c *adminClient) (*musterv1.RootRotation, error) {
			req := &musterv1.NextRootPhaseRequest{FromPhase: fromPhase, LeaveAway: leaveAway}
			if req.FromPhase == "" {
				st, err := c.GetRootRotation(ctx, &musterv1.GetRootRotationRequest{})
				if err != nil {
					return nil, err
				}
				req.FromPhase = st.GetPhase()
			}
			rot, err := c.NextRootPhase(ctx, req)
			// Warned only once the step went through: the authority
			// refuses --leave-away on a step that is not to standby, and
			// a warning before that refusal would say what did not happen.
			if err == nil && leaveAway {
				fmt.Fprintln(env.Stderr, "warning: --leave-away: agents away now with a certificate under the old root are refused their renewal when back from standby on, and each must join again by hand (muster ca root rollback trusts them again)")
			}
			return rot, err
		})
	cmd.Flags().StringVar(&fromPhase, "from", "",
		"move on only if the rotation is still in this phase (muster ca root status); default: the phase read just before")
	cmd.Flags().BoolVar(&leaveAway, "leave-away", false,
		"to standby: do not wait for agents away (seen before, not connected now) whose certificate is under the old root (unsafe for them: each is refused its renewal when back and must join again by hand)")
	return cmd
}

// rootCertJSON is one root or cross-certificate as -o json prints it.
type rootCertJSON struct {
	Fingerprint string    `json:"fingerprint"`
	Subject     string    `json:"subject"`
	Issuer      string    `json:"issuer"`
	NotAfter    time.Time `json:"not_after"`
	PEM         string    `json:"pem"`
}

// rootRotationJSON is muster ca root status -o json.
type rootRotationJSON struct {
	Phase             string         `json:"phase"`
	PreviousPhase     string         `json:"previous_phase,omitempty"`
	Version           int64          `json:"version"`
	OldRoot           *rootCertJSON  `json:"old_root,omitempty"`
	NewRoot           *rootCertJSON  `json:"new_root,omitempty"`
	SigningRoot       *rootCertJSON  `json:"signing_root"`
	TrustedRoots      []rootCertJSON `json:"trusted_roots"`
	CrossCertificates []rootCertJSON `json:"cross_certificates"`
	JoinFingerprint   string         `json:"join_fingerprint"`
	HoldsOldKey       bool           `json:"holds_old_root_key"`
	StartedAt         *time.Time     `json:"started_at,omitempty"`
	ChangedAt         *time.Time     `json:"changed_at,omitempty"`
	NextStep          string         `json:"next_step"`
}

func rootCertOf(der []byte) (*rootCertJSON, error) {
	if len(der) == 0 {
		return nil, nil
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("the authority sent a certificate that does not parse: %w", err)
	}
	return &rootCertJSON{Fingerprint: ca.Fingerprint(c), Subject: c.Subject.String(), Issuer: c.Issuer.String(),
		NotAfter: c.NotAfter.UTC(), PEM: string(ca.EncodeCertPEM(c))}, nil
}

// rootNextStep says what an operator does next in each phase.
var rootNextStep = map[string]string{
	"none":           "muster ca root rotate starts a rotation",
	"init":           "both roots are trusted; muster ca root next-phase (update_agents) once agents have had time to fetch the new bundle",
	"update_agents":  "muster ca root next-phase (update_servers) moves the intermediates under the new root",
	"update_servers": "new certificates chain to the new root; renew operator identities (muster admin renew) and have the connected agents renew (muster task send --type node.renew_now --all), then muster ca root next-phase (standby)",
	"standby":        "the old root is no longer trusted; muster ca root rollback brings it back, muster ca root rotate starts the next rotation",
}

func rootRotationOf(r *musterv1.RootRotation) (rootRotationJSON, error) {
	out := rootRotationJSON{Phase: r.GetPhase(), PreviousPhase: r.GetPreviousPhase(), Version: r.GetVersion(), HoldsOldKey: r.GetHoldsOldKey(),
		StartedAt: timeOf(r.GetStartedAt()), ChangedAt: timeOf(r.GetChangedAt()), NextStep: rootNextStep[r.GetPhase()],
		TrustedRoots: []rootCertJSON{}, CrossCertificates: []rootCertJSON{}}
	var err error
	if out.OldRoot, err = rootCertOf(r.GetOldRoot()); err != nil {
		return out, err
	}
	if out.NewRoot, err = rootCertOf(r.GetNewRoot()); err != nil {
		return out, err
	}
	if out.SigningRoot, err = rootCertOf(r.GetSigningRoot()); err != nil {
		return out, err
	}
	if out.SigningRoot != nil {
		out.JoinFingerprint = out.SigningRoot.Fingerprint
	}
	for _, list := range []struct {
		ders [][]byte
		into *[]rootCertJSON
	}{{r.GetTrustedRoots(), &out.TrustedRoots}, {r.GetCrossCertificates(), &out.CrossCertificates}} {
		for _, der := range list.ders {
			c, err := rootCertOf(der)
			if err != nil {
				return out, err
			}
			*list.into = append(*list.into, *c)
		}
	}
	return out, nil
}

func printRootRotation(w io.Writer, out output, r *musterv1.RootRotation) error {
	st, err := rootRotationOf(r)
	if err != nil {
		return err
	}
	if out.json() {
		return out.write(w, st)
	}
	if st.PreviousPhase != "" {
		fmt.Fprintf(w, "Root rotation: %s -> %s\n", st.PreviousPhase, st.Phase)
	} else {
		fmt.Fprintf(w, "Root rotation phase: %s\n", st.Phase)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ROOT\tFINGERPRINT\tTRUSTED\tSIGNS\tNOT AFTER")
	trusted := map[string]bool{}
	for _, t := range st.TrustedRoots {
		trusted[t.Fingerprint] = true
	}
	for _, x := range []struct {
		name string
		c    *rootCertJSON
	}{{"old", st.OldRoot}, {"new", st.NewRoot}} {
		if x.c == nil {
			continue
		}
		signs := st.SigningRoot != nil && st.SigningRoot.Fingerprint == x.c.Fingerprint
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", x.name, x.c.Fingerprint, yesNo(trusted[x.c.Fingerprint]), yesNo(signs), x.c.NotAfter.Format(time.RFC3339))
	}
	tw.Flush()
	fmt.Fprintf(w, "Cross-certificates: %d\nJoining URIs pin: %s\nNext: %s\n", len(st.CrossCertificates), st.JoinFingerprint, st.NextStep)
	return nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func newCARootStatusCmd(env *Env) *cobra.Command {
	var (
		af  adminFlags
		out output
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the root rotation's phase and roots",
		Example: `  muster ca root status
  muster ca root status -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			resp, err := callAdmin(cmd, env, &af, "ca root status", func(ctx context.Context, c *adminClient) (*musterv1.RootRotation, error) {
				return c.GetRootRotation(ctx, &musterv1.GetRootRotationRequest{})
			})
			if err != nil {
				return err
			}
			return printRootRotation(env.Stdout, out, resp)
		},
	}
	af.register(cmd)
	out.register(cmd)
	return cmd
}

func newCARootRotateCmd(env *Env) *cobra.Command {
	var (
		af      adminFlags
		out     output
		rootKey string
	)
	cmd := &cobra.Command{
		Use:   "rotate",
		Short: "Start a root rotation: a new root and the cross-certificates (phase init)",
		Long: `Makes a new root CA and certifies each root's key under the other, so a
holder of either accepts both; phase init. It needs the current root's key:
the authority uses the one in its data directory (ca/root.key); if that was
taken offline, give it with --root-key FILE on this machine: the authority
makes the new root and its key (which never leaves it), and this command
signs the new root's certificate with the key from FILE; FILE is read
here and never sent.`,
		Example: `  muster ca root rotate
  muster ca root rotate --root-key /secure/root.key`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			signer, err := loadRootKey(rootKey)
			if err != nil {
				return err
			}
			resp, err := callAdmin(cmd, env, &af, "ca root rotate", func(ctx context.Context, c *adminClient) (*musterv1.RootRotation, error) {
				if signer == nil {
					return c.RotateRoot(ctx, &musterv1.RotateRootRequest{})
				}
				p, err := c.PrepareRoot(ctx, &musterv1.PrepareRootRequest{})
				if err != nil {
					return nil, err
				}
				root, err1 := x509.ParseCertificate(p.GetNewRoot())
				cur, err2 := x509.ParseCertificate(p.GetCurrentRoot())
				if err1 != nil || err2 != nil {
					return nil, fmt.Errorf("the authority sent a root that does not parse")
				}
				if !sameKey(signer.Public(), cur.PublicKey) {
					if p.GetCurrentRootExported() {
						return nil, fmt.Errorf("--root-key %s is not the key of the current root %s, which a root rotation made: give the file muster ca root export-key wrote for it (its --out); ca/root.key holds the key of the root muster init made, which is no longer current", rootKey, ca.Fingerprint(cur))
					}
					return nil, fmt.Errorf("--root-key %s is not the key of the current root %s; give that root's key (muster init wrote it as ca/root.key)", rootKey, ca.Fingerprint(cur))
				}
				cross, err := ca.CrossSign(root, cur, signer, time.Now())
				if err != nil {
					return nil, err
				}
				return c.RotateRoot(ctx, &musterv1.RotateRootRequest{NewRoot: root.Raw, SealedKey: p.GetSealedKey(), CrossNewByOld: cross.Raw})
			})
			if err != nil {
				return err
			}
			return printRootRotation(env.Stdout, out, resp)
		},
	}
	cmd.Flags().StringVar(&rootKey, "root-key", "", "the current root's private key (PEM, PKCS#8), when the authority's data directory no longer holds it")
	af.register(cmd)
	out.register(cmd)
	return cmd
}

func newCARootStepCmd(env *Env, use, short, example string, call func(context.Context, *adminClient) (*musterv1.RootRotation, error)) *cobra.Command {
	var (
		af  adminFlags
		out output
	)
	cmd := &cobra.Command{
		Use:     use,
		Short:   short,
		Example: example,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			resp, err := callAdmin(cmd, env, &af, "ca root "+use, call)
			if err != nil {
				return err
			}
			return printRootRotation(env.Stdout, out, resp)
		},
	}
	af.register(cmd)
	out.register(cmd)
	return cmd
}

// loadRootKey reads --root-key: nil for none. A file other users may read
// is refused, as the data directory's keys are.
func loadRootKey(path string) (crypto.Signer, error) {
	if path == "" {
		return nil, nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("--root-key: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("--root-key %s: readable by other users (mode %o); chmod 600 %s", path, fi.Mode().Perm(), shellword.Quote(path))
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--root-key: %w", err)
	}
	k, err := ca.ParseKeyPEM(data)
	if err != nil {
		return nil, fmt.Errorf("--root-key %s: %w (want the PKCS#8 PEM key muster init wrote as ca/root.key)", path, err)
	}
	return k, nil
}

func sameKey(a, b crypto.PublicKey) bool {
	e, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && e.Equal(b)
}

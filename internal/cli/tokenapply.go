package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// maxTokenFile bounds what is read.
const maxTokenFile = 64 << 10

// parseTokenFile decodes token.yaml strictly: an unknown key, a wrong type
// or a bad value is an error that names the field (an unknown key with
// the keys valid there). A status, as token get -o yaml prints it, is
// ignored: the authority writes it.
func parseTokenFile(data []byte) (*musterv1.ApplyTokenRequest, error) {
	if len(data) > maxTokenFile {
		return nil, fmt.Errorf("larger than %d bytes", maxTokenFile)
	}
	var f tokenFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty")
		}
		return nil, explainFileYAML(data, err, tokenFile{})
	}
	switch {
	case f.Kind != "token":
		return nil, fmt.Errorf("kind: %q, want token", f.Kind)
	case f.Spec.JoinMethod != store.JoinMethodBoundKeypair:
		return nil, fmt.Errorf("spec.join_method: %q; apply writes bound-keypair tokens (join tokens: muster token create)", f.Spec.JoinMethod)
	case f.Spec.BoundKeypair.Onboarding.RegistrationSecret != "":
		return nil, errors.New("spec.bound_keypair.onboarding.registration_secret: leave it empty; the authority generates the secret")
	}
	bk := f.Spec.BoundKeypair
	spec := &musterv1.BoundKeypairSpec{InitialPublicKey: bk.Onboarding.InitialPublicKey, RecoveryLimit: 1, RecoveryMode: bk.Recovery.Mode}
	if bk.Recovery.Limit != nil {
		spec.RecoveryLimit = *bk.Recovery.Limit
	}
	if spec.RecoveryMode == "" {
		spec.RecoveryMode = "standard"
	}
	for _, tf := range []struct {
		field string
		text  string
		into  **timestamppb.Timestamp
	}{
		{"spec.bound_keypair.onboarding.must_register_before", bk.Onboarding.MustRegisterBefore, &spec.MustRegisterBefore},
		{"spec.bound_keypair.rotate_after", bk.RotateAfter, &spec.RotateAfter},
	} {
		if tf.text == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339, tf.text)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not an RFC 3339 time", tf.field, tf.text)
		}
		*tf.into = timestamppb.New(t)
	}
	return &musterv1.ApplyTokenRequest{Name: f.Metadata.Name, NodeId: f.Spec.Node, BoundKeypair: spec, SvidUsage: f.Spec.SVIDUsage}, nil
}

func newTokenApplyCmd(env *Env) *cobra.Command {
	var (
		af   adminFlags
		out  output
		file string
	)
	cmd := &cobra.Command{
		Use:   "apply -f token.yaml",
		Short: "Create a bound-keypair token or replace its spec",
		Example: `  muster token apply -f build-runner-01.yaml
  muster token apply -f - -o json`,
		Long: `Create a bound-keypair token from token.yaml, or replace the spec of an
existing one (raising spec.bound_keypair.recovery.limit brings an agent whose
budget is spent back). The file is the token resource that
muster token get NAME -o yaml prints: edit that and apply it. Its status is the
authority's and is ignored. Unknown keys are refused, naming the keys valid
there, so a misspelt field is never ignored. -f - reads standard input.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			if file == "" {
				return errors.New("token apply: -f FILE is required")
			}
			var r io.Reader = env.Stdin
			if file != "-" {
				fh, err := os.Open(file)
				if err != nil {
					return fmt.Errorf("token apply: %w", err)
				}
				defer fh.Close()
				r = fh
			}
			data, err := io.ReadAll(io.LimitReader(r, maxTokenFile+1))
			if err != nil {
				return fmt.Errorf("token apply: %w", err)
			}
			req, err := parseTokenFile(data)
			if err != nil {
				return fmt.Errorf("token apply: %s: %v", file, err)
			}
			return af.call(cmd, env, "token apply", func(ctx context.Context, c *adminClient) error {
				resp, err := c.ApplyToken(ctx, req)
				if err != nil {
					return err
				}
				t := tokenOf(resp.GetToken())
				if out.json() {
					return out.write(env.Stdout, t)
				}
				verb := "updated"
				if resp.GetCreated() {
					verb = "created"
				}
				fmt.Fprintf(env.Stdout, "token %s %s (recovery limit %d, mode %s)\n", t.ID, verb, t.BoundKeypair.RecoveryLimit, t.BoundKeypair.RecoveryMode)
				if s := t.BoundKeypair.RegistrationSecret; s != "" && resp.GetCreated() {
					fmt.Fprintf(env.Stdout, "Registration secret: %s\n", s)
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "token.yaml, or - for standard input")
	af.register(cmd)
	out.register(cmd)
	return cmd
}

// Package cli is muster's command line: one file per command group. Admin
// commands talk to the authority's API only, never to its store.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/agent"
	"github.com/muster-dev/muster/internal/errinfo"
)

// Version is set at build time with -ldflags "-X ...cli.Version=v1.2.3".
var Version = "dev"

// Env is what a command reads and writes besides its flags, so tests can
// run commands in-process and check their output.
type Env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Getenv func(string) string
}

// Run executes muster with args and returns the process exit code.
func Run(ctx context.Context, args []string, env Env) int {
	if env.Getenv == nil {
		env.Getenv = os.Getenv
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRoot(&env)
	root.SetArgs(args)
	root.SetIn(env.Stdin)
	root.SetOut(env.Stdout)
	root.SetErr(env.Stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintf(env.Stderr, "muster: %s\n", describe(err))
	return 1
}

func newRoot(env *Env) *cobra.Command {
	root := &cobra.Command{
		Use:   "muster",
		Short: "muster admits machines into a fleet and gives each one an identity",
		Long: `muster is a machine enrollment and identity authority.

Start with "muster dev" to run an authority on this machine, or
"muster init --data DIR" then "muster authority --data DIR" for a real one.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       currentBuild().Version,
	}
	root.AddCommand(
		withEnv(env, newInitCmd(env)),
		withEnv(env, newAuthorityCmd(env)),
		withEnv(env, newDiscoveryCmd(env)),
		withEnv(env, newDevCmd(env)),
		newAdminCmd(env),
		newAuditCmd(env),
		newStoreCmd(env),
		newLockCmd(env),
		newTokenCmd(env),
		newPSKCmd(env),
		newSignerCmd(env),
		newSettingsCmd(env),
		newCACmd(env),
		newTaskCmd(env),
		newAgentsCmd(env),
		newAgentCmd(env),
		newKeypairCmd(env),
		newBenchCmd(env),
		newBotCmd(env),
		newBoundKeypairCmd(env),
		newStatusCmd(env),
		newVersionCmd(env),
		newHealthcheckCmd(env),
	)
	return root
}

// codeName is the canonical upper-case name of a gRPC code, as the gRPC
// specification and every other client print it.
var codeName = map[codes.Code]string{
	codes.Canceled: "CANCELLED", codes.Unknown: "UNKNOWN", codes.InvalidArgument: "INVALID_ARGUMENT",
	codes.DeadlineExceeded: "DEADLINE_EXCEEDED", codes.NotFound: "NOT_FOUND", codes.AlreadyExists: "ALREADY_EXISTS",
	codes.PermissionDenied: "PERMISSION_DENIED", codes.ResourceExhausted: "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION", codes.Aborted: "ABORTED", codes.OutOfRange: "OUT_OF_RANGE",
	codes.Unimplemented: "UNIMPLEMENTED", codes.Internal: "INTERNAL", codes.Unavailable: "UNAVAILABLE",
	codes.DataLoss: "DATA_LOSS", codes.Unauthenticated: "UNAUTHENTICATED",
}

// describe renders an error as one line, naming the gRPC code when the
// error came from the authority.
func describe(err error) string {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		st := se.GRPCStatus()
		msg := st.Message()
		var de *agent.DiscoveryError
		switch r := errinfo.Reason(err); {
		case errors.As(err, &de) && st.Code() == codes.Unavailable:
			msg = fmt.Sprintf("cannot reach discovery at %s (%s): %s", de.Addr, de.Step, msg)
		case errors.As(err, &de):
			msg = fmt.Sprintf("discovery %s (%s): %s", de.Addr, de.Step, msg)
		case st.Code() == codes.Unavailable && r != errinfo.ReasonStoreUnavailable && r != errinfo.ReasonKeyCustodyUnavailable:
			msg = "cannot reach the authority: " + msg
		}
		if svc, ok := strings.CutPrefix(msg, "unknown service "); ok && st.Code() == codes.Unimplemented {
			return notMuster(svc)
		}
		return fmt.Sprintf("%s: %s", codeName[st.Code()], oneLine(msg))
	}
	return oneLine(err.Error())
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// output is the -o flag of commands that print data.
type output struct{ format string }

func (o *output) register(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&o.format, "output", "o", "text", "output format: text, json or yaml")
}

func (o *output) check() error {
	switch o.format {
	case "text", "json", "yaml":
		return nil
	}
	return fmt.Errorf("unknown output format %q: use text, json or yaml", o.format)
}

// json reports whether the output is structured (JSON or YAML): commands
// then print their JSON shape, which write renders in the chosen format.
func (o *output) json() bool { return o.format == "json" || o.format == "yaml" }

func (o *output) structured() bool { return o.json() }

// write prints v as JSON or, with -o yaml, as the same document in YAML:
// one shape, the JSON field names, for both formats.
func (o *output) write(w io.Writer, v any) error {
	if o.format == "yaml" {
		return writeYAML(w, v)
	}
	return writeJSON(w, v)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeYAML renders v's JSON encoding as block-style YAML, so the field
// names and order are the ones -o json prints.
func writeYAML(w io.Writer, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return err
	}
	blockStyle(&doc)
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return err
	}
	return enc.Close()
}

// blockStyle drops the flow style ({…}, […]) and quoting the JSON source
// gave each node, leaving the encoder to choose, as for any YAML document.
func blockStyle(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		blockStyle(c)
	}
}

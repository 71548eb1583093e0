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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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
		Version:       Version,
	}
	root.AddCommand(
		newInitCmd(env),
		newAuthorityCmd(env),
		newDiscoveryCmd(env),
		newDevCmd(env),
		newAdminCmd(env),
		newAuditCmd(env),
		newLockCmd(env),
		newTokenCmd(env),
		newPSKCmd(env),
		newSignerCmd(env),
		newTaskCmd(env),
		newAgentsCmd(env),
		newAgentCmd(env),
		newKeypairCmd(env),
		newBotCmd(env),
		newStatusCmd(env),
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
		if st.Code() == codes.Unavailable {
			msg = "cannot reach the authority: " + msg
		}
		return fmt.Sprintf("%s: %s", codeName[st.Code()], oneLine(msg))
	}
	return oneLine(err.Error())
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// output is the -o flag of commands that print data.
type output struct{ format string }

func (o *output) register(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&o.format, "output", "o", "text", "output format: text or json")
}

func (o *output) check() error {
	if o.format != "text" && o.format != "json" {
		return fmt.Errorf("unknown output format %q: use text or json", o.format)
	}
	return nil
}

func (o *output) json() bool { return o.format == "json" }

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

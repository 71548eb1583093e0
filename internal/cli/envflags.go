package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// EnvName is the environment variable of a server flag: MUSTER_ and the
// flag's name in upper case with "_" for "-" (--metrics-listen is
// MUSTER_METRICS_LISTEN). Every process reads its own environment, so the
// authority's and discovery's --listen may share MUSTER_LISTEN.
func EnvName(flag string) string {
	return "MUSTER_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// envAnnotation on a flag names its variable where EnvName's would be
// wrong (agent run's --data is MUSTER_AGENT_DATA: MUSTER_DATA is the
// authority's directory).
const envAnnotation = "muster-env"

// envNameOf is f's variable: its annotation, else EnvName.
func envNameOf(f *pflag.Flag) string {
	if v := f.Annotations[envAnnotation]; len(v) == 1 {
		return v[0]
	}
	return EnvName(f.Name)
}

// withEnv lets every flag of cmd (a server command) be set from its
// environment variable. Precedence: a flag given on the command line, then
// the environment, then the configuration file, then the default; an
// environment variable counts as given (pflag's Changed), which is how the
// commands already rank flags above the file. An empty variable counts as
// unset.
func withEnv(env *Env, cmd *cobra.Command) *cobra.Command {
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name != "help" && !strings.Contains(f.Usage, "(env ") {
			f.Usage += " (env " + envNameOf(f) + ")"
		}
	})
	prev := cmd.PreRunE
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		if err := applyEnv(env, c.Flags()); err != nil {
			return fmt.Errorf("%s: %w", c.Name(), err)
		}
		if prev != nil {
			return prev(c, args)
		}
		return nil
	}
	return cmd
}

func applyEnv(env *Env, fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || f.Name == "help" {
			return
		}
		name := envNameOf(f)
		v := env.Getenv(name)
		if v == "" {
			return
		}
		if fs.Set(f.Name, v) != nil {
			// The value is not echoed: a variable may hold a store URL
			// with a password.
			err = fmt.Errorf("environment variable %s: want %s", name, valueKind(f))
		}
	})
	return err
}

// valueKind says what a flag takes in words, never as a Go type.
func valueKind(f *pflag.Flag) string {
	switch f.Value.Type() {
	case "bool":
		return "true or false"
	case "duration":
		return "a duration such as 30s, 15m or 24h"
	case "int", "int32", "int64", "uint", "uint32", "uint64":
		return "a whole number"
	case "stringSlice", "stringArray":
		return "a comma-separated list"
	}
	return "a valid value"
}

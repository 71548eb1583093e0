// Command muster is the machine enrollment and identity authority: one
// binary for the authority, the agent, discovery and the admin CLI.
package main

import (
	"context"
	"os"

	"github.com/muster-dev/muster/internal/cli"
)

func main() {
	os.Exit(cli.Run(context.Background(), os.Args[1:], cli.Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}))
}

package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

// Commit and BuildDate are set at build time, like Version:
//
//	go build -ldflags "-X github.com/muster-dev/muster/internal/cli.Version=v1.2.3
//	  -X github.com/muster-dev/muster/internal/cli.Commit=abc123
//	  -X github.com/muster-dev/muster/internal/cli.BuildDate=2026-01-02T03:04:05Z"
//
// A binary built without them (go install, go build in a checkout) falls
// back on what the Go toolchain recorded: the module version and the VCS
// revision and commit time.
var (
	Commit    = ""
	BuildDate = ""
)

// buildInfo is what `muster version` prints.
type buildInfo struct {
	Version   string `json:"version" yaml:"version"`
	Commit    string `json:"commit" yaml:"commit"`
	Modified  bool   `json:"modified,omitempty" yaml:"modified,omitempty"`
	BuildDate string `json:"build_date" yaml:"build_date"`
	GoVersion string `json:"go_version" yaml:"go_version"`
	Platform  string `json:"platform" yaml:"platform"`
	// The newest store schema and data directory layout this binary
	// opens: what an operator compares when an older binary refuses a
	// database or directory a newer one migrated (docs/install.md,
	// "Upgrades").
	StoreSchema int `json:"store_schema" yaml:"store_schema"`
	DataFormat  int `json:"data_format" yaml:"data_format"`
}

// currentBuild merges the ldflags values with the toolchain's record; an
// ldflags value always wins, since a release build sets it on purpose.
func currentBuild() buildInfo {
	b := buildInfo{Version: Version, Commit: Commit, BuildDate: BuildDate,
		GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH,
		StoreSchema: sqlite.LatestSchemaVersion(), DataFormat: datadir.FormatVersion}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	if b.Version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		b.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			if b.Commit == "" {
				b.Commit = s.Value
			}
		case "vcs.time":
			if b.BuildDate == "" {
				b.BuildDate = s.Value
			}
		case "vcs.modified":
			if Commit == "" {
				b.Modified = s.Value == "true"
			}
		}
	}
	return b
}

// reportedVersion is the version a server reports (muster status): the
// release's, or, for a build without one (a plain go build), "unreleased
// build" and its commit, which does not read as the command muster dev.
func reportedVersion() string {
	b := currentBuild()
	if b.Version != "dev" {
		return b.Version
	}
	c := b.Commit
	if len(c) > 12 {
		c = c[:12]
	}
	if c == "" {
		return "unreleased build"
	}
	if b.Modified {
		c += "+modified"
	}
	return "unreleased build " + c
}

func unknownIfEmpty(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func newVersionCmd(env *Env) *cobra.Command {
	var out output
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print muster's version, commit, build date, Go version and the store schema it knows",
		Example: `  muster version
  muster version -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			b := currentBuild()
			if out.structured() {
				return out.write(env.Stdout, b)
			}
			commit := unknownIfEmpty(b.Commit)
			if b.Modified {
				commit += " (modified)"
			}
			fmt.Fprintf(env.Stdout, "muster %s\nCommit:     %s\nBuilt:      %s\nGo version: %s\nPlatform:   %s\nSchema:     store %d, data directory %d\n",
				b.Version, commit, unknownIfEmpty(b.BuildDate), b.GoVersion, b.Platform, b.StoreSchema, b.DataFormat)
			return nil
		},
	}
	out.register(cmd)
	return cmd
}

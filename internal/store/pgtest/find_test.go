package pgtest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFindBinDir builds fake installations (empty executables named initdb
// and pg_ctl, a pg_config script) and checks where findBinDir looks and in
// which order: PATH, then `pg_config --bindir`, then the newest Debian
// version directory.
func TestFindBinDir(t *testing.T) {
	// Each case names directories under a fresh root: "server" dirs get
	// initdb and pg_ctl, "initdbOnly" dirs only initdb, "notExec" dirs a
	// non-executable initdb and pg_ctl, and pgConfig maps a PATH directory
	// to the bindir its pg_config prints. path and want are relative to the
	// root ("" for want means ErrNotInstalled).
	tests := []struct {
		name       string
		server     []string
		initdbOnly []string
		notExec    []string
		pgConfig   map[string]string
		path       []string
		want       string
	}{
		{
			name:   "on PATH",
			server: []string{"usr/local/bin", "debian/15/bin"},
			path:   []string{"usr/bin", "usr/local/bin"},
			want:   "usr/local/bin",
		},
		{
			name:   "first of two on PATH",
			server: []string{"a/bin", "b/bin"},
			path:   []string{"b/bin", "a/bin"},
			want:   "b/bin",
		},
		{
			name:       "initdb without pg_ctl on PATH is passed over",
			server:     []string{"opt/pg/bin"},
			initdbOnly: []string{"usr/bin"},
			path:       []string{"usr/bin", "opt/pg/bin"},
			want:       "opt/pg/bin",
		},
		{
			name:    "files that are not executable are passed over",
			server:  []string{"debian/13/bin"},
			notExec: []string{"usr/bin"},
			path:    []string{"usr/bin"},
			want:    "debian/13/bin",
		},
		{
			name:     "pg_config --bindir",
			server:   []string{"opt/postgresql/16/bin", "debian/15/bin"},
			pgConfig: map[string]string{"usr/bin": "opt/postgresql/16/bin"},
			path:     []string{"usr/bin"},
			want:     "opt/postgresql/16/bin",
		},
		{
			name:     "PATH before pg_config",
			server:   []string{"opt/postgresql/16/bin", "usr/local/bin"},
			pgConfig: map[string]string{"usr/bin": "opt/postgresql/16/bin"},
			path:     []string{"usr/bin", "usr/local/bin"},
			want:     "usr/local/bin",
		},
		{
			// libpq-dev's pg_config names a version whose server is not
			// installed.
			name:     "pg_config naming a directory without a server falls back to Debian",
			server:   []string{"debian/15/bin"},
			pgConfig: map[string]string{"usr/bin": "debian/17/bin"},
			path:     []string{"usr/bin"},
			want:     "debian/15/bin",
		},
		{
			name:   "newest Debian version, numerically",
			server: []string{"debian/9.6/bin", "debian/10/bin", "debian/13/bin"},
			// A version directory left without its server (a removed
			// package) is passed over.
			initdbOnly: []string{"debian/17/bin"},
			path:       []string{"usr/bin"},
			want:       "debian/13/bin",
		},
		{
			name:       "none",
			initdbOnly: []string{"usr/bin", "debian/15/bin"},
			pgConfig:   map[string]string{"usr/local/bin": "nowhere"},
			path:       []string{"usr/bin", "usr/local/bin"},
		},
		{
			name:   "relative and empty PATH entries are not searched",
			server: []string{"rel/bin"},
			path:   []string{"", "rel/bin"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			at := func(rel string) string { return filepath.Join(root, rel) }
			for _, d := range tt.server {
				writeFile(t, at(d), "initdb", 0o755, "")
				writeFile(t, at(d), "pg_ctl", 0o755, "")
			}
			for _, d := range tt.initdbOnly {
				writeFile(t, at(d), "initdb", 0o755, "")
			}
			for _, d := range tt.notExec {
				writeFile(t, at(d), "initdb", 0o644, "")
				writeFile(t, at(d), "pg_ctl", 0o644, "")
			}
			for d, bin := range tt.pgConfig {
				writeFile(t, at(d), "pg_config", 0o755, fmt.Sprintf("#!/bin/sh\n[ \"$1\" = --bindir ] && echo %s\n", at(bin)))
			}
			var path []string
			for _, p := range tt.path {
				if p == "" || p == "rel/bin" {
					path = append(path, p) // as given: relative
					continue
				}
				path = append(path, at(p))
			}
			// The relative entry would resolve against the working
			// directory: make it resolve to a real server there.
			t.Chdir(root)

			got, err := findBinDir(strings.Join(path, string(os.PathListSeparator)), at("debian/*/bin"))
			if tt.want == "" {
				if !errors.Is(err, ErrNotInstalled) {
					t.Fatalf("findBinDir = %q, %v; want ErrNotInstalled", got, err)
				}
				return
			}
			if err != nil || got != at(tt.want) {
				t.Fatalf("findBinDir = %q, %v; want %q", got, err, at(tt.want))
			}
		})
	}
}

func writeFile(t *testing.T, dir, name string, mode os.FileMode, content string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

// TestErrNotInstalledSaysHowToInstall: the skip is one line that names
// where PostgreSQL was looked for and how to install it.
func TestErrNotInstalledSaysHowToInstall(t *testing.T) {
	msg := ErrNotInstalled.Error()
	for _, want := range []string{"PATH", "pg_config --bindir", "/usr/lib/postgresql/*/bin", "apt-get install postgresql"} {
		if !strings.Contains(msg, want) {
			t.Errorf("ErrNotInstalled %q does not mention %q", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("ErrNotInstalled is more than one line: %q", msg)
	}
}

// recorder is a testing.TB that records how FailOrSkip ends a test instead
// of ending it.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()                          {}
func (r *recorder) Skipf(format string, args ...any) { r.skipped = fmt.Sprintf(format, args...) }
func (r *recorder) Fatal(args ...any)                { r.failed = fmt.Sprint(args...) }

func TestFailOrSkip(t *testing.T) {
	notInstalled := fmt.Errorf("wrapped: %w", ErrNotInstalled)
	tests := []struct {
		name    string
		err     error
		require string
		ci      string
		skip    bool
		fail    string // a substring of the failure; "" for none
	}{
		{name: "started", err: nil},
		{name: "not installed skips", err: notInstalled, skip: true},
		{name: "not installed, other value of the variable, skips", err: notInstalled, require: "yes", skip: true},
		{name: "not installed fails when required", err: notInstalled, require: "1", fail: RequireEnv + "=1"},
		{name: "not installed fails in CI", err: notInstalled, ci: "true", fail: "CI is set"},
		{name: "installed but broken fails", err: errors.New("pg_ctl start: exit status 1"), fail: "pg_ctl start"},
		{name: "installed but broken fails when required", err: errors.New("initdb: exit status 1"), require: "1", fail: "initdb"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(RequireEnv, tt.require)
			t.Setenv("CI", tt.ci)
			r := &recorder{TB: t}
			FailOrSkip(r, tt.err)
			if tt.skip != (r.skipped != "") {
				t.Errorf("skipped = %q, want a skip: %v", r.skipped, tt.skip)
			}
			if tt.skip && (!strings.Contains(r.skipped, "apt-get install postgresql") || strings.Contains(r.skipped, "\n")) {
				t.Errorf("skip line %q does not say in one line how to install PostgreSQL", r.skipped)
			}
			if tt.fail == "" && r.failed != "" || !strings.Contains(r.failed, tt.fail) {
				t.Errorf("failed = %q, want a failure containing %q", r.failed, tt.fail)
			}
		})
	}
}

// TestNewDatabaseWithoutPostgreSQL: the Server Main stores where PostgreSQL
// is not installed skips the test that asks it for a database.
func TestNewDatabaseWithoutPostgreSQL(t *testing.T) {
	t.Setenv(RequireEnv, "")
	t.Setenv("CI", "")
	s := &Server{missing: ErrNotInstalled}
	r := &recorder{TB: t}
	if url := s.NewDatabase(r); url != "" || r.skipped == "" {
		t.Errorf("NewDatabase = %q, skipped %q; want a skip", url, r.skipped)
	}
}

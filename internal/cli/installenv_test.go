package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestInstallLoadsTheUnitsEnvironment runs install.md's command that gives
// an offline command the packaged unit's /etc/muster/authority.env, with
// the packaged file (its comments kept, MUSTER_STORE and PGPASSWORD set as
// its comments suggest) and a muster that prints what it was given: the
// store URL and password must reach it. `env $(cat FILE) muster …` ran
// "#" (the file's first word) instead.
func TestInstallLoadsTheUnitsEnvironment(t *testing.T) {
	doc, err := os.ReadFile("../../docs/install.md")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(doc)), " ")
	var cmd string
	for _, m := range regexp.MustCompile("`([^`]*/etc/muster/authority\\.env[^`]*muster[^`]*)`").FindAllStringSubmatch(text, -1) {
		if strings.Contains(m[1], "--offline") || strings.Contains(m[1], "…") {
			cmd = m[1]
		}
	}
	if cmd == "" {
		t.Fatal("install.md names no command that reads /etc/muster/authority.env for an offline command")
	}
	packaged, err := os.ReadFile("../../packaging/deb/authority.env")
	if err != nil {
		t.Fatal(err)
	}
	const url, pw = "postgres://muster@db.internal:5432/muster", "s3cret"
	filled := strings.NewReplacer("# MUSTER_STORE=", "MUSTER_STORE=", "# PGPASSWORD=...", "PGPASSWORD="+pw).Replace(string(packaged))
	if !strings.Contains(filled, "\nMUSTER_STORE="+url) || !strings.Contains(filled, "\nPGPASSWORD="+pw) {
		t.Fatalf("packaging/deb/authority.env no longer suggests MUSTER_STORE=%s and PGPASSWORD:\n%s", url, packaged)
	}
	tmp := t.TempDir()
	envFile := filepath.Join(tmp, "etc", "authority.env")
	if err := os.MkdirAll(filepath.Dir(envFile), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(envFile, []byte(filled), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(tmp, "bin")
	if err := os.Mkdir(bin, 0o700); err != nil {
		t.Fatal(err)
	}
	fake := "#!/bin/sh\necho \"store=$MUSTER_STORE password=$PGPASSWORD args=$*\"\n"
	if err := os.WriteFile(filepath.Join(bin, "muster"), []byte(fake), 0o700); err != nil {
		t.Fatal(err)
	}
	// As the operator pastes it, run as the user already (sudo -u muster
	// dropped, sudo cat read as cat), the file at envFile.
	run := strings.NewReplacer("sudo -u muster ", "", "sudo ", "", "/etc/muster/authority.env", envFile, "…", "").Replace(cmd)
	c := exec.Command("sh", "-c", run)
	c.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "MUSTER_STORE=", "PGPASSWORD=")
	out, err := c.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "store="+url+" password="+pw+" ") {
		t.Fatalf("install.md's %q, run as %q: %v\n%s", cmd, run, err, out)
	}
}

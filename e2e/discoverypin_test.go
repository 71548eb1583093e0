package e2e

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDiscoveryPinMismatchIsReportedOnce: the authority started with a
// discovery pin that is not discovery's CA (its own root's fingerprint,
// the usual mistake). That lasts until an operator acts, so the authority
// does not retry every 30 s: one ERROR, whose next attempt is an hour
// away, names the way out, one audit record (discovery.register, error)
// says the same, and muster_discovery_pin_mismatch is 1. The way out,
// pasted (muster discovery show --data DIR on discovery's machine), gives
// the pin; the authority restarted with it registers, and the gauge is 0.
func TestDiscoveryPinMismatchIsReportedOnce(t *testing.T) {
	t.Parallel()
	dir, init := initDir(t)
	ddir := filepath.Join(t.TempDir(), "discovery")
	disc := startDiscovery(t, ddir, allowing(init)...)
	wrong := init["ca_fingerprint"].(string)
	auth := startAuthority(t, dir, "--discovery", disc.addr, "--discovery-fingerprint", wrong)
	waitMetric(t, auth, "\nmuster_discovery_pin_mismatch 1\n", 60*time.Second)

	// The log is read from the process's stderr as it comes: the record
	// may reach the test after the gauge.
	var errs []map[string]any
	waitFor(t, 30*time.Second, "the ERROR about the pin mismatch", func() bool {
		errs = nil
		for _, line := range strings.Split(auth.Logs(), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["level"] == "ERROR" && strings.Contains(rec["msg"].(string), "discovery") {
				errs = append(errs, rec)
			}
		}
		return len(errs) > 0
	})
	if len(errs) != 1 {
		t.Fatalf("%d ERROR records about discovery, want one:\n%s", len(errs), auth.Logs())
	}
	msg, _ := errs[0]["err"].(string)
	if errs[0]["in"] != float64(time.Hour) || !strings.Contains(msg, "muster discovery show --data DIR") || !strings.Contains(msg, "discovery.fingerprint in "+filepath.Join(dir, "authority.yaml")) {
		t.Fatalf("the ERROR does not say it is tried again in an hour, or names no way out: %v", errs[0])
	}

	var recs []struct{ Action, Result, Reason string }
	out := mustRun(t, "audit", "list", "--data", dir, "--action", "discovery.register", "-o", "json")
	if err := json.Unmarshal([]byte(out), &recs); err != nil {
		t.Fatalf("audit list -o json: %v\n%s", err, out)
	}
	if len(recs) != 1 || recs[0].Result != "error" || !strings.Contains(recs[0].Reason, "muster discovery show --data DIR") {
		t.Fatalf("discovery.register audit records %+v, want one error naming the way out", recs)
	}

	// The way out, on discovery's machine: DIR is its data directory.
	show := regexp.MustCompile(`muster discovery show --data DIR`).FindString(msg)
	r := muster(t, nil, strings.Fields(strings.Replace(strings.TrimPrefix(show, "muster "), "DIR", ddir, 1))...)
	pin := regexp.MustCompile(`sha256:[0-9a-f]{64}`).FindString(r.stdout)
	if r.code != 0 || pin != disc.fingerprint {
		t.Fatalf("%s: exit %d, pin %q, want %q\n%s%s", show, r.code, pin, disc.fingerprint, r.stdout, r.stderr)
	}
	auth.stop(t)
	auth = startAuthority(t, dir, "--discovery", disc.addr, "--discovery-fingerprint", pin)
	waitFor(t, 60*time.Second, "the authority registered with the pin corrected", func() bool {
		return strings.Contains(auth.Logs(), "registered with discovery")
	})
	waitMetric(t, auth, "\nmuster_discovery_pin_mismatch 0\n", 10*time.Second)
}

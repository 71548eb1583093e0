package cli

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// TestInitFromEnvironment: init reads MUSTER_* as the server commands do
// (MUSTER_DATA as systemd's StateDirectory or a container sets it), and a
// flag still wins over its variable.
func TestInitFromEnvironment(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	code, stdout, stderr := runCLIEnv(t, map[string]string{"MUSTER_DATA": dir, "MUSTER_NAME": "fromenv", "MUSTER_OPERATOR": "ops"},
		"init", "--name", "fromflag", "-o", "json")
	if code != 0 {
		t.Fatalf("init: exit %d: %s", code, stderr)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("init -o json printed %q: %v", stdout, err)
	}
	if id, _ := got["authority_id"].(string); !strings.HasPrefix(id, "fromflag-") {
		t.Errorf("authority_id %q: want the flag's name over MUSTER_NAME", id)
	}
	if !strings.Contains(stdout, dir) || !strings.Contains(stdout, "ops") {
		t.Errorf("init did not use MUSTER_DATA and MUSTER_OPERATOR:\n%s", stdout)
	}
}

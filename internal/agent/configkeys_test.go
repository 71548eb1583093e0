package agent

import (
	"os"
	"strings"
	"testing"
)

// A misspelt key in agent.yaml is refused naming every key there is, the
// workload_api ones included, and none of the file's content (it may hold
// a token).
func TestReadConfigNamesEveryKey(t *testing.T) {
	d := Dir(t.TempDir())
	if err := os.WriteFile(d.ConfigFile(), []byte("token: abc.SECRET\nworkload_api:\n  call_timeot: 5s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := d.ReadConfig()
	if err == nil {
		t.Fatal("ReadConfig of a misspelt key: no error")
	}
	if strings.Contains(err.Error(), "SECRET") || strings.Contains(err.Error(), "call_timeot") {
		t.Errorf("ReadConfig: %v quotes the file", err)
	}
	for _, k := range []string{"authority", "ca_fingerprint", "node", "join_method", "token", "psk", "discovery",
		"discovery_fingerprint", "authority_id", "bound_keypair", "registration_secret",
		"workload_api: listen", "socket_mode", "socket_uid", "socket_gid", "allow_uids", "allow_gids",
		"max_streams_per_uid", "call_timeout"} {
		if !strings.Contains(err.Error(), k) {
			t.Errorf("ReadConfig: %v\ndoes not name the key %s", err, k)
		}
	}
}

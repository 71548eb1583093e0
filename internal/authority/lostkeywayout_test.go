package authority

import (
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/store"
)

// TestLostKeyWayOutNamesConfig: the offline rotation a lost key's refusal
// names carries --config FILE when the authority was started with a
// settings file outside its data directory (the store URL may be only
// there), and not for DIR/authority.yaml or none.
func TestLostKeyWayOutNamesConfig(t *testing.T) {
	dir := datadir.Dir("/var/lib/muster/my authority")
	for _, c := range []struct{ config, want string }{
		{"", "muster-pkcs11 ca rotate agent --offline --data '/var/lib/muster/my authority' (with"},
		{dir.ConfigFile(), "muster-pkcs11 ca rotate agent --offline --data '/var/lib/muster/my authority' (with"},
		{"/etc/muster/the authority.yaml", "muster-pkcs11 ca rotate agent --offline --data '/var/lib/muster/my authority' --config '/etc/muster/the authority.yaml' (with"},
	} {
		in := &intermediates{s: &Server{cfg: Config{Dir: dir, ConfigFile: c.config}}}
		if got := in.lostKeyWayOut("agent", store.CAActive); !strings.Contains(got, c.want) {
			t.Errorf("started with %q:\n got %s\nwant %s", c.config, got, c.want)
		}
	}
}

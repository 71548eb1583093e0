package authority

import (
	"testing"
	"time"
)

// TestSettingsInForce: the one place each setting's default is applied,
// which the server and --check-config both use.
func TestSettingsInForce(t *testing.T) {
	for _, tt := range []struct {
		configured, want time.Duration
	}{{0, 10 * time.Minute}, {-time.Second, 10 * time.Minute}, {time.Minute, time.Minute}, {3 * time.Hour, 3 * time.Hour}} {
		if got := RegisterEvery(tt.configured); got != tt.want {
			t.Errorf("RegisterEvery(%s) = %s, want %s", tt.configured, got, tt.want)
		}
	}
}

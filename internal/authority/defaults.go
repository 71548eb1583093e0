package authority

import (
	"time"

	"github.com/muster-dev/muster/internal/referral"
)

// RegisterEvery is how often the authority re-registers with discovery
// for a configured discovery.register_every: the value, or 10 minutes when
// it is not set (<= 0). The discovery link and --check-config both ask
// here, so what check-config prints is what runs.
func RegisterEvery(configured time.Duration) time.Duration {
	if configured <= 0 {
		return defaultRegisterEvery
	}
	return configured
}

// KeysRefresh is how often every replica fetches discovery's ticket keys
// for a configured discovery.keys_refresh: the value, or a minute
// (referral.RefreshEvery) when it is not set (<= 0); as RegisterEvery,
// for the link and --check-config alike.
func KeysRefresh(configured time.Duration) time.Duration {
	if configured <= 0 {
		return referral.RefreshEvery
	}
	return configured
}

package authority

import "time"

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

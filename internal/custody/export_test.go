package custody

import "time"

// SetSelfTestCallTimeout makes d each self-test call's deadline until the
// returned function puts the default back.
func SetSelfTestCallTimeout(d time.Duration) (restore func()) {
	old := selfTestCallTimeout
	selfTestCallTimeout = d
	return func() { selfTestCallTimeout = old }
}

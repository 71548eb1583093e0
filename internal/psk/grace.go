package psk

import (
	"errors"
	"fmt"
	"time"
)

// The old PSK stays accepted for a grace period after a rotation, so agents
// can be given the new one; a month is long enough for any rollout and
// short enough that a leaked key does not linger.
const (
	DefaultGrace = 24 * time.Hour
	MaxGrace     = 30 * 24 * time.Hour
)

// CheckGrace returns an error if d is not an acceptable grace period for a
// rotation; 0 revokes the old PSK at once.
func CheckGrace(d time.Duration) error {
	switch {
	case d < 0:
		return errors.New("grace must not be negative (0 revokes the current PSK at once)")
	case d > MaxGrace:
		return fmt.Errorf("grace must be at most %s (30 days)", MaxGrace)
	}
	return nil
}

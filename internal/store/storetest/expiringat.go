package storetest

import "time"

// ExpiringAtCase is a certificate's issue time and lifetime.
type ExpiringAtCase struct {
	Issued   time.Time
	Lifetime time.Duration
}

// ExpiringAtCases are the boundaries of store.ExpiringAt's integer
// division, where the migrations' SQL and the Go each store computes it
// with must agree to the microsecond: lifetimes of 0 to 5 µs and of a day
// and 1 or 3 µs, an issue time finer than the stores keep, a not-after
// before the issue.
func ExpiringAtCases() []ExpiringAtCase {
	issued := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC).Add(123457 * time.Microsecond)
	return []ExpiringAtCase{
		{issued, 0},
		{issued, time.Microsecond},
		{issued, 2 * time.Microsecond},
		{issued, 3 * time.Microsecond},
		{issued, 4 * time.Microsecond},
		{issued, 5 * time.Microsecond},
		{issued, 24*time.Hour + time.Microsecond},
		{issued, 24*time.Hour + 3*time.Microsecond},
		{issued.Add(999 * time.Nanosecond), time.Hour + 2*time.Microsecond},
		{issued, -time.Microsecond},
		{issued, -5 * time.Microsecond},
	}
}

package jointoken

import (
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/muster-dev/muster/internal/spiffeid"
)

// DefaultTTL is the lifetime of a token created without one: a day is
// enough to provision a machine and short enough that a token left in a
// ticket or a shell history soon stops working.
const DefaultTTL = 24 * time.Hour

// MinTTL is the shortest lifetime a token may be given, as for the other
// lifetimes and timeouts the operator sets.
const MinTTL = time.Second

// Bounds of the operator-written fields of a token.
const (
	MaxDescription   = 256
	MaxLabels        = 32
	MaxLabelValueLen = 256
)

var labelKeyRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?$`)

// Spec is what an operator asks for when creating a join token.
type Spec struct {
	TTL         time.Duration // 0: never expires
	Uses        int64         // 0: unlimited until expiry
	Node        string        // the node the token is bound to, or ""
	Description string
	Labels      map[string]string
	// UnsafeUnlimited allows a token with neither expiry nor use limit.
	UnsafeUnlimited bool
}

// Unlimited reports whether the token never expires and has unlimited
// uses: allowed only with UnsafeUnlimited, and worth a warning.
func (s Spec) Unlimited() bool { return s.TTL == 0 && s.Uses == 0 }

// Check returns an error naming the first field that is not acceptable.
func (s Spec) Check() error {
	switch {
	case s.TTL < 0:
		return errors.New("ttl must not be negative (0 means never expires)")
	case s.TTL > 0 && s.TTL < MinTTL:
		// Expired at creation (or before its joining URI can be pasted),
		// the token could only mislead.
		return fmt.Errorf("ttl must be at least %s (0 means never expires), got %s", MinTTL, s.TTL)
	case s.Uses < 0:
		return errors.New("uses must not be negative (0 means unlimited until expiry)")
	case s.Unlimited() && !s.UnsafeUnlimited:
		return errors.New("a token that never expires and has unlimited uses admits anyone who ever sees it; set a ttl or uses, or pass --unsafe-unlimited")
	case len(s.Description) > MaxDescription:
		return fmt.Errorf("description must be at most %d characters", MaxDescription)
	case len(s.Labels) > MaxLabels:
		return fmt.Errorf("at most %d labels", MaxLabels)
	}
	if s.Node != "" {
		if err := spiffeid.NameError("node", "node", s.Node); err != nil {
			return err
		}
	}
	for k, v := range s.Labels {
		if !labelKeyRE.MatchString(k) || len(v) > MaxLabelValueLen {
			return fmt.Errorf("label %q: keys are 1-63 of a-z 0-9 . _ / -, values at most %d characters", k, MaxLabelValueLen)
		}
	}
	return nil
}

// Token states, as listed to operators.
const (
	StateActive  = "active"
	StateExpired = "expired"
	StateUsedUp  = "used_up"
)

// Refusals of a token that can no longer admit anyone.
var (
	ErrExpired = errors.New("join token expired")
	ErrUsedUp  = errors.New("join token has no uses left")
)

// Usage is a token's expiry and use count, as the store holds them.
type Usage struct {
	ExpiresAt   time.Time // zero: never expires
	UsesAllowed int64     // 0: unlimited until expiry
	UsesCount   int64
}

// Check returns ErrExpired or ErrUsedUp if the token cannot admit anyone
// at now, or nil. The store's conditional write applies the same rule by
// its own clock; this check lets a refusal say why before any write.
func (u Usage) Check(now time.Time) error {
	switch {
	case !u.ExpiresAt.IsZero() && !now.Before(u.ExpiresAt):
		return ErrExpired
	case u.UsesAllowed > 0 && u.UsesCount >= u.UsesAllowed:
		return ErrUsedUp
	}
	return nil
}

// State is the token's state at now.
func (u Usage) State(now time.Time) string {
	switch u.Check(now) {
	case ErrExpired:
		return StateExpired
	case ErrUsedUp:
		return StateUsedUp
	}
	return StateActive
}

package boundkeypair

import (
	"errors"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/spiffeid"
)

// Defaults of `muster bot add`.
const (
	DefaultRecoveryLimit  = 1
	DefaultRegisterWithin = time.Hour
	// MaxRecoveryLimit bounds the budget one apply can grant.
	MaxRecoveryLimit = 1 << 20
)

// Spec is the people-written part of a bound-keypair token (DESIGN.md's
// token.yaml spec).
type Spec struct {
	Name               string
	Node               string
	InitialPublicKey   string // authorized_keys; "" for registration with a secret
	MustRegisterBefore time.Time
	RecoveryLimit      int64
	RecoveryMode       string
	RotateAfter        time.Time
}

// Check returns an error naming the first field that is not acceptable,
// and the initial key in canonical form.
func (s Spec) Check() (PublicKey, error) {
	if err := spiffeid.NameError("metadata.name", "bound-keypair token", s.Name); err != nil {
		return PublicKey{}, err
	}
	// A name of a join token's form (ID.SECRET) would make a pasted join
	// token look like a token name, which the authority may audit or echo.
	if jointoken.LooksLike(s.Name) {
		return PublicKey{}, errors.New("metadata.name: has the form of a join token (ID.SECRET); choose another name")
	}
	if err := spiffeid.NameError("spec.node", "node", s.Node); err != nil {
		return PublicKey{}, err
	}
	switch {
	case !ValidMode(s.RecoveryMode):
		return PublicKey{}, errors.New("spec.bound_keypair.recovery.mode: want standard, relaxed or insecure")
	case s.RecoveryLimit < 0 || s.RecoveryLimit > MaxRecoveryLimit:
		return PublicKey{}, fmt.Errorf("spec.bound_keypair.recovery.limit: want 0 to %d", MaxRecoveryLimit)
	}
	if s.InitialPublicKey == "" {
		return PublicKey{}, nil
	}
	k, err := ParsePublicKey(s.InitialPublicKey)
	if err != nil {
		return PublicKey{}, fmt.Errorf("spec.bound_keypair.onboarding.initial_public_key: %w", err)
	}
	return k, nil
}

// Warning says why a spec weakens the method, or "": insecure mode skips
// the join state check, so a copied key recovers unnoticed.
func (s Spec) Warning() string {
	if s.RecoveryMode == ModeInsecure {
		return "recovery mode insecure skips the join state check: a copied key can recover without being detected"
	}
	return ""
}

package task

import (
	"crypto/ed25519"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/signer"
)

// Params of node.rotate_signing_key (seed "Signed Rotate Task Contract").
const (
	ParamNewSignerVersionID = "new_signer_version_id"
	ParamNewPublicKey       = "new_public_key"
	ParamEffectiveAt        = "effective_at"
	ParamGraceUntil         = "grace_until"
)

// RotateParams builds the params of a rotate task for a staged signer.
func RotateParams(versionID string, pub ed25519.PublicKey, effectiveAt, graceUntil time.Time) map[string]string {
	return map[string]string{
		ParamNewSignerVersionID: versionID,
		ParamNewPublicKey:       signer.EncodePublicKey(pub),
		ParamEffectiveAt:        effectiveAt.UTC().Format(time.RFC3339),
		ParamGraceUntil:         graceUntil.UTC().Format(time.RFC3339),
	}
}

// ActiveKeys says which signer the agent trusts as active now;
// *signer.Trust implements it.
type ActiveKeys interface {
	StateAt(versionID string, now time.Time) (signer.SetKey, signer.State, bool)
}

// ValidateRotate applies the rotate task's rules to a task that already
// passed Verify: signed by the signer the agent trusts as active (a staged
// or grace key may not introduce keys), exactly the four params, the new
// key an Ed25519 public key, effective_at at least minLead after the
// task's issue time, and grace_until after effective_at. It returns the
// staged key to store.
func ValidateRotate(env Envelope, keys ActiveKeys, minLead time.Duration, now time.Time) (signer.SetKey, error) {
	refuse := func(format string, a ...any) (signer.SetKey, error) {
		return signer.SetKey{}, &RefusalError{Reason: ReasonInvalidRotate, SignerVersionID: env.SignerVersionID, TaskID: env.TaskID, Detail: fmt.Sprintf(format, a...)}
	}
	if env.TaskType != TypeRotateSigningKey {
		return refuse("task type %s", env.TaskType)
	}
	if _, st, ok := keys.StateAt(env.SignerVersionID, now); !ok || st != signer.Active {
		return refuse("not signed by the active signer")
	}
	if len(env.Params) != 4 {
		return refuse("want exactly the params %s, %s, %s, %s", ParamNewSignerVersionID, ParamNewPublicKey, ParamEffectiveAt, ParamGraceUntil)
	}
	id := env.Params[ParamNewSignerVersionID]
	if signer.ValidVersionID(id) != nil {
		return refuse("%s is malformed", ParamNewSignerVersionID)
	}
	if id == env.SignerVersionID {
		return refuse("the new signer is the signing one")
	}
	if _, err := signer.ParsePublicKey(env.Params[ParamNewPublicKey]); err != nil {
		return refuse("%s is not an Ed25519 public key", ParamNewPublicKey)
	}
	eff, err := time.Parse(time.RFC3339, env.Params[ParamEffectiveAt])
	if err != nil {
		return refuse("%s is not RFC 3339", ParamEffectiveAt)
	}
	grace, err := time.Parse(time.RFC3339, env.Params[ParamGraceUntil])
	if err != nil {
		return refuse("%s is not RFC 3339", ParamGraceUntil)
	}
	if eff.Before(env.IssuedAt.Add(minLead)) {
		return refuse("%s is less than the lead time %s after the issue time", ParamEffectiveAt, minLead)
	}
	if !grace.After(eff) {
		return refuse("%s is not after %s", ParamGraceUntil, ParamEffectiveAt)
	}
	return signer.SetKey{
		VersionID: id, PublicKey: env.Params[ParamNewPublicKey], State: signer.Staged,
		PublishedAt: env.IssuedAt, EffectiveAt: eff, GraceUntil: grace, Previous: env.SignerVersionID,
	}, nil
}

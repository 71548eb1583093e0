package task

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/signer"
)

// Reason says why an agent refused a task. Reasons are reported to the
// authority and counted by signer version, so they are a closed set.
type Reason string

const (
	ReasonMalformed     Reason = "malformed"
	ReasonUnsigned      Reason = "unsigned"
	ReasonUnknownSigner Reason = "unknown_signer"
	ReasonBadSignature  Reason = "bad_signature"
	ReasonExpired       Reason = "expired"
	ReasonNotYetValid   Reason = "not_yet_valid"
	ReasonReplayed      Reason = "replayed"
	ReasonWindowFull    Reason = "replay_window_full"
	ReasonMistargeted   Reason = "mistargeted"
	ReasonInvalidRotate Reason = "invalid_rotate"
	// ReasonNoHandler: a custom task type the agent's configuration maps
	// to no handler.
	ReasonNoHandler Reason = "no_handler"
)

// RefusalError is a refused task: the reason, the signer version the task
// named (empty when it could not be read), and the task ID when known.
type RefusalError struct {
	Reason          Reason
	SignerVersionID string
	TaskID          string
	Detail          string
}

func (e *RefusalError) Error() string {
	s := fmt.Sprintf("task: refused (%s)", e.Reason)
	if e.TaskID != "" {
		s += " task " + e.TaskID
	}
	if e.SignerVersionID != "" {
		s += " signer " + e.SignerVersionID
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Keys is the agent's trust, as the verifier needs it; *signer.Trust
// implements it.
type Keys interface {
	// Verifier returns the key of versionID if its signatures are accepted
	// at now.
	Verifier(versionID string, now time.Time) (ed25519.PublicKey, signer.State, bool)
	// StaticKeys returns the transition list of MUSTER_TASK_SIGNING_PUBKEYS,
	// tried when the version is not known.
	StaticKeys() []ed25519.PublicKey
}

// Verifier is the agent's check of incoming tasks. Not safe for concurrent
// use (the window changes).
type Verifier struct {
	NodeID string
	Labels map[string]string
	Keys   Keys
	Window *Window
	Now    func() time.Time
}

// Verify decodes, checks and verifies one signed task, and remembers its ID
// so it runs once. Every refusal is a *RefusalError.
func (v *Verifier) Verify(data []byte) (Envelope, error) {
	env, doc, sig, err := decode(data)
	refuse := func(r Reason, detail string) (Envelope, error) {
		return Envelope{}, &RefusalError{Reason: r, SignerVersionID: env.SignerVersionID, TaskID: env.TaskID, Detail: detail}
	}
	if err != nil {
		if signer.ValidVersionID(env.SignerVersionID) != nil {
			env.SignerVersionID = ""
		}
		env.TaskID = ""
		return refuse(ReasonMalformed, err.Error())
	}
	if sig == nil {
		return refuse(ReasonUnsigned, "")
	}
	now := v.Now()
	pub, st, ok := v.Keys.Verifier(env.SignerVersionID, now)
	switch {
	case ok:
		if !verifySignature(pub, doc, sig) {
			return refuse(ReasonBadSignature, "")
		}
	case st != "":
		return refuse(ReasonUnknownSigner, fmt.Sprintf("signer is %s", st))
	default:
		if !verifyStatic(v.Keys.StaticKeys(), doc, sig) {
			return refuse(ReasonUnknownSigner, "")
		}
	}
	if now.After(env.ExpiresAt.Add(signer.Skew)) {
		return refuse(ReasonExpired, "")
	}
	if env.IssuedAt.After(now.Add(signer.Skew)) {
		return refuse(ReasonNotYetValid, "")
	}
	if !env.Target.Matches(v.NodeID, v.Labels) {
		return refuse(ReasonMistargeted, "")
	}
	switch err := v.Window.Remember(env.TaskID, env.ExpiresAt, now); {
	case errors.Is(err, ErrReplayed):
		return refuse(ReasonReplayed, "")
	case err != nil:
		return refuse(ReasonWindowFull, "")
	}
	return env, nil
}

// verifyStatic tries the transition list: it carries no version IDs, so
// any of its keys may have signed.
func verifyStatic(keys []ed25519.PublicKey, doc, sig []byte) bool {
	for _, k := range keys {
		if verifySignature(k, doc, sig) {
			return true
		}
	}
	return false
}

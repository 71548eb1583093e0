package agent

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/signer"
)

// Status is what `muster agent status` shows: the state, with the address
// renewals go to now and the certificate's own view, and what the agent
// can tell without asking anyone.
type Status struct {
	State
	SPIFFEID string `json:"spiffe_id"`
	Expired  bool   `json:"expired"`
	// RenewalPending is set while a renewal's key waits for its
	// certificate (the last attempt failed or was interrupted).
	RenewalPending bool `json:"renewal_pending"`
	// VerifierSetVersion is the version of the verifier set held (0:
	// none); AcceptedSigners the signer versions whose tasks are accepted
	// now, with their states; StaticVerifiers the number of keys of the
	// MUSTER_TASK_SIGNING_PUBKEYS transition list, when the agent runs on
	// one.
	VerifierSetVersion int64                   `json:"verifier_set_version"`
	AcceptedSigners    map[string]signer.State `json:"accepted_signers"`
	StaticVerifiers    int                     `json:"static_verifiers,omitempty"`
	// BoundKeyFingerprint is the fingerprint of keys/bound.key, the key
	// a bound-keypair agent proves: compared with muster token get's, it
	// says whether this machine holds the token's key (a
	// challenge_failed refusal says it does not).
	BoundKeyFingerprint string `json:"bound_key_fingerprint,omitempty"`
	// BoundKeyProblem is why keys/bound.key, which exists, gave no
	// fingerprint (it cannot be read, or is not an Ed25519 key), with its
	// path: the agent cannot prove the token's key until it is mended.
	BoundKeyProblem string `json:"bound_key_problem,omitempty"`
	// BoundKeyRotationPending is set while keys/bound.next.key exists: a
	// rotation the authority asked for whose result the agent has not
	// had (its next refresh or recovery completes it, or discards the key
	// the authority did not bind). BoundKeyNextFingerprint is that key's
	// fingerprint, BoundKeyNextProblem why it gave none.
	BoundKeyRotationPending bool   `json:"bound_key_rotation_pending,omitempty"`
	BoundKeyNextFingerprint string `json:"bound_key_next_fingerprint,omitempty"`
	BoundKeyNextProblem     string `json:"bound_key_next_problem,omitempty"`
}

// Status reads the identity without changing anything; ErrNoIdentity if
// the agent has not joined.
func (a *Agent) Status() (*Status, error) {
	st, id, err := a.load(false)
	if err != nil {
		return nil, err
	}
	leaf := id.Leaf()
	sid, _ := id.ID()
	_, pendErr := os.Stat(a.dir.PendingKeyFile())
	view := *st
	view.Authority, view.NotAfter, view.Serial = a.address(st), leaf.NotAfter.UTC(), serialOf(leaf)
	t, err := a.trustOf(st)
	if err != nil {
		return nil, err
	}
	// The join state document is what a bound-keypair recovery presents:
	// a status travels (a node.report task's result reaches the authority's
	// task store and audit trail), so it never carries it.
	view.VerifierSet, view.StagedVerifiers, view.JoinState = nil, nil, ""
	out := &Status{State: view, SPIFFEID: sid.String(), Expired: !a.now().Before(leaf.NotAfter),
		RenewalPending: pendErr == nil, VerifierSetVersion: t.Version(), AcceptedSigners: t.Accepted(a.now()),
		StaticVerifiers: len(t.StaticKeys())}
	if st.JoinMethod == JoinMethodBoundKeypair {
		fp, err := ed25519Fingerprint(a.dir.BoundKeyFile())
		switch {
		case err == nil:
			out.BoundKeyFingerprint = fp
		case !errors.Is(err, fs.ErrNotExist):
			out.BoundKeyProblem = err.Error()
		}
		fp, err = ed25519Fingerprint(a.dir.NextBoundKeyFile())
		switch {
		case err == nil:
			out.BoundKeyRotationPending, out.BoundKeyNextFingerprint = true, fp
		case !errors.Is(err, fs.ErrNotExist):
			out.BoundKeyRotationPending, out.BoundKeyNextProblem = true, err.Error()
		}
	}
	return out, nil
}

// ed25519Fingerprint is the fingerprint of the Ed25519 key in file.
func ed25519Fingerprint(file string) (string, error) {
	priv, err := loadEd25519(file)
	if err != nil {
		return "", err
	}
	pub, err := boundkeypair.NewPublicKey(priv.Public().(ed25519.PublicKey))
	if err != nil {
		return "", fmt.Errorf("%s: %w", file, err)
	}
	return pub.Fingerprint(), nil
}

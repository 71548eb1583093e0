package task

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/signer"
)

// TestValidateRotate breaks each rule of the rotate task once.
func TestValidateRotate(t *testing.T) {
	f := newFixture(t)
	lead := signer.DefaultMinLeadTime
	eff, grace := t0.Add(lead), t0.Add(lead+24*time.Hour)
	rotate := func(fn func(e *Envelope)) Envelope {
		e := envelope(TypeRotateSigningKey)
		e.Target = Target{All: true}
		e.Params = RotateParams("v4", f.ring.keys["v3"], eff, grace)
		fn(&e)
		return e
	}
	ok := rotate(func(*Envelope) {})
	k, err := ValidateRotate(ok, f.ring, lead, t0)
	if err != nil {
		t.Fatalf("valid rotate: %v", err)
	}
	if k.VersionID != "v4" || k.State != signer.Staged || !k.EffectiveAt.Equal(eff) || !k.GraceUntil.Equal(grace) || k.Previous != "v2" {
		t.Fatalf("staged key = %+v", k)
	}
	for name, fn := range map[string]func(*Envelope){
		"signed by the staged signer":    func(e *Envelope) { e.SignerVersionID = "v3" },
		"signed by the grace signer":     func(e *Envelope) { e.SignerVersionID = "v1" },
		"signed by an unknown signer":    func(e *Envelope) { e.SignerVersionID = "v9" },
		"not a rotate task":              func(e *Envelope) { e.TaskType = TypeReport },
		"effective inside the lead time": func(e *Envelope) { e.Params[ParamEffectiveAt] = eff.Add(-time.Second).Format(time.RFC3339) },
		"grace equal to effective":       func(e *Envelope) { e.Params[ParamGraceUntil] = e.Params[ParamEffectiveAt] },
		"grace before effective":         func(e *Envelope) { e.Params[ParamGraceUntil] = eff.Add(-time.Hour).Format(time.RFC3339) },
		"key not base64url":              func(e *Envelope) { e.Params[ParamNewPublicKey] = "not a key!" },
		"key of the wrong length":        func(e *Envelope) { e.Params[ParamNewPublicKey] = strings.Repeat("A", 42) },
		"key padded":                     func(e *Envelope) { e.Params[ParamNewPublicKey] += "=" },
		"malformed version ID":           func(e *Envelope) { e.Params[ParamNewSignerVersionID] = "V 4" },
		"new signer is the signing one":  func(e *Envelope) { e.Params[ParamNewSignerVersionID] = "v2" },
		"effective not RFC 3339":         func(e *Envelope) { e.Params[ParamEffectiveAt] = "tomorrow" },
		"grace not RFC 3339":             func(e *Envelope) { e.Params[ParamGraceUntil] = "later" },
		"missing param":                  func(e *Envelope) { delete(e.Params, ParamGraceUntil) },
		"extra param":                    func(e *Envelope) { e.Params["note"] = "x" },
		"misspelt param in place of one": func(e *Envelope) { delete(e.Params, ParamGraceUntil); e.Params["grace"] = grace.Format(time.RFC3339) },
		"lead measured from issue time":  func(e *Envelope) { e.IssuedAt = t0.Add(time.Minute) },
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ValidateRotate(rotate(fn), f.ring, lead, t0)
			var re *RefusalError
			if !errors.As(err, &re) || re.Reason != ReasonInvalidRotate {
				t.Fatalf("ValidateRotate = %v, want invalid_rotate", err)
			}
		})
	}
}

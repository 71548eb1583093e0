package e2e

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type pskOut struct {
	ID             string     `json:"id"`
	PSK            string     `json:"psk"`
	CreatedAt      time.Time  `json:"created_at"`
	GraceExpiresAt *time.Time `json:"grace_expires_at"`
}

type pskShow struct {
	Active *pskOut `json:"active"`
	Grace  *pskOut `json:"grace"`
}

type pskRotate struct {
	Active       *pskOut `json:"active"`
	Previous     *pskOut `json:"previous"`
	RevokedGrace *pskOut `json:"revoked_grace"`
}

func showPSKs(t *testing.T, dir string) pskShow {
	t.Helper()
	var s pskShow
	out := mustRun(t, "psk", "show", "--data", dir, "-o", "json")
	if err := json.Unmarshal([]byte(out), &s); err != nil || s.Active == nil {
		t.Fatalf("psk show -o json printed %q: %v", out, err)
	}
	return s
}

func rotatePSK(t *testing.T, dir string, args ...string) pskRotate {
	t.Helper()
	var r pskRotate
	out := mustRun(t, append([]string{"psk", "rotate", "--data", dir, "-o", "json"}, args...)...)
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Active == nil || r.Previous == nil {
		t.Fatalf("psk rotate -o json printed %q: %v", out, err)
	}
	return r
}

func TestPSKShowAndRotate(t *testing.T) {
	t.Parallel()
	dir, init := initDir(t)
	startAuthority(t, dir)
	initPSK := init["bootstrap_psk"].(string)

	s := showPSKs(t, dir)
	if s.Active.PSK != initPSK || s.Grace != nil {
		t.Fatalf("psk show after init = %+v, want the init PSK %s and no grace", s, initPSK)
	}
	text := mustRun(t, "psk", "show", "--data", dir)
	if !strings.Contains(text, initPSK) || !strings.Contains(text, "No PSK in grace") {
		t.Errorf("psk show printed %q, want the init PSK and no grace", text)
	}

	before := time.Now()
	r := rotatePSK(t, dir, "--grace", "2h")
	if !strings.HasPrefix(r.Active.PSK, "muster-psk:") || r.Active.PSK == initPSK {
		t.Errorf("rotate made PSK %q, want a fresh muster-psk:", r.Active.PSK)
	}
	if r.Previous.ID != s.Active.ID || r.Previous.PSK != "" || r.Previous.GraceExpiresAt == nil {
		t.Fatalf("rotate previous = %+v, want %s in grace without its value", r.Previous, s.Active.ID)
	}
	if e := *r.Previous.GraceExpiresAt; e.Before(before.Add(2*time.Hour-time.Minute)) || e.After(time.Now().Add(2*time.Hour+time.Minute)) {
		t.Errorf("grace expiry %v, want about 2h from now", e)
	}
	s2 := showPSKs(t, dir)
	if s2.Active.PSK != r.Active.PSK || s2.Active.ID != r.Active.ID {
		t.Errorf("psk show active = %+v, want the rotated %+v", s2.Active, r.Active)
	}
	if s2.Grace == nil || s2.Grace.PSK != initPSK || s2.Grace.ID != s.Active.ID ||
		!s2.Grace.GraceExpiresAt.Equal(*r.Previous.GraceExpiresAt) {
		t.Errorf("psk show grace = %+v, want the init PSK until %v", s2.Grace, r.Previous.GraceExpiresAt)
	}

	// A second rotation while the init PSK is in grace would revoke it:
	// refused, naming it and the way out, unless told to.
	if line := mustFail(t, "psk", "rotate", "--data", dir); !strings.Contains(line, "FAILED_PRECONDITION") ||
		!strings.Contains(line, s.Active.ID) || !strings.Contains(line, "muster psk rotate --grace 24h --revoke-grace") {
		t.Errorf("rotate with %s in grace: %q, want FAILED_PRECONDITION naming it and --revoke-grace", s.Active.ID, line)
	}
	if s := showPSKs(t, dir); s.Active.ID != r.Active.ID || s.Grace == nil || s.Grace.ID != s2.Grace.ID {
		t.Errorf("after a refused rotation show = %+v, want it unchanged", s)
	}
	// The text form names the grace PSK it revoked and reminds the
	// operator to update the agents.
	out := mustRun(t, "psk", "rotate", "--data", dir, "--revoke-grace")
	if !strings.Contains(out, "muster-psk:") || !strings.Contains(out, "accepted until") || !strings.Contains(out, "Update the agents") ||
		!strings.Contains(out, "Grace PSK:    "+s.Active.ID+", revoked now") {
		t.Errorf("psk rotate --revoke-grace printed %q, want the PSK, the grace expiry, the revoked %s and a reminder", out, s.Active.ID)
	}
	s3 := showPSKs(t, dir)
	if s3.Grace == nil || s3.Grace.ID != r.Active.ID {
		t.Errorf("after a second rotation grace = %+v, want %s (the first rotation's PSK)", s3.Grace, r.Active.ID)
	}

	r0 := rotatePSK(t, dir, "--grace", "0", "--revoke-grace")
	if r0.Previous.GraceExpiresAt != nil {
		t.Errorf("rotate --grace 0 previous = %+v, want it revoked", r0.Previous)
	}
	if r0.RevokedGrace == nil || r0.RevokedGrace.ID != r.Active.ID || r0.RevokedGrace.PSK != "" {
		t.Errorf("rotate --grace 0 --revoke-grace revoked_grace = %+v, want %s without its value", r0.RevokedGrace, r.Active.ID)
	}
	s4 := showPSKs(t, dir)
	if s4.Grace != nil || s4.Active.PSK != r0.Active.PSK {
		t.Errorf("after rotate --grace 0 show = %+v, want only the new PSK", s4)
	}

	for _, bad := range []string{"-1h", "721h"} {
		if line := mustFail(t, "psk", "rotate", "--data", dir, "--grace", bad); !strings.Contains(line, "INVALID_ARGUMENT") {
			t.Errorf("rotate --grace %s: %q, want INVALID_ARGUMENT", bad, line)
		}
	}
	if showPSKs(t, dir).Active.ID != r0.Active.ID {
		t.Error("a refused rotation changed the active PSK")
	}

	// Every PSK this test saw stays encrypted at rest, WAL included.
	secrets := []string{initPSK, r.Active.PSK, s3.Active.PSK, r0.Active.PSK}
	files, _ := filepath.Glob(filepath.Join(dir, "muster.db*"))
	if len(files) == 0 {
		t.Fatal("no muster.db in the data directory")
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, sec := range secrets {
			h := strings.TrimPrefix(sec, "muster-psk:")
			raw, _ := hex.DecodeString(h)
			if bytes.Contains(data, []byte(h)) || bytes.Contains(data, raw) {
				t.Errorf("%s holds PSK %s in plaintext", f, sec[:16])
			}
		}
	}

	// Rotations and reads are audited by PSK ID, never by value.
	var recs []map[string]any
	json.Unmarshal([]byte(mustRun(t, "audit", "list", "--data", dir, "-o", "json", "--action", "psk.*")), &recs)
	counts := map[string]int{}
	for _, rec := range recs {
		counts[rec["action"].(string)+"/"+rec["result"].(string)]++
		b, _ := json.Marshal(rec)
		for _, sec := range secrets {
			if strings.Contains(string(b), strings.TrimPrefix(sec, "muster-psk:")) {
				t.Errorf("audit record %s holds a PSK value", b)
			}
		}
		if rec["action"] == "psk.rotate" && rec["result"] == "ok" && !strings.Contains(rec["target"].(string), "psk-") {
			t.Errorf("psk.rotate record %v does not name the PSK IDs", rec)
		}
	}
	if counts["psk.rotate/ok"] != 3 || counts["psk.rotate/denied"] != 3 || counts["psk.show/ok"] < 5 {
		t.Errorf("audit psk.* records = %v, want 3 rotations, 3 refused, at least 5 reads", counts)
	}
	for _, rec := range recs {
		if rec["action"] == "psk.rotate" && rec["result"] == "ok" && strings.Contains(rec["target"].(string), r.Active.ID) {
			return
		}
	}
	t.Errorf("no psk.rotate record names %s: %v", r.Active.ID, recs)
}

// A grace PSK whose grace has ended is revoked by the next read, whether or
// not the cleaner has run, and the revocation is audited.
func TestPSKGraceEndsLazily(t *testing.T) {
	t.Parallel()
	dir, init := initDir(t)
	startAuthority(t, dir)
	r := rotatePSK(t, dir, "--grace", "1s")
	if r.Previous.GraceExpiresAt == nil {
		t.Fatalf("rotate --grace 1s previous = %+v, want a grace expiry", r.Previous)
	}
	time.Sleep(time.Until(*r.Previous.GraceExpiresAt) + 100*time.Millisecond)
	if s := showPSKs(t, dir); s.Grace != nil {
		t.Errorf("psk show after the grace ended = %+v, want no grace PSK", s)
	}
	out := mustRun(t, "audit", "list", "--data", dir, "-o", "json", "--action", "psk.expire")
	if !strings.Contains(out, r.Previous.ID) || strings.Contains(out, strings.TrimPrefix(init["bootstrap_psk"].(string), "muster-psk:")) {
		t.Errorf("psk.expire audit = %s, want it to name %s and not the PSK", out, r.Previous.ID)
	}
}

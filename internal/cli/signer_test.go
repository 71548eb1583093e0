package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

func TestPrintSigners(t *testing.T) {
	at := time.Date(2026, 3, 9, 12, 0, 0, 0, time.UTC)
	var b bytes.Buffer
	printSigners(&b, signersOf([]*musterv1.Signer{
		{VersionId: "v1", State: "grace", PublicKey: "AAAA", PublishedAt: timestamppb.New(at), RetiresAt: timestamppb.New(at.Add(time.Hour))},
		{VersionId: "v2", State: "active", PublicKey: "BBBB", PublishedAt: timestamppb.New(at), Previous: "v1", KeyCustody: "sealed"},
		{VersionId: "v0", State: "retired", PublicKey: "CCCC", PublishedAt: timestamppb.New(at), KeyCustody: "destroyed"},
		{VersionId: "v3", State: "revoked", PublicKey: "DDDD", PublishedAt: timestamppb.New(at), KeyCustody: "pkcs11:token=t;object=muster-signer%2Fv3"},
	}))
	want := `VERSION  STATE    PUBLISHED             EFFECTIVE  GRACE UNTIL  RETIRES               ENDED  PREVIOUS  PUBLIC KEY  KEY CUSTODY
v1       grace    2026-03-09T12:00:00Z  -          -            2026-03-09T13:00:00Z  -      -         AAAA        -
v2       active   2026-03-09T12:00:00Z  -          -            -                     -      v1        BBBB        sealed
v0       retired  2026-03-09T12:00:00Z  -          -            -                     -      -         CCCC        destroyed
v3       revoked  2026-03-09T12:00:00Z  -          -            -                     -      -         DDDD        destroy pending: pkcs11:token=t;object=muster-signer%2Fv3
`
	if b.String() != want {
		t.Errorf("printed:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestSignerMinLeadTime(t *testing.T) {
	for in, want := range map[string]time.Duration{"": 0, "10m": 10 * time.Minute, "1m": time.Minute} {
		if got, err := signerMinLeadTime(in); err != nil || got != want {
			t.Errorf("%q: %v, %v", in, got, err)
		}
	}
	for _, in := range []string{"30s", "8d", "169h", "soon", "-10m"} {
		if _, err := signerMinLeadTime(in); err == nil || !strings.Contains(err.Error(), "signer.min_lead_time") {
			t.Errorf("%q accepted: %v", in, err)
		}
	}
}

// TestStageGraceUnderASecondIsRefusedHere: signer stage --grace and ca
// migrate-custody --signer-grace under 1s are refused before anything is
// asked or written, naming the minimum and the flag; they used to reach the
// authority, which staged a signer whose rotate task agents refuse.
func TestStageGraceUnderASecondIsRefusedHere(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"signer", "stage", "--grace", "500ms", "--authority", "127.0.0.1:1", "--identity", dir + "/none.pem"},
		{"signer", "stage", "--grace", "999ms", "--data", dir},
		{"ca", "migrate-custody", "--data", dir, "--custody", "pkcs11:token=muster", "--signer-grace", "500ms"},
	} {
		code, _, stderr := runCLI(t, args...)
		flag := args[2]
		if args[0] == "ca" {
			flag = "--signer-grace"
		}
		if code == 0 || !strings.Contains(stderr, flag+" ") || !strings.Contains(stderr, "at least 1s") || !strings.Contains(stderr, flag+" 24h") ||
			strings.Contains(stderr, "reach") || strings.Contains(stderr, "not an initialised") {
			t.Errorf("muster %s: exit %d, stderr %q; want the 1s minimum and %s, before anything else", strings.Join(args, " "), code, stderr, flag)
		}
	}
}

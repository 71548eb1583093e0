package discovery

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
)

func validReport(h *ca.Hierarchy) JoinReport {
	return JoinReport{
		AuthorityID: ca.AuthorityID("prod", h.Fingerprint()),
		NodeID:      "web-1",
		InstanceID:  "4f1c2a6e-8d3b-4a57-9c1e-2b7d5f9a0c34",
		TicketID:    "6f9b1f0a5c2d4e8f9a0b1c2d3e4f5a6b",
		JoinedAt:    time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC),
	}
}

func TestJoinReportDocument(t *testing.T) {
	r := JoinReport{AuthorityID: "prod-a3f2e1", NodeID: "web-1", InstanceID: "i-1", TicketID: "t-1",
		JoinedAt: time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("CET", 3600))}
	got, err := r.Document()
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"authority_id":"prod-a3f2e1","instance_id":"i-1","joined_at":"2026-01-02T02:04:05.000000006Z","node_id":"web-1","ticket_id":"t-1","type":"muster-join-report"}`
	if string(got) != want {
		t.Errorf("Document() =\n%s\nwant\n%s", got, want)
	}
}

func TestJoinReportRoundTrip(t *testing.T) {
	h, _ := testHierarchies(t)
	r := validReport(h)
	sig, err := r.Sign(h.Issuer(ca.RolePolicy).Key)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Verify(h.Issuer(ca.RolePolicy).Cert, sig); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	// A join without a ticket (a PSK-only join during a migration) has
	// none to name.
	r.TicketID = ""
	if sig, err = r.Sign(h.Issuer(ca.RolePolicy).Key); err != nil {
		t.Fatal(err)
	}
	if err := r.Verify(h.Issuer(ca.RolePolicy).Cert, sig); err != nil {
		t.Fatalf("Verify without a ticket ID: %v", err)
	}
}

func TestJoinReportVerifyRefuses(t *testing.T) {
	h, other := testHierarchies(t)
	reg := validRegistration(t, h)
	_, regSig, err := reg.Sign(h.Issuer(ca.RolePolicy).Key)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		before  func(r *JoinReport) // before signing
		after   func(r *JoinReport) // after signing
		other   bool                // verify with the other hierarchy's policy certificate
		sig     []byte
		wantErr error
		wantMsg string
	}{
		{name: "authority ID changed", after: func(r *JoinReport) { r.AuthorityID = "prod-000000" }, wantErr: ErrSignature},
		{name: "node ID changed", after: func(r *JoinReport) { r.NodeID = "web-2" }, wantErr: ErrSignature},
		{name: "instance ID changed", after: func(r *JoinReport) { r.InstanceID += "0" }, wantErr: ErrSignature},
		{name: "ticket ID changed", after: func(r *JoinReport) { r.TicketID = "other" }, wantErr: ErrSignature},
		{name: "ticket ID dropped", after: func(r *JoinReport) { r.TicketID = "" }, wantErr: ErrSignature},
		{name: "joined a nanosecond later", after: func(r *JoinReport) { r.JoinedAt = r.JoinedAt.Add(time.Nanosecond) }, wantErr: ErrSignature},
		{name: "joined a day later", after: func(r *JoinReport) { r.JoinedAt = r.JoinedAt.Add(24 * time.Hour) }, wantErr: ErrSignature},
		{name: "registration signature", sig: regSig, wantErr: ErrSignature},
		{name: "no signature", sig: []byte{}, wantErr: ErrSignature},
		{name: "signed by another authority", other: true, wantErr: ErrSignature},

		{name: "no instance ID", before: func(r *JoinReport) { r.InstanceID = "" }, wantMsg: "instance_id is required"},
		{name: "instance ID too long", before: func(r *JoinReport) { r.InstanceID = strings.Repeat("i", 65) }, wantMsg: "instance_id"},
		{name: "ticket ID too long", before: func(r *JoinReport) { r.TicketID = strings.Repeat("t", 129) }, wantMsg: "ticket_id at most 128"},
		{name: "instance ID not UTF-8", before: func(r *JoinReport) { r.InstanceID = "i-\xff" }, wantMsg: "not valid UTF-8"},
		{name: "ticket ID not UTF-8", before: func(r *JoinReport) { r.TicketID = "t-\xfe" }, wantMsg: "not valid UTF-8"},
		{name: "no joined_at", before: func(r *JoinReport) { r.JoinedAt = time.Time{} }, wantMsg: "joined_at is required"},
		{name: "bad node ID", before: func(r *JoinReport) { r.NodeID = "Web_1" }, wantMsg: "node ID"},
		{name: "no node ID", before: func(r *JoinReport) { r.NodeID = "" }, wantMsg: "node ID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := validReport(h)
			if tc.before != nil {
				tc.before(&r)
			}
			sig := tc.sig
			if sig == nil {
				// Sign does not check the fields: the refusal must come
				// from Verify.
				var err error
				if sig, err = r.Sign(h.Issuer(ca.RolePolicy).Key); err != nil && !strings.Contains(err.Error(), tc.wantMsg) {
					t.Fatal(err)
				}
			}
			if tc.after != nil {
				tc.after(&r)
			}
			cert := h.Issuer(ca.RolePolicy).Cert
			if tc.other {
				cert = other.Issuer(ca.RolePolicy).Cert
			}
			err := r.Verify(cert, sig)
			if err == nil {
				t.Fatal("Verify succeeded")
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("Verify = %v, want %v", err, tc.wantErr)
			}
			if tc.wantErr == nil && !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("Verify = %q, want it to contain %q", err, tc.wantMsg)
			}
			if !strings.HasPrefix(err.Error(), "discovery: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
	t.Run("certificate that is not ECDSA P-256", func(t *testing.T) {
		r := validReport(h)
		sig, err := r.Sign(h.Issuer(ca.RolePolicy).Key)
		if err != nil {
			t.Fatal(err)
		}
		cert := *h.Issuer(ca.RolePolicy).Cert
		cert.PublicKey = nil
		if err := r.Verify(&cert, sig); err == nil || errors.Is(err, ErrSignature) {
			t.Errorf("Verify = %v, want a refusal of the key type", err)
		}
	})
}

func TestJoinReportTimesSignTheSame(t *testing.T) {
	h, _ := testHierarchies(t)
	now := time.Now() // carries a monotonic clock reading
	utc := now.UTC().Round(0)
	for _, tc := range []struct {
		name string
		at   time.Time
	}{
		{"UTC without monotonic reading", utc},
		{"local with monotonic reading", now},
		{"local without monotonic reading", now.Round(0)},
		{"fixed zone east", now.In(time.FixedZone("UTC+5:30", 5*3600+1800))},
		{"fixed zone west", now.In(time.FixedZone("UTC-8", -8*3600))},
		{"named zone", now.In(mustLocation(t, "America/New_York"))},
		{"from Unix nanoseconds", time.Unix(0, now.UnixNano())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := validReport(h)
			r.JoinedAt = utc
			want, err := r.Document()
			if err != nil {
				t.Fatal(err)
			}
			sig, err := r.Sign(h.Issuer(ca.RolePolicy).Key)
			if err != nil {
				t.Fatal(err)
			}
			r.JoinedAt = tc.at
			got, err := r.Document()
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("Document() =\n%s\nwant\n%s", got, want)
			}
			if err := r.Verify(h.Issuer(ca.RolePolicy).Cert, sig); err != nil {
				t.Errorf("Verify: %v", err)
			}
		})
	}
}

func mustLocation(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Skipf("no time zone data: %v", err)
	}
	return loc
}

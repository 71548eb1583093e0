package discovery

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Fingerprints whose IDs are prod-a3f2e1 and prod-b4c5d6; fpA2 gives the
// same ID as fpA, as a ground key would.
var (
	fpA  = "sha256:a3f2e1" + strings.Repeat("0", 58)
	fpA2 = "sha256:a3f2e1" + strings.Repeat("f", 58)
	fpB  = "sha256:b4c5d6" + strings.Repeat("1", 58)
)

func TestParseAllowEntry(t *testing.T) {
	tests := []struct {
		in      string
		want    AllowEntry
		wantErr string
	}{
		{in: "prod-a3f2e1=" + fpA, want: AllowEntry{"prod-a3f2e1", fpA}},
		{in: "prod-a3f2e1=" + strings.ToUpper(fpA[:7]) + strings.ToUpper(fpA[7:]), wantErr: "sha256:"},
		{in: "prod-a3f2e1=sha256:" + strings.ToUpper(fpA[7:]), want: AllowEntry{"prod-a3f2e1", fpA}},
		{in: "web-eu-1-b4c5d6=" + fpB, want: AllowEntry{"web-eu-1-b4c5d6", fpB}},
		{in: "prod-a3f2e1", wantErr: "want AUTHORITY_ID=sha256:HEX"},
		{in: "prod-a3f2e1:" + fpA, wantErr: "want AUTHORITY_ID=sha256:HEX"},
		{in: "=" + fpA, wantErr: "NAME-HEX6"},
		{in: "prod-a3f2e1=", wantErr: "64 hex digits"},
		{in: "prod-a3f2e1=" + fpA[7:], wantErr: "64 hex digits"},
		{in: "prod-a3f2e1=" + fpA + "0", wantErr: "64 hex digits"},
		{in: "prod-a3f2e1=sha256:" + strings.Repeat("g", 64), wantErr: "64 hex digits"},
		{in: "prod-A3F2E1=" + fpA, wantErr: "NAME-HEX6"},
		{in: "Prod-a3f2e1=" + fpA, wantErr: "NAME-HEX6"},
		{in: "prod-a3f2e=" + fpA, wantErr: "NAME-HEX6"},
		{in: "prod-a3f2e1 =" + fpA, wantErr: "NAME-HEX6"},
		{in: "prod-a3f2e1= " + fpA, wantErr: "64 hex digits"},
		{in: "prod-a3f2e1=" + fpB, wantErr: "is not its root's (the ID would be prod-b4c5d6)"},
		{in: "prod-a3f2e1=" + fpA + "=x", wantErr: "64 hex digits"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseAllowEntry(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseAllowEntry = %v, %v; want an error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseAllowEntry (-want +got):\n%s", diff)
			}
			if got.String() != tt.want.AuthorityID+"="+tt.want.Fingerprint {
				t.Errorf("String() = %q", got.String())
			}
		})
	}
}

func TestNewAllowlist(t *testing.T) {
	a, err := NewAllowlist([]AllowEntry{{"prod-b4c5d6", fpB}, {"prod-a3f2e1", fpA}, {"prod-a3f2e1", "sha256:" + strings.ToUpper(fpA[7:])}}, false)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]AllowEntry{{"prod-a3f2e1", fpA}, {"prod-b4c5d6", fpB}}, a.Entries()); diff != "" {
		t.Errorf("Entries (-want +got):\n%s", diff)
	}
	if a.Open() {
		t.Error("Open() = true")
	}
	if _, err := NewAllowlist([]AllowEntry{{"prod-a3f2e1", fpA}, {"prod-a3f2e1", fpA2}}, false); err == nil || !strings.Contains(err.Error(), "allowed twice") {
		t.Errorf("one ID with two roots: %v", err)
	}
	if _, err := NewAllowlist([]AllowEntry{{"prod-a3f2e1", "sha256:00"}}, true); err == nil {
		t.Error("a malformed entry was accepted")
	}
	var none *Allowlist
	if none.Open() || none.Entries() != nil {
		t.Error("a nil list is open or has entries")
	}
}

func TestAllowlistCheck(t *testing.T) {
	listed := []AllowEntry{{"prod-a3f2e1", fpA}}
	closed, _ := NewAllowlist(listed, false)
	open, _ := NewAllowlist(listed, true)
	empty, _ := NewAllowlist(nil, false)
	tests := []struct {
		name string
		list *Allowlist
		id   string
		fp   string
		// want is the refusal, nil if accepted.
		want *NotAllowedError
	}{
		{name: "listed with its root", list: closed, id: "prod-a3f2e1", fp: fpA},
		{name: "listed, a ground look-alike root", list: closed, id: "prod-a3f2e1", fp: fpA2,
			want: &NotAllowedError{AuthorityID: "prod-a3f2e1", Fingerprint: fpA2, Allowed: fpA}},
		{name: "not listed", list: closed, id: "prod-b4c5d6", fp: fpB,
			want: &NotAllowedError{AuthorityID: "prod-b4c5d6", Fingerprint: fpB}},
		{name: "empty list", list: empty, id: "prod-a3f2e1", fp: fpA,
			want: &NotAllowedError{AuthorityID: "prod-a3f2e1", Fingerprint: fpA}},
		{name: "nil list", list: nil, id: "prod-a3f2e1", fp: fpA,
			want: &NotAllowedError{AuthorityID: "prod-a3f2e1", Fingerprint: fpA}},
		{name: "open, not listed", list: open, id: "prod-b4c5d6", fp: fpB},
		{name: "open, listed with its root", list: open, id: "prod-a3f2e1", fp: fpA},
		{name: "open, listed, another root", list: open, id: "prod-a3f2e1", fp: fpA2,
			want: &NotAllowedError{AuthorityID: "prod-a3f2e1", Fingerprint: fpA2, Allowed: fpA}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.list.Check(tt.id, tt.fp)
			idErr := tt.list.CheckID(tt.id)
			if tt.want == nil {
				if err != nil || idErr != nil {
					t.Fatalf("Check = %v, CheckID = %v; want both nil", err, idErr)
				}
				return
			}
			var got *NotAllowedError
			if !errors.As(err, &got) || !errors.Is(err, ErrNotAllowed) {
				t.Fatalf("Check = %v, want a *NotAllowedError", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Check (-want +got):\n%s", diff)
			}
			// CheckID refuses exactly the unlisted IDs, without a root.
			if (idErr == nil) != (tt.want.Allowed != "") {
				t.Errorf("CheckID = %v", idErr)
			}
			for _, s := range []string{tt.id, tt.want.Allowed} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("message %q does not name %q", err, s)
				}
			}
		})
	}
}

func FuzzParseAllowEntry(f *testing.F) {
	f.Add("prod-a3f2e1=" + fpA)
	f.Add("prod-a3f2e1=sha256:" + strings.ToUpper(fpA[7:]))
	f.Add("prod-a3f2e1=" + fpB)
	f.Add("a-000000=sha256:" + strings.Repeat("0", 64))
	f.Add("prod-a3f2e1")
	f.Add("=")
	f.Add("-=sha256:")
	f.Add("prod-a3f2e1=" + fpA + "=" + fpA)
	f.Add("prod-\xff\xfe\xfd=" + fpA)
	f.Fuzz(func(t *testing.T, s string) {
		e, err := ParseAllowEntry(s)
		if err != nil {
			return
		}
		// What parses is canonical: printing it and parsing again gives
		// the same entry, and it is an entry Check accepts.
		again, err := ParseAllowEntry(e.String())
		if err != nil || again != e {
			t.Fatalf("ParseAllowEntry(%q) = %v; again: %v, %v", s, e, again, err)
		}
		if ValidAuthorityID(e.AuthorityID) != nil || CheckAuthorityID(e.AuthorityID, e.Fingerprint) != nil || strings.ToLower(e.Fingerprint) != e.Fingerprint {
			t.Fatalf("ParseAllowEntry(%q) = %v, not a valid entry", s, e)
		}
		l, err := NewAllowlist([]AllowEntry{e}, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Check(e.AuthorityID, e.Fingerprint); err != nil {
			t.Fatalf("Check of the entry itself: %v", err)
		}
	})
}

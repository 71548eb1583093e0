package discovery

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
)

// FuzzJoinReportVerify: a join report as an authority sends it. Only a
// report with valid fields and the policy key's signature over exactly
// those fields verifies.
func FuzzJoinReportVerify(f *testing.F) {
	h, _ := testHierarchies(f)
	good := validReport(h)
	sig, err := good.Sign(h.Issuer(ca.RolePolicy).Key)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good.NodeID, good.InstanceID, good.TicketID, good.JoinedAt.UnixNano(), sig)
	f.Add("../x", "i", "", int64(0), sig)
	f.Add("web-1", "", "t", int64(1), []byte{})
	f.Fuzz(func(t *testing.T, node, instance, ticket string, joined int64, s []byte) {
		r := JoinReport{AuthorityID: good.AuthorityID, NodeID: node, InstanceID: instance, TicketID: ticket,
			JoinedAt: time.Unix(0, joined).UTC()}
		if err := r.Verify(h.Issuer(ca.RolePolicy).Cert, s); err != nil {
			return
		}
		doc, _ := r.Document()
		want, _ := good.Document()
		if string(doc) != string(want) {
			t.Fatalf("a report other than the signed one verified: %s", doc)
		}
	})
}

// FuzzParseStored: a registration document as a store holds it (the store
// is trusted with what discovery verified, but its structure is checked
// again).
func FuzzParseStored(f *testing.F) {
	h, _ := testHierarchies(f)
	r := validRegistration(f, h)
	v, err := r.Verify(signRegistration(f, r, h.Issuer(ca.RolePolicy).Key))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(v.Document)
	f.Add([]byte(`{"type":"muster-registration"}`))
	f.Add([]byte(`{"type":"muster-registration","ca_bundle_pem":"-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n"}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		got, err := ParseStored(doc)
		if err != nil {
			return
		}
		if got.Root == nil || got.PolicyCert == nil || got.Fingerprint != ca.Fingerprint(got.Root) {
			t.Fatalf("accepted a registration without its root or policy certificate")
		}
		if _, err := json.Marshal(got.Registration); err != nil {
			t.Fatal(err)
		}
		if err := CheckAuthorityID(got.AuthorityID, got.Fingerprint); err != nil {
			t.Fatalf("accepted a registration whose authority ID does not match its root: %v", err)
		}
	})
}

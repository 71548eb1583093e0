package ca

import (
	"bytes"
	"crypto/x509"
	"math/big"
	"net/url"
	"testing"
	"time"
)

func TestNewIntermediateSucceedsTheFirst(t *testing.T) {
	now := time.Now()
	h, err := Create("live", now)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := newKey()
	if _, err := h.NewIntermediate(RoleAgent, big.NewInt(7), key.Public(), nil, now, time.Hour); err == nil {
		t.Fatal("NewIntermediate without the root key succeeded")
	}
	if _, err := h.NewIntermediate(RolePolicy, big.NewInt(7), key.Public(), h.RootKey, now, time.Hour); err == nil {
		t.Fatal("NewIntermediate of the policy certificate succeeded")
	}
	next, err := h.NewIntermediate(RoleAgent, big.NewInt(7), key.Public(), h.RootKey, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	old := h.Issuer(RoleAgent)
	if !bytes.Equal(next.RawSubject, old.Cert.RawSubject) || bytes.Equal(next.SubjectKeyId, old.Cert.SubjectKeyId) {
		t.Fatal("the successor must keep the subject and have its own key identifier")
	}
	if got := next.NotAfter.Sub(now); got < time.Hour-time.Second || got > time.Hour+time.Second {
		t.Fatalf("successor lives %v, want 1h", got)
	}

	// Until set, the files' issuer signs; once set, the active one does,
	// and both are accepted.
	h.SetIntermediates(&Intermediates{Active: map[Role]*Issuer{RoleAgent: {Cert: next, Key: key}},
		Bundle: map[Role][]*x509.Certificate{RoleAgent: {next, old.Cert}}})
	id, _ := url.Parse("spiffe://td/agent/n1")
	leafKey, _ := newKey()
	leaf, err := h.Issuer(RoleAgent).Issue(LeafRequest{PublicKey: leafKey.Public(), SPIFFEID: id, CommonName: "n1",
		ClientAuth: true, NotBefore: now, TTL: 2 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if leaf.CheckSignatureFrom(next) != nil {
		t.Fatal("the leaf is not signed by the active successor")
	}
	if !leaf.NotAfter.Equal(next.NotAfter) {
		t.Errorf("leaf not after %v, want cut at its issuer's %v", leaf.NotAfter, next.NotAfter)
	}
	inter := x509.NewCertPool()
	for _, c := range h.Accepted(RoleAgent) {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: h.RootPool(), Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("the leaf does not verify through the accepted intermediates: %v", err)
	}
	if len(h.Accepted(RoleAgent)) != 2 || h.Issuer(RoleServer) != h.Issuers[RoleServer] {
		t.Fatal("Accepted or the fallback to the files' issuer is wrong")
	}
}

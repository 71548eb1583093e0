package ca

import (
	"bytes"
	"crypto/rand"
	"encoding/pem"
	"testing"
	"time"
)

// AppendCertPEM writes what encoding/pem writes, for every length around
// the line breaks, at CertPEMLen's size and after what dst holds.
func TestAppendCertPEMIsEncodingPEM(t *testing.T) {
	for n := 0; n <= 400; n++ {
		der := make([]byte, n)
		rand.Read(der)
		want := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		got := AppendCertPEM([]byte("x"), der)
		if !bytes.Equal(got[1:], want) || got[0] != 'x' {
			t.Fatalf("%d bytes: got\n%s\nwant\n%s", n, got, want)
		}
		if CertPEMLen(der) != len(want) {
			t.Fatalf("%d bytes: CertPEMLen %d, encoded %d", n, CertPEMLen(der), len(want))
		}
	}
}

// A chain and the roots are encoded in one allocation each.
func TestAppendCertPEMAllocatesOnce(t *testing.T) {
	der := make([]byte, 700)
	if n := testing.AllocsPerRun(20, func() { AppendCertPEM(make([]byte, 0, CertPEMLen(der)), der) }); n != 1 {
		t.Fatalf("%v allocations, want 1", n)
	}
}

// A join's or renewal's chain is encoded in one allocation (encoding/pem
// took ten per certificate), and is the two blocks encoding/pem writes.
func TestChainPEMAllocatesOnce(t *testing.T) {
	h, err := Create("test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	iss := h.Issuer(RoleAgent)
	leaf := iss.Cert
	want := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Raw}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: iss.Cert.Raw})...)
	if got := iss.ChainPEM(leaf); !bytes.Equal(got, want) {
		t.Fatalf("ChainPEM:\n%s\nwant\n%s", got, want)
	}
	if n := testing.AllocsPerRun(20, func() { iss.ChainPEM(leaf) }); n != 1 {
		t.Fatalf("ChainPEM: %v allocations, want 1", n)
	}
}

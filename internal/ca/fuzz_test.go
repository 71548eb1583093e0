package ca

import (
	"bytes"
	"strings"
	"testing"
)

func FuzzParseCertsPEM(f *testing.F) {
	h := hierarchy(f)
	f.Add(EncodeCertPEM(h.Root))
	f.Add(append(EncodeCertPEM(h.Issuer(RoleAgent).Cert), EncodeCertPEM(h.Root)...))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		certs, err := ParseCertsPEM(data)
		if err != nil {
			return
		}
		if len(certs) == 0 {
			t.Fatal("no error and no certificate")
		}
		// What was read encodes back to blocks that read the same.
		var again []byte
		for _, c := range certs {
			again = append(again, EncodeCertPEM(c)...)
		}
		back, err := ParseCertsPEM(again)
		if err != nil || len(back) != len(certs) {
			t.Fatalf("re-encoded certificates do not parse: %v", err)
		}
		for i := range certs {
			if !back[i].Equal(certs[i]) {
				t.Fatalf("certificate %d changed in a round trip", i)
			}
		}
	})
}

func FuzzParseKeyPEM(f *testing.F) {
	h := hierarchy(f)
	key, err := EncodeKeyPEM(h.Issuer(RoleAgent).Key)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(key)
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n"))
	f.Add([]byte("-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		k, err := ParseKeyPEM(data)
		if err != nil {
			return
		}
		if AllowedPublicKey(k.Public()) != nil {
			t.Fatal("accepted a key of a type muster does not allow")
		}
		enc, err := EncodeKeyPEM(k)
		if err != nil {
			t.Fatalf("an accepted key does not encode: %v", err)
		}
		if _, err := ParseKeyPEM(enc); err != nil {
			t.Fatalf("an accepted key does not read back: %v", err)
		}
	})
}

func FuzzParseFingerprint(f *testing.F) {
	f.Add(hierarchy(f).Fingerprint())
	f.Add("sha256:" + strings.Repeat("AB", 32))
	f.Add("sha256:" + strings.Repeat("g", 64))
	f.Add("sha1:00")
	f.Fuzz(func(t *testing.T, s string) {
		fp, err := ParseFingerprint(s)
		if err != nil {
			return
		}
		if len(fp) != len("sha256:")+64 || fp != strings.ToLower(fp) || !strings.EqualFold(fp, s) {
			t.Fatalf("ParseFingerprint(%q) = %q, not the canonical form of the input", s, fp)
		}
		if again, err := ParseFingerprint(fp); err != nil || again != fp {
			t.Fatalf("canonical form %q does not parse to itself", fp)
		}
		if !bytes.HasPrefix([]byte(fp), []byte("sha256:")) {
			t.Fatal("no prefix")
		}
	})
}

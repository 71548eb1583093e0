package ca

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
)

type ed25519PublicKey = ed25519.PublicKey

// MaxCSRSize bounds a CSR from the network; a P-256 or Ed25519 request is
// well under 1 KiB.
const MaxCSRSize = 16 << 10

// ParseCSR reads a PEM or DER PKCS#10 request, checks its signature (the
// only time it is checked in a request), and its key type. Only the public
// key is used by the caller.
func ParseCSR(data []byte) (*x509.CertificateRequest, error) {
	if len(data) == 0 || len(data) > MaxCSRSize {
		return nil, ErrBadCSR
	}
	if bytes.HasPrefix(bytes.TrimSpace(data), []byte("-----BEGIN")) {
		block, _ := pem.Decode(data)
		if block == nil || block.Type != "CERTIFICATE REQUEST" {
			return nil, ErrBadCSR
		}
		data = block.Bytes
	}
	csr, err := x509.ParseCertificateRequest(data)
	if err != nil {
		return nil, ErrBadCSR
	}
	if err := AllowedPublicKey(csr.PublicKey); err != nil {
		return nil, err
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, ErrBadCSR
	}
	return csr, nil
}

// EncodeCertPEM returns one CERTIFICATE block.
func EncodeCertPEM(c *x509.Certificate) []byte {
	return AppendCertPEM(make([]byte, 0, CertPEMLen(c.Raw)), c.Raw)
}

const (
	pemCertBegin = "-----BEGIN CERTIFICATE-----\n"
	pemCertEnd   = "-----END CERTIFICATE-----\n"
	pemLine      = 64 // base64 characters per line, as encoding/pem writes them
)

// CertPEMLen is the length of the CERTIFICATE block of der.
func CertPEMLen(der []byte) int {
	n := base64.StdEncoding.EncodedLen(len(der))
	return len(pemCertBegin) + n + (n+pemLine-1)/pemLine + len(pemCertEnd)
}

// AppendCertPEM appends the CERTIFICATE block of der to dst, byte for
// byte what encoding/pem writes for a block without headers, without its
// buffer and writers: every join and renewal answer encodes its chain and
// roots, and a dst of CertPEMLen's size takes no other allocation.
func AppendCertPEM(dst, der []byte) []byte {
	dst = append(dst, pemCertBegin...)
	var line [pemLine]byte
	for len(der) > 0 {
		chunk := der[:min(len(der), pemLine/4*3)]
		der = der[len(chunk):]
		n := base64.StdEncoding.EncodedLen(len(chunk))
		base64.StdEncoding.Encode(line[:n], chunk)
		dst = append(dst, line[:n]...)
		dst = append(dst, '\n')
	}
	return append(dst, pemCertEnd...)
}

// EncodeKeyPEM returns a PKCS#8 PRIVATE KEY block.
func EncodeKeyPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParseKeyPEM reads a PKCS#8 PRIVATE KEY block holding an allowed key.
func ParseKeyPEM(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, errors.New("no PRIVATE KEY block")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, ErrKeyType
	}
	if err := AllowedPublicKey(s.Public()); err != nil {
		return nil, err
	}
	return s, nil
}

// ParseCertsPEM reads every CERTIFICATE block; it fails on none.
func ParseCertsPEM(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("no certificate in PEM data")
	}
	return certs, nil
}

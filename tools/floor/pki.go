package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// The lifetimes and the clock-skew allowance, as internal/ca's.
const (
	leafTTL  = time.Hour
	backdate = time.Minute
	caTTL    = 365 * 24 * time.Hour
)

// trustDomain names the leaves' SPIFFE IDs: spiffe://floor.test/agent/NAME.
const trustDomain = "floor.test"

// Files the server writes in its directory and the client reads.
const (
	rootFile    = "root.pem"
	agentCAFile = "agent-ca.pem"
	agentKey    = "agent-ca.key"
	serverFile  = "server.txt"
)

func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

// newSerial is a positive 128-bit serial, as internal/ca's.
func newSerial() (*big.Int, error) {
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	for {
		n, err := rand.Int(rand.Reader, limit)
		if err != nil {
			return nil, err
		}
		if n.Sign() > 0 {
			return n, nil
		}
	}
}

func caTemplate(cn string, now time.Time, eku []x509.ExtKeyUsage) *x509.Certificate {
	return &x509.Certificate{
		Subject:               pkix.Name{Organization: []string{"floor"}, CommonName: cn},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(caTTL),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		ExtKeyUsage:           eku,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
}

// leafTemplate is internal/ca's Issuer.Issue template for an agent leaf:
// the node's name, its SPIFFE ID, digitalSignature, clientAuth, an hour.
func leafTemplate(cn string, id *url.URL, now time.Time, serial *big.Int) *x509.Certificate {
	return &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(leafTTL),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{id},
	}
}

func sign(tmpl, parent *x509.Certificate, pub crypto.PublicKey, key crypto.Signer) (*x509.Certificate, error) {
	if tmpl.SerialNumber == nil {
		s, err := newSerial()
		if err != nil {
			return nil, err
		}
		tmpl.SerialNumber = s
	}
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, key)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

// hierarchy is the server's: a root, a server intermediate and its leaf for
// 127.0.0.1, and the agent intermediate that signs renewals and is the
// only anchor of client certificates.
type hierarchy struct {
	root, serverCA, serverLeaf, agentCA *x509.Certificate
	serverLeafKey, agentCAKey           *ecdsa.PrivateKey
}

func newHierarchy(now time.Time) (*hierarchy, error) {
	var h hierarchy
	rootKey, err := newKey()
	if err != nil {
		return nil, err
	}
	if h.root, err = sign(caTemplate("floor root CA", now, nil), nil, rootKey.Public(), rootKey); err != nil {
		return nil, err
	}
	serverCAKey, err := newKey()
	if err != nil {
		return nil, err
	}
	if h.serverCA, err = sign(caTemplate("floor server CA", now, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}), h.root, serverCAKey.Public(), rootKey); err != nil {
		return nil, err
	}
	if h.agentCAKey, err = newKey(); err != nil {
		return nil, err
	}
	if h.agentCA, err = sign(caTemplate("floor agent CA", now, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}), h.root, h.agentCAKey.Public(), rootKey); err != nil {
		return nil, err
	}
	if h.serverLeafKey, err = newKey(); err != nil {
		return nil, err
	}
	leaf := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "floor server"},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(caTTL),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"localhost"},
		URIs:                  []*url.URL{{Scheme: "spiffe", Host: trustDomain, Path: "/authority"}},
	}
	if h.serverLeaf, err = sign(leaf, h.serverCA, h.serverLeafKey.Public(), serverCAKey); err != nil {
		return nil, err
	}
	return &h, nil
}

// write stores what the client needs: the root, and the agent
// intermediate with its key (to mint its first client certificates).
func (h *hierarchy) write(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(h.agentCAKey)
	if err != nil {
		return err
	}
	files := []struct {
		name, typ string
		der       []byte
		mode      os.FileMode
	}{
		{rootFile, "CERTIFICATE", h.root.Raw, 0o644},
		{agentCAFile, "CERTIFICATE", h.agentCA.Raw, 0o644},
		{agentKey, "PRIVATE KEY", keyDER, 0o600},
	}
	for _, f := range files {
		b := pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der})
		if err := os.WriteFile(filepath.Join(dir, f.name), b, f.mode); err != nil {
			return err
		}
	}
	return nil
}

// readPEM returns the DER of the first PEM block of a file.
func readPEM(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("%s: no PEM block", path)
	}
	return blk.Bytes, nil
}

// clientPKI is what the client reads from the server's directory.
type clientPKI struct {
	roots   *x509.CertPool
	agentCA *x509.Certificate
	key     crypto.Signer
}

func readClientPKI(dir string) (*clientPKI, error) {
	rootDER, err := readPEM(filepath.Join(dir, rootFile))
	if err != nil {
		return nil, err
	}
	root, err := x509.ParseCertificate(rootDER)
	if err != nil {
		return nil, err
	}
	caDER, err := readPEM(filepath.Join(dir, agentCAFile))
	if err != nil {
		return nil, err
	}
	agentCA, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	keyDER, err := readPEM(filepath.Join(dir, agentKey))
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(keyDER)
	if err != nil {
		return nil, err
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, errors.New("agent CA key is not a signer")
	}
	roots := x509.NewCertPool()
	roots.AddCert(root)
	return &clientPKI{roots: roots, agentCA: agentCA, key: signer}, nil
}

func agentID(name string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: trustDomain, Path: "/agent/" + name}
}

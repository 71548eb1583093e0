package discoveryd

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/muster-dev/muster/internal/ca"
)

// serverCerts issues discovery's TLS server certificate from its CA: a
// fresh key and certificate at each start, again past half its life. The
// certificate names hosts (DNS and IP SANs) and never a URI: an authority's
// SPIFFE ID (spiffe://TD/authority/ID) on a discovery certificate would let
// a compromised discovery pose as the authority and collect the secrets
// agents send only to it.
type serverCerts struct {
	issuer *ca.Issuer
	hosts  []string

	mu  sync.Mutex
	cur *tls.Certificate
}

func (s *serverCerts) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if c := s.cur; c != nil && now.Before(c.Leaf.NotBefore.Add(c.Leaf.NotAfter.Sub(c.Leaf.NotBefore)/2)) {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	req := ca.LeafRequest{
		PublicKey:  key.Public(),
		CommonName: "muster discovery",
		ServerAuth: true,
		NotBefore:  now,
		TTL:        ServerCertTTL,
	}
	for _, h := range s.hosts {
		if ip := net.ParseIP(h); ip != nil {
			req.IPAddresses = append(req.IPAddresses, ip)
		} else {
			req.DNSNames = append(req.DNSNames, h)
		}
	}
	leaf, err := s.issuer.Issue(req)
	if err != nil {
		return nil, fmt.Errorf("discoveryd: issuing the server certificate: %w", err)
	}
	if len(leaf.URIs) != 0 {
		// Issue adds a URI only when asked; this guards the property
		// against a change there.
		return nil, fmt.Errorf("discoveryd: the server certificate carries a URI SAN")
	}
	// The chain ends with the CA, so a client that pins only its
	// fingerprint finds it in the handshake.
	c := &tls.Certificate{Certificate: [][]byte{leaf.Raw, s.issuer.Cert.Raw}, PrivateKey: key, Leaf: leaf}
	s.cur = c
	return c, nil
}

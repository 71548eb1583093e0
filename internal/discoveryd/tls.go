package discoveryd

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"net"
	"os"
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

// hostsOf lists the host parts of addresses for the certificate's SANs,
// always with the loopback names. An unspecified address (":7450",
// "0.0.0.0:7450") stands for every interface, so the machine's name is
// added too.
func hostsOf(addrs ...string) []string {
	seen := map[string]bool{}
	var out []string
	add := func(h string) {
		if h != "" && !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	for _, a := range addrs {
		if a == "" {
			continue
		}
		h, _, err := net.SplitHostPort(a)
		if err != nil {
			h = a
		}
		if ip := net.ParseIP(h); h == "" || ip != nil && ip.IsUnspecified() {
			if name, err := os.Hostname(); err == nil {
				add(name)
			}
			continue
		}
		add(h)
	}
	add("localhost")
	add("127.0.0.1")
	add("::1")
	return out
}

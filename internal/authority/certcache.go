package authority

import (
	"bytes"
	"crypto/x509"
	"sync"
)

// certCache keeps the CA certificates the leader's CA clock parsed, by
// serial, so that a tick which finds the rows it found before (every 5
// seconds, nearly always) parses nothing. A row's certificate never
// changes under its serial; the DER is compared anyway, so a cached
// certificate is only ever the row's. Safe for concurrent use.
type certCache struct {
	mu     sync.Mutex
	certs  map[string]*x509.Certificate
	seen   map[string]bool // serials asked for since the last sweep
	parses int             // certificates parsed, for tests
}

// parse returns der parsed, from the cache when serial's certificate is
// der.
func (c *certCache) parse(serial string, der []byte) (*x509.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen == nil {
		c.certs, c.seen = map[string]*x509.Certificate{}, map[string]bool{}
	}
	c.seen[serial] = true
	if cert := c.certs[serial]; cert != nil && bytes.Equal(cert.Raw, der) {
		return cert, nil
	}
	c.parses++
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c.certs[serial] = cert
	return cert, nil
}

// sweep forgets every certificate not asked for since the last sweep
// (retired and gone from the tick's use), so the cache holds one tick's
// certificates at most.
func (c *certCache) sweep() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for serial := range c.certs {
		if !c.seen[serial] {
			delete(c.certs, serial)
		}
	}
	c.seen = map[string]bool{}
}

// parsed is how many certificates were parsed so far.
func (c *certCache) parsed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.parses
}

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

	// signed remembers signedBy's answers: which root signed which of the
	// cached certificates. Every tick checks each role's active
	// intermediate against the signing root (rootSteps): four P-256
	// verifications every caTick otherwise, the same every time.
	signed map[signedPair]signedAnswer
	checks int // signatures verified by signedBy, for tests
}

// signedPair is a certificate and the one signedBy asked about as its
// signer, by identity: a cached certificate is never changed (certCache
// hands out the parse of the row's DER only), nor is a parsed root.
type signedPair struct{ cert, parent *x509.Certificate }

// signedAnswer is signedBy's answer, and whether it was asked for since
// the last sweep.
type signedAnswer struct{ ok, seen bool }

// signedBy reports whether parent signed cert (cert.CheckSignatureFrom),
// verifying the signature once per pair of certificates until a sweep
// finds the pair unused since the one before.
func (c *certCache) signedBy(cert, parent *x509.Certificate) bool {
	k := signedPair{cert, parent}
	c.mu.Lock()
	if a, ok := c.signed[k]; ok {
		c.signed[k] = signedAnswer{ok: a.ok, seen: true}
		c.mu.Unlock()
		return a.ok
	}
	c.mu.Unlock()
	ok := cert.CheckSignatureFrom(parent) == nil
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.signed == nil {
		c.signed = map[signedPair]signedAnswer{}
	}
	c.signed[k] = signedAnswer{ok: ok, seen: true}
	c.checks++
	return ok
}

// verified is how many signatures signedBy verified so far.
func (c *certCache) verified() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.checks
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
// certificates at most, and every signedBy answer not asked for since
// (a certificate or root no longer in use).
func (c *certCache) sweep() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for serial := range c.certs {
		if !c.seen[serial] {
			delete(c.certs, serial)
		}
	}
	c.seen = map[string]bool{}
	for k, a := range c.signed {
		if !a.seen {
			delete(c.signed, k)
			continue
		}
		c.signed[k] = signedAnswer{ok: a.ok}
	}
}

// parsed is how many certificates were parsed so far.
func (c *certCache) parsed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.parses
}

package ca

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"fmt"
	"math/big"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
)

// leafExtensions are the extensions every leaf of one issuer carries
// whatever it names: key usage, extended key usage (one of three sets),
// basic constraints, the authority key ID and the CRL distribution
// point. x509.CreateCertificate would encode them again for every leaf
// (about 26 allocations a leaf); given as ExtraExtensions it takes
// them as they are and builds only what differs per leaf (the subject
// alternative name). They are crypto/x509's own encoding, not ours: read
// back from a certificate x509 made with the same fields
// (buildLeafExtensions).
type leafExtensions struct {
	// The issuer's fields they were made from: a change to either
	// (a test, an operator tool setting the distribution point after
	// the Issuer is made) makes them again.
	cert   *x509.Certificate
	crlDPs []string
	// byUsage[usageIndex(server, client)]
	byUsage [3][]pkix.Extension
}

func usageIndex(server, client bool) int {
	switch {
	case server && client:
		return 2
	case server:
		return 0
	default:
		return 1
	}
}

// leafUsages is, per usageIndex, the extended key usages Sign puts in a
// leaf, in its order.
var leafUsages = [3][]x509.ExtKeyUsage{
	{x509.ExtKeyUsageServerAuth},
	{x509.ExtKeyUsageClientAuth},
	{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
}

var (
	oidKeyUsage              = asn1.ObjectIdentifier{2, 5, 29, 15}
	oidExtKeyUsage           = asn1.ObjectIdentifier{2, 5, 29, 37}
	oidBasicConstraints      = asn1.ObjectIdentifier{2, 5, 29, 19}
	oidAuthorityKeyID        = asn1.ObjectIdentifier{2, 5, 29, 35}
	oidCRLDistributionPoints = asn1.ObjectIdentifier{2, 5, 29, 31}
)

// buildLeafExtensions has x509 encode, once, the extensions of a leaf of
// parent with distribution points crlDPs: it signs a throwaway
// certificate for each usage set with the fields those extensions come
// from and keeps them as parsed back. The throwaway key is an Ed25519
// key of its own, cheap to make, never the issuer's: that may be in an
// HSM, and a signature of it over anything but a leaf is not wanted. Self-signed, x509 takes its authority key ID from the template,
// which is the issuer's subject key ID, as it does for a leaf under
// parent.
func buildLeafExtensions(parent *x509.Certificate, crlDPs []string) (*leafExtensions, error) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	fx := &leafExtensions{cert: parent, crlDPs: slices.Clone(crlDPs)}
	now := time.Now()
	for u, usage := range leafUsages {
		tmpl := &x509.Certificate{
			SerialNumber:          big.NewInt(1),
			Subject:               pkix.Name{CommonName: "muster leaf extensions"},
			NotBefore:             now,
			NotAfter:              now.Add(time.Hour),
			KeyUsage:              x509.KeyUsageDigitalSignature,
			ExtKeyUsage:           usage,
			BasicConstraintsValid: true,
			AuthorityKeyId:        parent.SubjectKeyId,
			CRLDistributionPoints: crlDPs,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, key)
		if err != nil {
			return nil, err
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, err
		}
		for _, e := range c.Extensions {
			switch {
			case e.Id.Equal(oidKeyUsage), e.Id.Equal(oidExtKeyUsage), e.Id.Equal(oidBasicConstraints),
				e.Id.Equal(oidAuthorityKeyID), e.Id.Equal(oidCRLDistributionPoints):
				fx.byUsage[u] = append(fx.byUsage[u], e)
			default:
				return nil, fmt.Errorf("ca: a leaf's fixed extensions: unexpected extension %v", e.Id)
			}
		}
	}
	return fx, nil
}

// fixedExtensions returns i's leafExtensions, made again when the
// issuer's certificate or distribution points changed since, or nil when
// they cannot be made (Sign then lets x509 encode every extension, as
// before).
func (i *Issuer) fixedExtensions() *leafExtensions {
	if fx := i.fixed.Load(); fx != nil && fx.cert == i.Cert && slices.Equal(fx.crlDPs, i.CRLDistributionPoints) {
		return fx
	}
	fx := madeExtensions.get(i.Cert, i.CRLDistributionPoints)
	if fx != nil {
		i.fixed.Store(fx)
	}
	return fx
}

// madeExtensions keeps the leafExtensions made, by issuer certificate
// and distribution points, across Issuers: the authority makes its
// Issuers anew at every reload of its intermediates (every few
// seconds), and making them costs about a millisecond.
var madeExtensions = extensionsCache{m: map[string]*leafExtensions{}}

type extensionsCache struct {
	// mu is held while one is made, so concurrent first leaves of an
	// issuer make it once.
	mu sync.Mutex
	m  map[string]*leafExtensions
}

// maxMadeExtensions bounds the cache: an authority has a few issuers
// at a time (an active and a prepared intermediate a role); past this,
// it starts again empty.
const maxMadeExtensions = 64

func (c *extensionsCache) get(cert *x509.Certificate, crlDPs []string) *leafExtensions {
	key := string(cert.Raw) + "\x00" + strings.Join(crlDPs, "\x00")
	c.mu.Lock()
	defer c.mu.Unlock()
	if fx, ok := c.m[key]; ok && slices.Equal(fx.crlDPs, crlDPs) {
		// The same certificate parsed again: the same extensions, kept
		// for this pointer so the Issuer's check matches.
		if fx.cert != cert {
			fx = &leafExtensions{cert: cert, crlDPs: fx.crlDPs, byUsage: fx.byUsage}
			c.m[key] = fx
		}
		return fx
	}
	fx, err := buildLeafExtensions(cert, crlDPs)
	if err != nil {
		return nil
	}
	if len(c.m) >= maxMadeExtensions {
		clear(c.m)
	}
	c.m[key] = fx
	return fx
}

// leafTemplate is the certificate Sign asks x509 for. Its fields say
// everything the leaf holds, as plainLeafTemplate's do; the extensions
// that are the same for every leaf of i are given encoded, so x509 does
// not encode them again. It is plainLeafTemplate when x509 would take
// the authority key ID from elsewhere (an issuer whose subject may
// encode as the leaf's: x509 then names no authority key ID).
func (i *Issuer) leafTemplate(req LeafRequest, buf *templateBuf) *x509.Certificate {
	tmpl := i.plainLeafTemplate(req, buf)
	if len(i.Cert.Subject.Names) <= 1 && i.Cert.Subject.CommonName == req.CommonName {
		return tmpl
	}
	if fx := i.fixedExtensions(); fx != nil {
		tmpl.ExtraExtensions = fx.byUsage[usageIndex(req.ServerAuth, req.ClientAuth)]
	}
	return tmpl
}

// plainLeafTemplate is the leaf's template, made in buf, with every
// extension left to x509 to encode.
func (i *Issuer) plainLeafTemplate(req LeafRequest, buf *templateBuf) *x509.Certificate {
	tmpl := &buf.cert
	*tmpl = x509.Certificate{
		Subject:     pkix.Name{CommonName: req.CommonName},
		NotBefore:   req.NotBefore.Add(-Backdate),
		NotAfter:    req.NotBefore.Add(req.TTL),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		DNSNames:    req.DNSNames,
		IPAddresses: req.IPAddresses,
		// Leaves are never CAs, and say so.
		BasicConstraintsValid: true,
		CRLDistributionPoints: i.CRLDistributionPoints,
		ExtKeyUsage:           leafUsages[usageIndex(req.ServerAuth, req.ClientAuth)],
	}
	if req.SPIFFEID != nil {
		buf.uris[0] = req.SPIFFEID
		tmpl.URIs = buf.uris[:]
	}
	// A leaf that outlived its issuer would fail to verify anyway; cutting
	// it makes its expiry honest.
	if tmpl.NotAfter.After(i.Cert.NotAfter) {
		tmpl.NotAfter = i.Cert.NotAfter
	}
	return tmpl
}

// templateBuf holds a leaf's template while x509 signs it: 1.4 kB and
// two allocations a leaf, kept in a pool (templates) since
// x509.CreateCertificate keeps nothing of the template it is given.
type templateBuf struct {
	cert x509.Certificate
	uris [1]*url.URL
}

var templates = sync.Pool{New: func() any { return new(templateBuf) }}

// release clears buf (the template points at the request's key and
// names) and gives it back to the pool.
func (buf *templateBuf) release() {
	*buf = templateBuf{}
	templates.Put(buf)
}

package ca

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"net/url"
	"slices"
	"time"
)

// leafFields is everything a leaf Issue signs says, besides its serial and
// the issuer's own names.
type leafFields struct {
	pub                    crypto.PublicKey
	commonName             string
	dnsNames               []string
	ips                    []net.IP
	uri                    *url.URL // the SPIFFE ID, or nil
	notBefore, notAfter    time.Time
	serverAuth, clientAuth bool
	crlDPs                 []string
}

// template is the x509.CreateCertificate template of l: what Issue signed
// through encoding/asn1 before leafDER, and still does for a leaf leafDER
// does not encode.
func (l *leafFields) template(serial *big.Int) *x509.Certificate {
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: l.commonName},
		NotBefore:    l.notBefore,
		NotAfter:     l.notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		DNSNames:     l.dnsNames,
		IPAddresses:  l.ips,
		// Leaves are never CAs, and say so.
		BasicConstraintsValid: true,
		CRLDistributionPoints: l.crlDPs,
	}
	if l.uri != nil {
		tmpl.URIs = []*url.URL{l.uri}
	}
	if l.serverAuth {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if l.clientAuth {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	return tmpl
}

// errNotEncoded: leafDER does not encode this leaf (a key type, a name or a
// time outside what muster issues); x509.CreateCertificate signs it.
var errNotEncoded = errors.New("ca: leaf not encoded directly")

// DER pieces of a leaf, as encoding/asn1 writes them for
// x509.CreateCertificate (RFC 5280, RFC 5480, RFC 8410).
var (
	derVersion3     = []byte{0xa0, 0x03, 0x02, 0x01, 0x02}
	derECDSAWithSHA = []byte{0x30, 0x0a, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02}
	derSPKIP256     = []byte{0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01,
		0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00}
	derSPKIEd25519 = []byte{0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00}
	derCommonName  = []byte{0x06, 0x03, 0x55, 0x04, 0x03}
	// keyUsage, critical: digitalSignature.
	derKeyUsage = []byte{0x30, 0x0e, 0x06, 0x03, 0x55, 0x1d, 0x0f, 0x01, 0x01, 0xff, 0x04, 0x04, 0x03, 0x02, 0x07, 0x80}
	// basicConstraints, critical: not a CA.
	derBasicConstraints = []byte{0x30, 0x0c, 0x06, 0x03, 0x55, 0x1d, 0x13, 0x01, 0x01, 0xff, 0x04, 0x02, 0x30, 0x00}
	derOIDExtKeyUsage   = []byte{0x06, 0x03, 0x55, 0x1d, 0x25}
	derOIDAuthKeyID     = []byte{0x06, 0x03, 0x55, 0x1d, 0x23}
	derOIDSAN           = []byte{0x06, 0x03, 0x55, 0x1d, 0x11}
	derOIDCRLDP         = []byte{0x06, 0x03, 0x55, 0x1d, 0x1f}
	derCritical         = []byte{0x01, 0x01, 0xff}
	derServerAuth       = []byte{0x06, 0x08, 0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x01}
	derClientAuth       = []byte{0x06, 0x08, 0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x02}
)

// derBuf appends DER: open writes a tag and a one-byte length to fill in,
// close fills it in once the contents are written, moving them along when
// the length needs more bytes.
type derBuf []byte

func (d *derBuf) open(tag byte) int {
	*d = append(*d, tag, 0)
	return len(*d)
}

func (d *derBuf) close(start int) {
	n := len(*d) - start
	if n < 0x80 {
		(*d)[start-1] = byte(n)
		return
	}
	var l [4]byte
	k := 0
	for v := n; v > 0; v >>= 8 {
		k++
	}
	for i := range k {
		l[i] = byte(n >> (8 * (k - 1 - i)))
	}
	(*d)[start-1] = 0x80 | byte(k)
	*d = slices.Insert(*d, start, l[:k]...)
}

func (d *derBuf) add(b ...byte) { *d = append(*d, b...) }

func (d *derBuf) addString(tag byte, s string) {
	c := d.open(tag)
	*d = append(*d, s...)
	d.close(c)
}

// addTime writes t as encoding/asn1 does: UTCTime from 1950 to 2049,
// GeneralizedTime otherwise, to the second, in UTC.
func (d *derBuf) addTime(t time.Time) {
	t = t.UTC()
	y := t.Year()
	c := 0
	if y >= 1950 && y < 2050 {
		c = d.open(0x17)
		d.add2(y % 100)
	} else {
		c = d.open(0x18)
		d.add2(y / 100)
		d.add2(y % 100)
	}
	d.add2(int(t.Month()))
	d.add2(t.Day())
	d.add2(t.Hour())
	d.add2(t.Minute())
	d.add2(t.Second())
	d.add('Z')
	d.close(c)
}

func (d *derBuf) add2(v int) { d.add(byte('0'+v/10), byte('0'+v%10)) }

// printable reports whether encoding/asn1 writes s as a PrintableString
// (a subset: a name with any other byte takes the other path).
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		b := s[i]
		if 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' {
			continue
		}
		switch b {
		case ' ', '\'', '(', ')', '+', ',', '-', '.', '/', ':', '=', '?':
			continue
		}
		return false
	}
	return true
}

func ascii(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// leafTBS appends to buf the TBSCertificate that x509.CreateCertificate encodes for
// l.template(serial) under parent, byte for byte
// (TestLeafDERIsCreateCertificate, FuzzLeafDER), without encoding/asn1's
// reflection: most of an issuance's allocations. It returns errNotEncoded
// for what muster does not issue (a non-printable common name, a name
// CreateCertificate would refuse, a key other than P-256 or Ed25519, a year
// past 9999, an issuer with no raw subject).
func leafTBS(buf []byte, l *leafFields, serial *big.Int, parent *x509.Certificate) ([]byte, error) {
	if len(parent.RawSubject) == 0 || !printable(l.commonName) || serial.Sign() <= 0 || serial.BitLen() > 8*20 {
		return nil, errNotEncoded
	}
	for _, t := range []time.Time{l.notBefore, l.notAfter} {
		if y := t.UTC().Year(); y < 0 || y > 9999 {
			return nil, errNotEncoded
		}
	}
	var point []byte
	switch k := l.pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return nil, errNotEncoded
		}
		p, err := k.Bytes()
		if err != nil || len(p) != 65 {
			return nil, errNotEncoded
		}
		point = p
	case ed25519.PublicKey:
		if len(k) != ed25519.PublicKeySize {
			return nil, errNotEncoded
		}
	default:
		return nil, errNotEncoded
	}
	for _, n := range l.dnsNames {
		if !ascii(n) {
			return nil, errNotEncoded
		}
	}
	for _, ip := range l.ips {
		if len(ip) != net.IPv4len && len(ip) != net.IPv6len {
			return nil, errNotEncoded
		}
	}
	var uri string
	if l.uri != nil {
		if uri = l.uri.String(); !ascii(uri) {
			return nil, errNotEncoded
		}
	}

	d := derBuf(buf)
	tbs := d.open(0x30)
	d.add(derVersion3...)
	var sb [21]byte
	s := serial.FillBytes(sb[1:])
	for len(s) > 1 && s[0] == 0 {
		s = s[1:]
	}
	if s[0]&0x80 != 0 {
		s = sb[len(sb)-len(s)-1:]
	}
	d.add(0x02, byte(len(s)))
	d.add(s...)
	d.add(derECDSAWithSHA...)
	d.add(parent.RawSubject...)
	v := d.open(0x30)
	d.addTime(l.notBefore)
	d.addTime(l.notAfter)
	d.close(v)
	subjectStart := len(d)
	subj := d.open(0x30)
	if l.commonName != "" {
		set := d.open(0x31)
		atv := d.open(0x30)
		d.add(derCommonName...)
		d.addString(0x13, l.commonName)
		d.close(atv)
		d.close(set)
	}
	d.close(subj)
	subjectIsEmpty := l.commonName == ""
	sameNames := bytes.Equal(d[subjectStart:], parent.RawSubject)
	if point != nil {
		d.add(derSPKIP256...)
		d.add(point...)
	} else {
		d.add(derSPKIEd25519...)
		d.add(l.pub.(ed25519.PublicKey)...)
	}

	exts := d.open(0xa3)
	list := d.open(0x30)
	d.add(derKeyUsage...)
	if l.serverAuth || l.clientAuth {
		e := d.open(0x30)
		d.add(derOIDExtKeyUsage...)
		o := d.open(0x04)
		q := d.open(0x30)
		if l.serverAuth {
			d.add(derServerAuth...)
		}
		if l.clientAuth {
			d.add(derClientAuth...)
		}
		d.close(q)
		d.close(o)
		d.close(e)
	}
	d.add(derBasicConstraints...)
	if !sameNames && len(parent.SubjectKeyId) > 0 {
		e := d.open(0x30)
		d.add(derOIDAuthKeyID...)
		o := d.open(0x04)
		q := d.open(0x30)
		k := d.open(0x80)
		d.add(parent.SubjectKeyId...)
		d.close(k)
		d.close(q)
		d.close(o)
		d.close(e)
	}
	if len(l.dnsNames) > 0 || len(l.ips) > 0 || l.uri != nil {
		e := d.open(0x30)
		d.add(derOIDSAN...)
		if subjectIsEmpty {
			d.add(derCritical...)
		}
		o := d.open(0x04)
		q := d.open(0x30)
		for _, n := range l.dnsNames {
			d.addString(0x82, n)
		}
		for _, ip := range l.ips {
			if ip4 := ip.To4(); ip4 != nil {
				ip = ip4
			}
			c := d.open(0x87)
			d.add(ip...)
			d.close(c)
		}
		if l.uri != nil {
			d.addString(0x86, uri)
		}
		d.close(q)
		d.close(o)
		d.close(e)
	}
	if len(l.crlDPs) > 0 {
		e := d.open(0x30)
		d.add(derOIDCRLDP...)
		o := d.open(0x04)
		q := d.open(0x30)
		for _, name := range l.crlDPs {
			dp := d.open(0x30)
			dpn := d.open(0xa0)
			full := d.open(0xa0)
			d.addString(0x86, name)
			d.close(full)
			d.close(dpn)
			d.close(dp)
		}
		d.close(q)
		d.close(o)
		d.close(e)
	}
	d.close(list)
	d.close(exts)
	d.close(tbs)
	return d, nil
}

// leafDER signs l with key for parent and returns the certificate's DER, as
// x509.CreateCertificate(rand.Reader, l.template(serial), parent, l.pub,
// key) does for an ECDSA P-256 issuer: the same bytes but for the
// signature, the same refusal of a key that is not parent's, and the
// signature verified before it is returned (a faulty signer's output is
// never handed out). errNotEncoded: use CreateCertificate.
func leafDER(l *leafFields, serial *big.Int, parent *x509.Certificate, key crypto.Signer) ([]byte, error) {
	issuerPub, ok := key.Public().(*ecdsa.PublicKey)
	if !ok || issuerPub.Curve != elliptic.P256() {
		return nil, errNotEncoded
	}
	if parent.PublicKey != nil && !issuerPub.Equal(parent.PublicKey) {
		return nil, errors.New("x509: provided PrivateKey doesn't match parent's PublicKey")
	}
	// The certificate (its TBSCertificate, the algorithm again and the
	// signature) in one buffer: a leaf is about 700 bytes.
	out := derBuf(make([]byte, 0, 1024))
	c := out.open(0x30)
	out, err := leafTBS(out, l, serial, parent)
	if err != nil {
		return nil, err
	}
	tbs := out[c:]
	sig, err := crypto.SignMessage(key, rand.Reader, tbs, crypto.SHA256)
	if err != nil {
		return nil, err
	}
	digest := sha256.Sum256(tbs)
	if !ecdsa.VerifyASN1(issuerPub, digest[:], sig) {
		return nil, errors.New("x509: signature returned by signer is invalid")
	}
	out.add(derECDSAWithSHA...)
	b := out.open(0x03)
	out.add(0)
	out.add(sig...)
	out.close(b)
	out.close(c)
	return out, nil
}

package loadgen

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
)

// Bound is the crypto floor of one operation, measured on this machine in
// this run, one part at a time on one goroutine: the time the signatures,
// verifications and key exchanges the operation cannot avoid take, and
// nothing else (no store, RPC, audit or encoding).
type Bound struct {
	// What names the crypto counted.
	What    string        `json:"what"`
	PerOp   time.Duration `json:"per_op_ns"`
	PerCore float64       `json:"ops_per_second_per_core"`
	// Parts is the bound part by part, so a reader can take out the
	// handshake (Handshake) and compare with the bound of an operation on a
	// connection kept open.
	Parts []BoundPart `json:"parts"`
}

// BoundPart is one part of a Bound, timed on its own.
type BoundPart struct {
	What  string        `json:"what"`
	PerOp time.Duration `json:"per_op_ns"`
	// Handshake marks the TLS handshake a new connection costs.
	Handshake bool `json:"handshake,omitempty"`
}

// WithoutHandshake is the bound's time per operation less its handshake,
// and whether it had one.
func (b *Bound) WithoutHandshake() (time.Duration, bool) {
	per, had := time.Duration(0), false
	for _, p := range b.Parts {
		if p.Handshake {
			had = true
			continue
		}
		per += p.PerOp
	}
	return per, had
}

// boundIterations is how many times each bound repeats its crypto: enough
// for a stable mean, short enough (well under a second) for a CI smoke. A
// variable so the package's tests can run fewer.
var boundIterations = 300

// boundFixture is a CA of the kind the authority runs (ECDSA P-256 at
// every level), made for the measurement only.
type boundFixture struct {
	h       *ca.Hierarchy
	csr     []byte
	agentID *url.URL
}

func newBoundFixture() (*boundFixture, error) {
	h, err := ca.Create("bench", time.Now())
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return nil, err
	}
	id, err := spiffeid.New("bench.test", spiffeid.RoleAgent, "node")
	if err != nil {
		return nil, err
	}
	return &boundFixture{h: h, csr: csr, agentID: id.URL()}, nil
}

// issue is the crypto every issuance does: the CSR's signature checked
// once and the certificate signed.
func (f *boundFixture) issue() error {
	csr, err := ca.ParseCSR(f.csr)
	if err != nil {
		return err
	}
	_, err = f.h.Issuer(ca.RoleAgent).Issue(ca.LeafRequest{PublicKey: csr.PublicKey, SPIFFEID: f.agentID,
		CommonName: "node", ClientAuth: true, NotBefore: time.Now(), TTL: time.Hour})
	return err
}

// MeasureBound times the crypto floor of op ("token-join", "psk-join",
// "renew", "bound-recovery" or "bound-refresh"; a stream has none). With
// newConn (the bench's --connection new) each request opens a TLS
// connection of its own, so its handshake is crypto the request cannot
// avoid and is counted, at both ends, as it always is for a renewal or a
// refresh, which cannot share a connection: without a client certificate
// for a join or a recovery, with the agent's for the others.
func MeasureBound(op string, newConn bool) (*Bound, error) {
	f, err := newBoundFixture()
	if err != nil {
		return nil, err
	}
	const (
		serverAuth = "TLS 1.3 handshake, server certificate only (both ends)"
		mutual     = "TLS 1.3 handshake with a client certificate (both ends)"
		recovery   = "Ed25519 answer verify + join-state JWT signature"
		issuance   = "CSR signature check + certificate signature"
	)
	var parts []string
	switch op {
	case OpTokenJoin, OpPSKJoin:
		parts = []string{issuance}
	case OpRenew:
		parts = []string{mutual, issuance}
	case OpBoundRecovery:
		parts = []string{recovery, issuance}
	case OpBoundRefresh:
		parts = []string{mutual, recovery, issuance}
	default:
		return nil, fmt.Errorf("loadgen: unknown operation %q", op)
	}
	if newConn && !presentsCertificate(op) {
		parts = append([]string{serverAuth}, parts...)
	}
	b := &Bound{}
	var names []string
	for _, p := range parts {
		var step func() error
		switch p {
		case serverAuth, mutual:
			step, err = f.handshaker(p == mutual)
		case recovery:
			step, err = f.recoverer()
		default:
			step = f.issue
		}
		if err != nil {
			return nil, err
		}
		per, err := timeStep(step)
		if err != nil {
			return nil, err
		}
		b.Parts = append(b.Parts, BoundPart{What: p, PerOp: per, Handshake: p == serverAuth || p == mutual})
		b.PerOp += per
		names = append(names, p)
	}
	b.What = strings.Join(names, " + ")
	b.PerCore = float64(time.Second) / float64(b.PerOp)
	return b, nil
}

// timeStep is the mean time of step over boundIterations runs, after one
// untimed run that warms caches and lazily built tables.
func timeStep(step func() error) (time.Duration, error) {
	if err := step(); err != nil {
		return 0, err
	}
	start := time.Now()
	for range boundIterations {
		if err := step(); err != nil {
			return 0, err
		}
	}
	return time.Since(start) / time.Duration(boundIterations), nil
}

// handshaker returns a function that runs one TLS 1.3 handshake in this
// process over an in-memory pipe, as the agent and the authority make it:
// the authority's default key exchange, its chain (leaf, intermediate and
// root, which an agent pinning only the root's fingerprint needs), checked
// by the agent's own TLS configuration (identity.ClientTLS). With mutual
// the client also presents an agent certificate — its leaf alone, as an
// agent does to an authority that names its agent intermediate in the
// certificate request — which the authority asks for but does not check
// in the handshake; it
// checks it per call against its own agent intermediate, one signature
// (authority.clientAnchors), and so does this server. Both ends are
// counted: the load generator and the authority share this machine, so it
// does both.
func (f *boundFixture) handshaker(mutual bool) (func() error, error) {
	leaf := func(role ca.Role, server bool) (*x509.Certificate, *ecdsa.PrivateKey, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		c, err := f.h.Issuer(role).Issue(ca.LeafRequest{PublicKey: key.Public(), SPIFFEID: f.agentID, CommonName: "node",
			ServerAuth: server, ClientAuth: !server, NotBefore: time.Now(), TTL: time.Hour})
		return c, key, err
	}
	srvLeaf, srvKey, err := leaf(ca.RoleServer, true)
	if err != nil {
		return nil, err
	}
	srvCert := tls.Certificate{Certificate: [][]byte{srvLeaf.Raw, f.h.Issuer(ca.RoleServer).Cert.Raw, f.h.Root.Raw},
		PrivateKey: srvKey, Leaf: srvLeaf}
	srvConf := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{srvCert}, NextProtos: []string{"h2"}}
	var client *identity.Identity
	if mutual {
		cliLeaf, cliKey, err := leaf(ca.RoleAgent, false)
		if err != nil {
			return nil, err
		}
		client = &identity.Identity{Chain: []*x509.Certificate{cliLeaf, f.h.Issuer(ca.RoleAgent).Cert}, Key: cliKey}
		anchor := x509.NewCertPool()
		anchor.AddCert(f.h.Issuer(ca.RoleAgent).Cert)
		srvConf.ClientAuth = tls.RequestClientCert
		// The authority names its client intermediates, so the agent
		// presents its leaf alone: that is the message timed.
		srvConf.ClientCAs = anchor
		srvConf.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) != 1 {
				return fmt.Errorf("loadgen: the client presented %d certificates, want its leaf alone", len(cs.PeerCertificates))
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: anchor, CurrentTime: time.Now(),
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
			return err
		}
	}
	cliConf := identity.ClientTLS(client, f.h.RootPool(), func(spiffeid.ID) error { return nil })
	return func() error {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		errc := make(chan error, 1)
		go func() { errc <- tls.Server(b, srvConf).Handshake() }()
		cerr := tls.Client(a, cliConf).Handshake()
		if serr := <-errc; serr != nil {
			return serr
		}
		return cerr
	}, nil
}

// recoverer returns a function that does the bound-keypair crypto of a
// recovery: the agent's answer to a challenge verified (Ed25519 in a JWT)
// and a new join state signed. The answer is made first, as the agent
// makes it.
func (f *boundFixture) recoverer() (func() error, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	bound, err := boundkeypair.NewPublicKey(pub)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	ch, err := boundkeypair.NewChallenge("bench", now)
	if err != nil {
		return nil, err
	}
	answer, err := boundkeypair.Answer(priv, ch, now)
	if err != nil {
		return nil, err
	}
	sk, err := boundkeypair.NewSigningKey()
	if err != nil {
		return nil, err
	}
	state := boundkeypair.JoinState{Issuer: "bench", Token: "bot", NodeID: "node", IssuedAt: now, InstanceID: "instance",
		BoundKey: bound.Fingerprint(), RecoverySequence: 1, RecoveryLimit: 10, RecoveryMode: boundkeypair.ModeStandard}
	return func() error {
		if err := ch.Verify(answer, bound, time.Now()); err != nil {
			return err
		}
		_, err := sk.Sign(state)
		return err
	}, nil
}

package loadgen

import (
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/mlkem"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"runtime"
	"strings"
	"time"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/spiffeid"
)

// Bound is the crypto the authority (the server) must do for one
// operation, measured on this machine in this run, one primitive at a
// time on one goroutine locked to one thread, best of several rounds: the
// key exchange, TLS key schedule and transcript hash, signatures and
// verifications the operation cannot avoid at the server, and nothing else
// (no parsing, encoding, store, RPC, audit or the client's side of
// anything). The TLS record layer is not counted: the AES-GCM key set up
// from each traffic key and the encryption of the records (the handshake's
// encrypted messages and the request's and answer's bytes) are symmetric
// crypto whose cost follows the bytes sent, which a leaner encoding of the
// same request would cut, so it is not crypto the operation cannot avoid
// in the sense of the others, whose cost is fixed by the protocol.
type Bound struct {
	// What names the crypto counted.
	What    string        `json:"what"`
	PerOp   time.Duration `json:"per_op_ns"`
	PerCore float64       `json:"ops_per_second_per_core"`
	// Group is the TLS key-exchange group an agent and the authority
	// negotiate (their defaults), whose server share the handshake part
	// times; empty when the bound has no handshake.
	Group string `json:"group,omitempty"`
	// CipherSuite is the TLS 1.3 cipher suite they negotiate, whose hash
	// the key schedule and transcript use; empty without a handshake.
	CipherSuite string `json:"cipher_suite,omitempty"`
	// KeptConnection is the bound without its handshake's parts: the
	// operation's own crypto, as on a connection whose handshake is done
	// (ServerPrimitives without a new connection). Zero when the bound
	// has no handshake.
	KeptConnection time.Duration `json:"kept_connection_ns,omitempty"`
	// Parts is the bound primitive by primitive, so a reader can take out
	// the handshake (Handshake) and compare with the bound of an
	// operation on a connection kept open.
	Parts []BoundPart `json:"parts"`
}

// BoundPart is one primitive of a Bound, timed on its own.
type BoundPart struct {
	Primitive Primitive     `json:"primitive"`
	What      string        `json:"what"`
	PerOp     time.Duration `json:"per_op_ns"`
	// Handshake marks the server's part of the TLS handshake a new
	// connection costs.
	Handshake bool `json:"handshake,omitempty"`
}

// Primitive is one piece of crypto the server does for an operation.
type Primitive string

// The primitives a bound counts.
const (
	// The server's key share of the negotiated group: with X25519MLKEM768
	// (the Go default both ends use) the client's ML-KEM-768 key parsed
	// and encapsulated to, an X25519 key made and the shared secret
	// computed.
	PrimKeyShare Primitive = "tls-key-share"
	// CertificateVerify: the server's ECDSA P-256 signature over the
	// transcript hash.
	PrimCertificateVerify Primitive = "tls-certificate-verify-sign"
	// The server's TLS 1.3 key schedule (RFC 8446 section 7.1) and
	// transcript hash: HKDF-Extract and Expand-Label of every secret,
	// traffic key and IV crypto/tls derives, both Finished HMACs, and the
	// hash of every handshake message, of the sizes a real agent
	// handshake has (keySchedule).
	PrimKeySchedule Primitive = "tls-key-schedule"
	// The client's leaf checked against this authority's agent
	// intermediate: one ECDSA P-256 verification (authority.clientAnchors).
	PrimClientChain Primitive = "client-chain-verify"
	// The client's CertificateVerify checked: SHA-256 of its signed input
	// and one ECDSA P-256 verification with the presented leaf's key, the
	// proof that the client holds the certificate's key, which crypto/tls
	// makes on every handshake where the client presents one.
	PrimClientCertificateVerify Primitive = "tls-client-certificate-verify-check"
	// The CSR's self-signature: one ECDSA P-256 verification.
	PrimCSR Primitive = "csr-signature-check"
	// The certificate's signature: SHA-256 of its TBS and one ECDSA P-256
	// signature.
	PrimCertificateSign Primitive = "certificate-sign"
	// A join token's or the PSK's secret opened from the store
	// (AES-256-GCM) and compared in constant time.
	PrimTokenSecret Primitive = "token-secret-check"
	PrimPSK         Primitive = "psk-check"
	// The Ed25519 signature of the agent's answer to the challenge.
	PrimChallengeVerify Primitive = "challenge-answer-verify"
	// The new join state's JWS signature (Ed25519).
	PrimJoinStateSign Primitive = "join-state-sign"
)

var primitiveWhat = map[Primitive]string{
	PrimKeyShare:                "TLS key share (server side)",
	PrimCertificateVerify:       "TLS CertificateVerify signature (ECDSA P-256)",
	PrimKeySchedule:             "TLS 1.3 key schedule, Finished MACs and transcript hash (server side)",
	PrimClientChain:             "client certificate check (one ECDSA P-256 verify)",
	PrimClientCertificateVerify: "the client's TLS CertificateVerify checked (SHA-256 + ECDSA P-256 verify)",
	PrimCSR:                     "CSR signature check (ECDSA P-256 verify)",
	PrimCertificateSign:         "certificate signature (SHA-256 + ECDSA P-256 sign)",
	PrimTokenSecret:             "join-token secret (AES-256-GCM open + constant-time compare)",
	PrimPSK:                     "PSK (AES-256-GCM open + constant-time compare)",
	PrimChallengeVerify:         "challenge answer (Ed25519 verify)",
	PrimJoinStateSign:           "join-state JWS (Ed25519 sign)",
}

// handshakePrimitive is whether p belongs to the TLS handshake.
func handshakePrimitive(p Primitive) bool {
	switch p {
	case PrimKeyShare, PrimKeySchedule, PrimCertificateVerify, PrimClientChain, PrimClientCertificateVerify:
		return true
	}
	return false
}

// ServerPrimitives is the crypto the authority must do for one request of
// op: with newConn (the bench's --connection new) the server's part of a
// new connection's TLS 1.3 handshake (its key share, its key schedule and
// transcript hash, its CertificateVerify signature, and, for a renewal or
// a refresh, which present the agent's certificate, that certificate's
// check and the check of the client's CertificateVerify, its proof of
// holding the certificate's key); then the operation's own. Without newConn the request rides a connection whose
// handshake is done: none of it is counted, the client certificate's
// check included, since a connection's certificate needs checking once
// (the authority today checks it on every call, which then counts beyond
// the bound). Not counted: what the client does, and what the server may
// skip — a join state this process signed is recognised, not verified
// again (enroll.issuedStates); an intermediate's signature by the root is
// not checked per call (authority.clientAnchors).
func ServerPrimitives(op string, newConn bool) ([]Primitive, error) {
	issue := []Primitive{PrimCSR, PrimCertificateSign}
	var own []Primitive
	switch op {
	case OpTokenJoin:
		own = append([]Primitive{PrimTokenSecret}, issue...)
	case OpPSKJoin:
		own = append([]Primitive{PrimPSK}, issue...)
	case OpRenew:
		own = issue
	case OpBoundRecovery, OpBoundRefresh:
		own = append([]Primitive{PrimChallengeVerify, PrimJoinStateSign}, issue...)
	default:
		return nil, fmt.Errorf("loadgen: no bound for operation %q", op)
	}
	if !newConn {
		return own, nil
	}
	hs := []Primitive{PrimKeyShare, PrimKeySchedule, PrimCertificateVerify}
	if presentsCertificate(op) {
		hs = append(hs, PrimClientChain, PrimClientCertificateVerify)
	}
	return append(hs, own...), nil
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

// boundIterations is how many times a round repeats a primitive, and
// boundRounds how many rounds are timed (the best is kept: on a shared
// machine a round can only be slowed down). A variable so the package's
// tests can run fewer.
var (
	boundIterations = 100
	boundRounds     = 5
)

// boundFixture holds what the primitives work on, made as the authority
// and an agent make it (ECDSA P-256 at every level of the CA).
//
// Every private key's signatures are counted, by the side that holds it
// (countingSigner), and so are the client's key shares: the server's keys
// sign in the timed rounds, the client's only while the fixture is made
// (its CSR, its CertificateVerify in the real handshake and the one the
// server's check verifies, the bot's answer), and
// TestBoundCountsNoClientWork holds MeasureBound to that. The fixture
// keeps no client private key but through its counter.
type boundFixture struct {
	h      *ca.Hierarchy
	id     spiffeid.ID
	csr    *x509.CertificateRequest
	leaf   *x509.Certificate // an agent's, issued by the agent intermediate
	srvKey crypto.Signer     // the listener's key (server)
	issuer crypto.Signer     // the agent intermediate's key (server)
	jsKey  crypto.Signer     // the join-state signing key (server, Ed25519)
	agent  crypto.Signer     // the agent's key: its CSR, its CertificateVerify (client)
	sealer *seal.Sealer
	secret []byte
	sealed []byte
	nonce  []byte
	botPub ed25519.PublicKey // the bot's bound key (its private half is the client's)
	answer []byte            // the signing input of an answer to a challenge
	ansSig []byte            // the bot's signature of it
	state  []byte            // the signing input of a join state
	// shapes are the real handshakes' shapes, by whether the client
	// presents a certificate.
	shapes map[bool]*handshakeShape
	// clientCVMsg is a client CertificateVerify's signed input, and
	// clientCVSig the agent's signature of it (made with the fixture).
	clientCVMsg, clientCVSig []byte

	serverSigns, clientSigns, clientShares int
}

// countingSigner counts the signatures a key makes.
type countingSigner struct {
	crypto.Signer
	n *int
}

func (c countingSigner) Sign(r io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	*c.n++
	return c.Signer.Sign(r, digest, opts)
}

func newBoundFixture() (*boundFixture, error) {
	h, err := ca.Create("bench", time.Now())
	if err != nil {
		return nil, err
	}
	f := &boundFixture{h: h}
	agentKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	f.agent = countingSigner{agentKey, &f.clientSigns}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, f.agent)
	if err != nil {
		return nil, err
	}
	csr, err := ca.ParseCSR(der)
	if err != nil {
		return nil, err
	}
	id, err := spiffeid.New("bench.test", spiffeid.RoleAgent, "node")
	if err != nil {
		return nil, err
	}
	leaf, err := h.Issuer(ca.RoleAgent).Issue(ca.LeafRequest{PublicKey: csr.PublicKey, SPIFFEID: id.URL(),
		CommonName: "node", ClientAuth: true, NotBefore: time.Now(), TTL: time.Hour})
	if err != nil {
		return nil, err
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	f.id, f.csr, f.leaf = id, csr, leaf
	f.srvKey = countingSigner{srvKey, &f.serverSigns}
	f.issuer = countingSigner{h.Issuer(ca.RoleAgent).Key, &f.serverSigns}
	var sk seal.StorageKey
	if _, err := rand.Read(sk[:]); err != nil {
		return nil, err
	}
	if f.sealer, err = sk.Sealer("bench"); err != nil {
		return nil, err
	}
	f.secret = make([]byte, 32)
	if _, err := rand.Read(f.secret); err != nil {
		return nil, err
	}
	if f.sealed, f.nonce, err = f.sealer.Seal(f.secret, []byte("token-id")); err != nil {
		return nil, err
	}
	botPub, botPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	f.botPub = botPub
	// The messages signed are the real ones, for their length: an answer
	// to a challenge and a join state.
	bound, err := boundkeypair.NewPublicKey(botPub)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	ch, err := boundkeypair.NewChallenge("bench", now)
	if err != nil {
		return nil, err
	}
	answer, err := boundkeypair.Answer(botPriv, ch, now)
	if err != nil {
		return nil, err
	}
	f.clientSigns++
	jsKey, err := boundkeypair.NewSigningKey()
	if err != nil {
		return nil, err
	}
	f.jsKey = countingSigner{jsKey.Private, &f.serverSigns}
	state, err := jsKey.Sign(boundkeypair.JoinState{Issuer: "bench", Token: "bot", NodeID: "node", IssuedAt: now,
		InstanceID: "instance", BoundKey: bound.Fingerprint(), RecoverySequence: 1, RecoveryLimit: 10,
		RecoveryMode: boundkeypair.ModeStandard})
	if err != nil {
		return nil, err
	}
	f.answer, f.state = signingInput(answer), signingInput(state)
	f.ansSig, err = countingSigner{botPriv, &f.clientSigns}.Sign(nil, f.answer, crypto.Hash(0))
	if err != nil {
		return nil, err
	}
	// The handshakes' shapes, without and with the agent's certificate,
	// from real handshakes; then the client's CertificateVerify the
	// server's check verifies, over an input of the negotiated suite's
	// hash size.
	f.shapes = map[bool]*handshakeShape{}
	for _, present := range []bool{false, true} {
		if f.shapes[present], err = f.realHandshake(present); err != nil {
			return nil, err
		}
	}
	newHash, _, err := suiteHash(f.shapes[true].suite)
	if err != nil {
		return nil, err
	}
	if err := f.clientCertificateVerify(newHash().Size()); err != nil {
		return nil, err
	}
	return f, nil
}

// signingInput is what a compact JWS signs: its header and payload.
func signingInput(jws string) []byte {
	if i := strings.LastIndexByte(jws, '.'); i >= 0 {
		return []byte(jws[:i])
	}
	return []byte(jws)
}

// keyShare returns the server's work for one key share of group, the
// client's share made beforehand (clientShare): the timed function holds
// only its public bytes.
func (f *boundFixture) keyShare(group tls.CurveID) (func() error, error) {
	var curve ecdh.Curve
	hybrid := false
	switch group {
	case tls.X25519MLKEM768:
		curve, hybrid = ecdh.X25519(), true
	case tls.X25519:
		curve = ecdh.X25519()
	case tls.SecP256r1MLKEM768:
		curve, hybrid = ecdh.P256(), true
	case tls.CurveP256:
		curve = ecdh.P256()
	case tls.CurveP384:
		curve = ecdh.P384()
	default:
		return nil, fmt.Errorf("loadgen: no bound for the key-exchange group %s", group)
	}
	peerShare, ek, err := f.clientShare(curve, hybrid)
	if err != nil {
		return nil, err
	}
	return func() error {
		if hybrid {
			k, err := mlkem.NewEncapsulationKey768(ek)
			if err != nil {
				return err
			}
			k.Encapsulate()
		}
		pub, err := curve.NewPublicKey(peerShare)
		if err != nil {
			return err
		}
		priv, err := curve.GenerateKey(rand.Reader)
		if err != nil {
			return err
		}
		_ = priv.PublicKey().Bytes()
		_, err = priv.ECDH(pub)
		return err
	}, nil
}

// clientShare makes the client's key share, as a ClientHello carries it:
// its ECDH public key and, for a hybrid group, its ML-KEM-768
// encapsulation key. The client's work: never timed.
func (f *boundFixture) clientShare(curve ecdh.Curve, hybrid bool) (peerShare, ek []byte, err error) {
	f.clientShares++
	peer, err := curve.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	if hybrid {
		dk, err := mlkem.GenerateKey768()
		if err != nil {
			return nil, nil, err
		}
		ek = dk.EncapsulationKey().Bytes()
	}
	return peer.PublicKey().Bytes(), ek, nil
}

// step returns the function that does p once, for a handshake of shape
// hs when p is the handshake's.
func (f *boundFixture) step(p Primitive, hs *handshakeShape) (func() error, error) {
	switch p {
	case PrimKeyShare:
		return f.keyShare(hs.group)
	case PrimKeySchedule:
		return keySchedule(hs)
	case PrimClientCertificateVerify:
		return f.clientCertificateVerifyCheck()
	case PrimCertificateVerify:
		// TLS 1.3: 64 spaces, the context string, a zero byte and the
		// transcript hash, hashed again and signed.
		h, _, err := suiteHash(hs.suite)
		if err != nil {
			return nil, err
		}
		msg := certificateVerifyInput(true, h().Size())
		return func() error {
			d := sha256.Sum256(msg)
			_, err := f.srvKey.Sign(rand.Reader, d[:], crypto.SHA256)
			return err
		}, nil
	case PrimClientChain:
		issuer := f.h.Issuer(ca.RoleAgent).Cert
		return func() error { return f.leaf.CheckSignatureFrom(issuer) }, nil
	case PrimCSR:
		return f.csr.CheckSignature, nil
	case PrimCertificateSign:
		tbs := f.leaf.RawTBSCertificate
		return func() error {
			d := sha256.Sum256(tbs)
			_, err := f.issuer.Sign(rand.Reader, d[:], crypto.SHA256)
			return err
		}, nil
	case PrimTokenSecret, PrimPSK:
		return func() error {
			got, err := f.sealer.Open(f.sealed, f.nonce, []byte("token-id"))
			if err != nil {
				return err
			}
			if subtle.ConstantTimeCompare(got, f.secret) != 1 {
				return fmt.Errorf("loadgen: the sealed secret does not match")
			}
			return nil
		}, nil
	case PrimChallengeVerify:
		return func() error {
			if !ed25519.Verify(f.botPub, f.answer, f.ansSig) {
				return fmt.Errorf("loadgen: the answer's signature does not verify")
			}
			return nil
		}, nil
	case PrimJoinStateSign:
		return func() error {
			_, err := f.jsKey.Sign(nil, f.state, crypto.Hash(0))
			return err
		}, nil
	}
	return nil, fmt.Errorf("loadgen: unknown primitive %q", p)
}

// MeasureBound times the server's crypto for one request of op
// (ServerPrimitives says which), each primitive the best of boundRounds
// rounds of boundIterations, on this goroutine locked to its thread and
// timed by that thread's CPU clock where the system has one, so other work
// on the machine slows a round without counting in it.
func MeasureBound(op string, newConn bool) (*Bound, error) {
	if _, err := ServerPrimitives(op, newConn); err != nil {
		return nil, err
	}
	f, err := newBoundFixture()
	if err != nil {
		return nil, err
	}
	return f.measure(op, newConn)
}

// measure is MeasureBound on the fixture f.
func (f *boundFixture) measure(op string, newConn bool) (*Bound, error) {
	prims, err := ServerPrimitives(op, newConn)
	if err != nil {
		return nil, err
	}
	b := &Bound{}
	hs := f.shapes[presentsCertificate(op)]
	if newConn {
		b.Group, b.CipherSuite = hs.group.String(), tls.CipherSuiteName(hs.suite)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var names []string
	for _, p := range prims {
		step, err := f.step(p, hs)
		if err != nil {
			return nil, err
		}
		per, err := timeStep(step)
		if err != nil {
			return nil, err
		}
		what := primitiveWhat[p]
		switch p {
		case PrimKeyShare:
			what += ", " + b.Group
		case PrimKeySchedule:
			what += fmt.Sprintf(", %s, %d bytes of handshake messages", b.CipherSuite, hs.transcriptBytes())
		}
		b.Parts = append(b.Parts, BoundPart{Primitive: p, What: what, PerOp: per, Handshake: handshakePrimitive(p)})
		b.PerOp += per
		names = append(names, string(p))
	}
	if per, had := b.WithoutHandshake(); had {
		b.KeptConnection = per
	}
	b.What = strings.Join(names, " + ")
	b.PerCore = float64(time.Second) / float64(b.PerOp)
	return b, nil
}

// TimeCrypto times step as a bound times each of its primitives (the best
// of the rounds, on this goroutine locked to its thread, by the thread's
// CPU clock), for a benchmark that adds a primitive of its own to a
// bound.
func TimeCrypto(step func() error) (time.Duration, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return timeStep(step)
}

// timeStep is the best mean time of step over boundRounds rounds of
// boundIterations runs, after one untimed run that warms caches and
// lazily built tables.
func timeStep(step func() error) (time.Duration, error) {
	if err := step(); err != nil {
		return 0, err
	}
	best := time.Duration(0)
	for range boundRounds {
		start := threadClock()
		for range boundIterations {
			if err := step(); err != nil {
				return 0, err
			}
		}
		per := (threadClock() - start) / time.Duration(boundIterations)
		if per <= 0 {
			per = 1 // a clock too coarse for the round: never zero
		}
		if best == 0 || per < best {
			best = per
		}
	}
	return best, nil
}

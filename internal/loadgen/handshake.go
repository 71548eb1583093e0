package loadgen

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"fmt"
	"hash"
	"net"
	"sync"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/listener"
	"github.com/muster-dev/muster/internal/spiffeid"
)

// handshakeShape is what the bound takes from one real TLS 1.3 handshake
// between an agent's configuration and a server configured as the
// authority's listener: the key-exchange group and cipher suite the two
// negotiate, and the handshake messages the server hashes into its
// transcript (their bytes as sent, each with its 4-byte header).
type handshakeShape struct {
	group tls.CurveID
	suite uint16
	// clientHello and serverHello are the messages as sent (in the clear).
	clientHello, serverHello []byte
	// serverFlight is the sizes of the server's encrypted messages:
	// EncryptedExtensions, CertificateRequest, Certificate,
	// CertificateVerify, Finished.
	serverFlight []int
	// clientFlight is the sizes of the client's: Certificate (empty when
	// it presents none), CertificateVerify (only when it presents one),
	// Finished.
	clientFlight []int
}

// presents is whether the client presented a certificate, and so signed a
// CertificateVerify the server checks.
func (s *handshakeShape) presents() bool { return len(s.clientFlight) == 3 }

// transcriptBytes is how many bytes of handshake messages the server
// hashes into its transcript: every message above (the client's Finished
// too: crypto/tls hashes the one it expects, to derive the resumption
// secret).
func (s *handshakeShape) transcriptBytes() int {
	n := len(s.clientHello) + len(s.serverHello)
	for _, m := range s.serverFlight {
		n += m
	}
	for _, m := range s.clientFlight {
		n += m
	}
	return n
}

// recordingConn keeps a copy of every byte written through it.
type recordingConn struct {
	net.Conn
	mu      sync.Mutex
	written []byte
}

func (c *recordingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.written = append(c.written, p...)
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *recordingConn) bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.written
}

// TLS record types (RFC 8446 section 5.1).
const (
	recordChangeCipherSpec = 20
	recordHandshake        = 22
	recordApplicationData  = 23
	// aeadOverhead is what TLS 1.3 adds to a handshake message it encrypts:
	// the inner content type (one byte; crypto/tls adds no padding) and the
	// AEAD tag (16 bytes for every TLS 1.3 suite).
	aeadOverhead = 1 + 16
)

// flight splits what one side wrote during a handshake into its
// handshake messages in the clear (the hello) and the sizes of the ones it
// encrypted. crypto/tls writes each handshake message in a record of its
// own (none is larger than a record), so an encrypted record is one
// message of its length less aeadOverhead. A second message in the clear
// (a HelloRetryRequest and a second ClientHello) is refused: the bound's
// handshake has one round trip.
func flight(written []byte) (hello []byte, encrypted []int, err error) {
	for len(written) > 0 {
		if len(written) < 5 {
			return nil, nil, fmt.Errorf("loadgen: a truncated TLS record header")
		}
		typ, n := written[0], int(binary.BigEndian.Uint16(written[3:5]))
		if len(written) < 5+n {
			return nil, nil, fmt.Errorf("loadgen: a truncated TLS record")
		}
		body := written[5 : 5+n]
		written = written[5+n:]
		switch typ {
		case recordChangeCipherSpec: // the middlebox-compatibility one: not hashed
		case recordHandshake:
			if hello != nil {
				return nil, nil, fmt.Errorf("loadgen: the handshake took two rounds (a HelloRetryRequest)")
			}
			hello = body
		case recordApplicationData:
			if n <= aeadOverhead {
				return nil, nil, fmt.Errorf("loadgen: an encrypted record of %d bytes", n)
			}
			encrypted = append(encrypted, n-aeadOverhead)
		default:
			return nil, nil, fmt.Errorf("loadgen: a TLS record of type %d during the handshake", typ)
		}
	}
	if hello == nil {
		return nil, nil, fmt.Errorf("loadgen: no hello in the handshake")
	}
	return hello, encrypted, nil
}

// realHandshake runs one TLS handshake between an agent's configuration
// (identity.ClientTLS, presenting the agent's identity when present) and
// a server configured as the authority's agent listener is
// (authority.Server.serverTLS: no group or suite preference of its own,
// a client certificate requested and not required, the agent and admin
// intermediates named in the CertificateRequest, the leaf, intermediate
// and root presented; session tickets off, which changes nothing here: an
// agent keeps no session cache, so it asks for no ticket) and returns its
// shape. Nothing in it is timed; the client's CertificateVerify
// is signed by the agent's counting key, so it counts among the client's
// signatures made while the fixture is made.
func (f *boundFixture) realHandshake(present bool) (*handshakeShape, error) {
	srvLeaf, err := f.h.Issuer(ca.RoleServer).Issue(ca.LeafRequest{PublicKey: f.srvKey.Public(), SPIFFEID: f.id.URL(),
		CommonName: "bench", ServerAuth: true, NotBefore: time.Now(), TTL: time.Hour})
	if err != nil {
		return nil, err
	}
	issuers := x509.NewCertPool()
	issuers.AddCert(f.h.Issuer(ca.RoleAgent).Cert)
	issuers.AddCert(f.h.Issuer(ca.RoleAdmin).Cert)
	srvConf := listener.ServerTLS("h2")
	srvConf.ClientAuth, srvConf.ClientCAs = tls.RequestClientCert, issuers
	srvConf.Certificates = []tls.Certificate{{Certificate: [][]byte{srvLeaf.Raw, f.h.Issuer(ca.RoleServer).Cert.Raw, f.h.Root.Raw},
		PrivateKey: f.srvKey.(countingSigner).Signer, Leaf: srvLeaf}} // not counted: this handshake is not timed
	var id *identity.Identity
	if present {
		id = &identity.Identity{Chain: []*x509.Certificate{f.leaf, f.h.Issuer(ca.RoleAgent).Cert}, Key: f.agent,
			Roots: []*x509.Certificate{f.h.Root}}
	}
	cliConf := identity.ClientTLS(id, f.h.RootPool(), func(spiffeid.ID) error { return nil })
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	cw, sw := &recordingConn{Conn: a}, &recordingConn{Conn: b}
	type result struct {
		st  tls.ConnectionState
		err error
	}
	done := make(chan result, 1)
	go func() {
		s := tls.Server(sw, srvConf)
		err := s.Handshake()
		done <- result{s.ConnectionState(), err}
	}()
	cerr := tls.Client(cw, cliConf).Handshake()
	r := <-done
	if r.err != nil {
		return nil, r.err
	}
	if cerr != nil {
		return nil, cerr
	}
	if r.st.Version != tls.VersionTLS13 {
		return nil, fmt.Errorf("loadgen: the bound's handshake negotiated %s: want TLS 1.3", tls.VersionName(r.st.Version))
	}
	if got := len(r.st.PeerCertificates) > 0; got != present {
		return nil, fmt.Errorf("loadgen: the client presented a certificate %v: want %v", got, present)
	}
	s := &handshakeShape{group: r.st.CurveID, suite: r.st.CipherSuite}
	if s.clientHello, s.clientFlight, err = flight(cw.bytes()); err != nil {
		return nil, err
	}
	if s.serverHello, s.serverFlight, err = flight(sw.bytes()); err != nil {
		return nil, err
	}
	wantClient := 2
	if present {
		wantClient = 3
	}
	if len(s.serverFlight) != 5 || len(s.clientFlight) != wantClient {
		return nil, fmt.Errorf("loadgen: the handshake's flights had %d and %d encrypted messages: want 5 and %d",
			len(s.serverFlight), len(s.clientFlight), wantClient)
	}
	return s, nil
}

// suiteHash is the hash of a TLS 1.3 cipher suite, and its traffic key's
// length.
func suiteHash(suite uint16) (func() hash.Hash, int, error) {
	switch suite {
	case tls.TLS_AES_128_GCM_SHA256:
		return sha256.New, 16, nil
	case tls.TLS_CHACHA20_POLY1305_SHA256:
		return sha256.New, 32, nil
	case tls.TLS_AES_256_GCM_SHA384:
		return sha512.New384, 32, nil
	}
	return nil, 0, fmt.Errorf("loadgen: no bound for the cipher suite %s", tls.CipherSuiteName(suite))
}

// sharedSecretSize is the length of a key exchange's shared secret: the
// ML-KEM-768 secret and the ECDH one for a hybrid group.
func sharedSecretSize(group tls.CurveID) (int, error) {
	switch group {
	case tls.X25519MLKEM768, tls.SecP256r1MLKEM768:
		return 32 + 32, nil
	case tls.X25519, tls.CurveP256:
		return 32, nil
	case tls.CurveP384:
		return 48, nil
	}
	return 0, fmt.Errorf("loadgen: no bound for the key-exchange group %s", group)
}

// keySchedule returns the server's TLS 1.3 key schedule and transcript
// hash for a handshake of shape s, as crypto/tls's server computes them
// (handshake_server_tls13.go, crypto/internal/fips140/tls13) with no PSK:
// the transcript hash over every handshake message, taken wherever the
// server takes it; HKDF-Extract of the early, handshake and master
// secrets; Derive-Secret of "derived" (twice), the client and server
// handshake and application traffic secrets, the exporter master secret
// (crypto/tls derives it on every handshake) and the resumption master
// secret (derived with session tickets off too); the traffic key and IV of
// each of the four traffic secrets the server installs (HKDF-Expand-Label
// "key" and "iv"); the server's and the client's finished keys and their
// HMACs over the transcript, and the comparison of the client's. Not
// counted: the AES-GCM (or ChaCha20) key set up from each traffic key and
// the record encryption with it (symmetric, per byte of data, a record
// layer cost rather than the handshake's), and the CertificateVerify
// signature's and check's own hashing (in their primitives).
func keySchedule(s *handshakeShape) (func() error, error) {
	h, keyLen, err := suiteHash(s.suite)
	if err != nil {
		return nil, err
	}
	n, err := sharedSecretSize(s.group)
	if err != nil {
		return nil, err
	}
	shared := make([]byte, n)
	if _, err := rand.Read(shared); err != nil {
		return nil, err
	}
	msg := func(n int) []byte { return make([]byte, n) }
	ee, cr, cert, cv, fin := msg(s.serverFlight[0]), msg(s.serverFlight[1]), msg(s.serverFlight[2]), msg(s.serverFlight[3]), msg(s.serverFlight[4])
	var clientCert, clientCV, clientFin []byte
	clientCert, clientFin = msg(s.clientFlight[0]), msg(s.clientFlight[len(s.clientFlight)-1])
	if s.presents() {
		clientCV = msg(s.clientFlight[1])
	}
	size := h().Size()
	// expandLabel is HKDF-Expand-Label (RFC 8446 section 7.1).
	expandLabel := func(secret []byte, label string, context []byte, length int) ([]byte, error) {
		info := make([]byte, 0, 2+1+6+len(label)+1+len(context))
		info = binary.BigEndian.AppendUint16(info, uint16(length))
		info = append(info, byte(6+len(label)))
		info = append(info, "tls13 "...)
		info = append(info, label...)
		info = append(info, byte(len(context)))
		info = append(info, context...)
		return hkdf.Expand(h, secret, string(info), length)
	}
	// deriveSecret is Derive-Secret: the transcript's hash so far (an
	// empty one's for "derived") expanded under label.
	deriveSecret := func(secret []byte, label string, transcript hash.Hash) ([]byte, error) {
		if transcript == nil {
			transcript = h()
		}
		return expandLabel(secret, label, transcript.Sum(nil), size)
	}
	// trafficKey is a traffic secret's key and IV (RFC 8446 section 7.3).
	trafficKey := func(secret []byte) error {
		if _, err := expandLabel(secret, "key", nil, keyLen); err != nil {
			return err
		}
		_, err := expandLabel(secret, "iv", nil, 12)
		return err
	}
	// finished is a Finished message's verify_data (RFC 8446 section 4.4.4).
	finished := func(base []byte, transcript hash.Hash) ([]byte, error) {
		key, err := expandLabel(base, "finished", nil, size)
		if err != nil {
			return nil, err
		}
		mac := hmac.New(h, key)
		mac.Write(transcript.Sum(nil))
		return mac.Sum(nil), nil
	}
	return func() error {
		t := h()
		t.Write(s.clientHello)
		t.Write(s.serverHello)
		early, err := hkdf.Extract(h, make([]byte, size), nil)
		if err != nil {
			return err
		}
		derived, err := deriveSecret(early, "derived", nil)
		if err != nil {
			return err
		}
		hsSecret, err := hkdf.Extract(h, shared, derived)
		if err != nil {
			return err
		}
		serverHS, err := deriveSecret(hsSecret, "s hs traffic", t)
		if err != nil {
			return err
		}
		if err := trafficKey(serverHS); err != nil {
			return err
		}
		clientHS, err := deriveSecret(hsSecret, "c hs traffic", t)
		if err != nil {
			return err
		}
		if err := trafficKey(clientHS); err != nil {
			return err
		}
		t.Write(ee)
		t.Write(cr)
		t.Write(cert)
		_ = t.Sum(nil) // the hash the server's CertificateVerify signs
		t.Write(cv)
		if _, err := finished(serverHS, t); err != nil {
			return err
		}
		t.Write(fin)
		if derived, err = deriveSecret(hsSecret, "derived", nil); err != nil {
			return err
		}
		master, err := hkdf.Extract(h, make([]byte, size), derived)
		if err != nil {
			return err
		}
		clientAP, err := deriveSecret(master, "c ap traffic", t)
		if err != nil {
			return err
		}
		serverAP, err := deriveSecret(master, "s ap traffic", t)
		if err != nil {
			return err
		}
		if err := trafficKey(serverAP); err != nil {
			return err
		}
		if _, err := deriveSecret(master, "exp master", t); err != nil {
			return err
		}
		t.Write(clientCert)
		if clientCV != nil {
			_ = t.Sum(nil) // the hash the client's CertificateVerify signed
			t.Write(clientCV)
		}
		want, err := finished(clientHS, t)
		if err != nil {
			return err
		}
		t.Write(clientFin)
		if _, err := deriveSecret(master, "res master", t); err != nil {
			return err
		}
		if !hmac.Equal(want, want) {
			return fmt.Errorf("loadgen: the client's Finished does not match")
		}
		return trafficKey(clientAP)
	}, nil
}

// certificateVerifyInput is what a TLS 1.3 CertificateVerify signs (RFC
// 8446 section 4.4.3): 64 spaces, the context string, a zero byte and the
// transcript hash (size bytes).
func certificateVerifyInput(server bool, size int) []byte {
	context := "TLS 1.3, client CertificateVerify\x00"
	if server {
		context = "TLS 1.3, server CertificateVerify\x00"
	}
	msg := make([]byte, 0, 64+len(context)+size)
	for range 64 {
		msg = append(msg, ' ')
	}
	msg = append(msg, context...)
	transcript := make([]byte, size)
	if _, err := rand.Read(transcript); err != nil {
		panic(err) // crypto/rand does not fail
	}
	return append(msg, transcript...)
}

// clientCertificateVerify makes the client's CertificateVerify signature
// the server checks: by the agent's key (the client's, counted), over the
// input of a handshake whose suite hashes with size bytes.
func (f *boundFixture) clientCertificateVerify(size int) error {
	f.clientCVMsg = certificateVerifyInput(false, size)
	d := sha256.Sum256(f.clientCVMsg)
	sig, err := f.agent.Sign(rand.Reader, d[:], crypto.SHA256)
	if err != nil {
		return err
	}
	f.clientCVSig = sig
	return nil
}

// clientCertificateVerifyCheck is the server's check of the client's
// CertificateVerify, as crypto/tls's verifyHandshakeSignature does it for
// ecdsa_secp256r1_sha256: SHA-256 of the signed input and one ECDSA P-256
// verification with the public key of the certificate presented.
func (f *boundFixture) clientCertificateVerifyCheck() (func() error, error) {
	pub, ok := f.leaf.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("loadgen: the agent's key is a %T", f.leaf.PublicKey)
	}
	if f.clientCVSig == nil {
		return nil, fmt.Errorf("loadgen: no client CertificateVerify was made with the fixture")
	}
	return func() error {
		d := sha256.Sum256(f.clientCVMsg)
		if !ecdsa.VerifyASN1(pub, d[:], f.clientCVSig) {
			return fmt.Errorf("loadgen: the client's CertificateVerify does not verify")
		}
		return nil
	}, nil
}

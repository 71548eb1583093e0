package loadgen

import (
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/tls"
	"slices"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/ca"
)

// TestServerPrimitives is the bound's definition: the crypto the
// authority must do for each operation, and nothing the client does. A
// new connection adds the server's key share, key schedule and transcript
// hash and CertificateVerify signature, and, where the request presents
// the agent's certificate, that certificate's check and the check of the
// client's CertificateVerify (its proof of holding the key); a request
// on a kept connection pays none of them.
func TestServerPrimitives(t *testing.T) {
	hs := []Primitive{PrimKeyShare, PrimKeySchedule, PrimCertificateVerify}
	mtls := []Primitive{PrimKeyShare, PrimKeySchedule, PrimCertificateVerify, PrimClientChain, PrimClientCertificateVerify}
	issue := []Primitive{PrimCSR, PrimCertificateSign}
	bound := []Primitive{PrimChallengeVerify, PrimJoinStateSign}
	cat := func(ps ...[]Primitive) []Primitive { return slices.Concat(ps...) }
	for _, tc := range []struct {
		name    string
		op      string
		newConn bool
		want    []Primitive
	}{
		{"token join, new connection", OpTokenJoin, true, cat(hs, []Primitive{PrimTokenSecret}, issue)},
		{"token join, kept connection", OpTokenJoin, false, cat([]Primitive{PrimTokenSecret}, issue)},
		{"PSK join, new connection", OpPSKJoin, true, cat(hs, []Primitive{PrimPSK}, issue)},
		{"PSK join, kept connection", OpPSKJoin, false, cat([]Primitive{PrimPSK}, issue)},
		// A renewal presents the agent's certificate: a new connection
		// checks it (one ECDSA verify against the agent intermediate)
		// and the client's CertificateVerify (another).
		{"renewal, new connection", OpRenew, true, cat(mtls, issue)},
		// On a kept connection the handshake, the certificate's check
		// included, is done: the CSR and the certificate are left.
		{"renewal, kept connection", OpRenew, false, issue},
		{"bound-keypair recovery, new connection", OpBoundRecovery, true, cat(hs, bound, issue)},
		{"bound-keypair recovery, kept connection", OpBoundRecovery, false, cat(bound, issue)},
		{"bound-keypair refresh, new connection", OpBoundRefresh, true, cat(mtls, bound, issue)},
		{"bound-keypair refresh, kept connection", OpBoundRefresh, false, cat(bound, issue)},
	} {
		got, err := ServerPrimitives(tc.op, tc.newConn)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: ServerPrimitives(%s, new connection %v) = %v, %v: want %v", tc.name, tc.op, tc.newConn, got, err, tc.want)
		}
		for _, p := range got {
			if primitiveWhat[p] == "" {
				t.Errorf("%s: primitive %q is not described", tc.name, p)
			}
			// On a kept connection nothing of the handshake is left.
			if !tc.newConn && handshakePrimitive(p) {
				t.Errorf("%s: the handshake's %q is counted on a kept connection", tc.name, p)
			}
		}
	}
	if _, err := ServerPrimitives(OpStream, true); err == nil {
		t.Error("a stream has no bound, and one was defined")
	}
}

// TestBoundCountsNoClientWork holds the measured bound to the server's
// side: every key of the fixture counts its signatures by the side that
// holds it. While a bound is timed the client's keys (the agent's, whose
// CertificateVerify and CSR signature are the client's; the bot's, which
// answers the challenge) sign nothing and the client's key share is made
// once, before the rounds; the server's keys sign exactly once per timed
// run of each of its signing primitives (CertificateVerify, the
// certificate, the join state). The client's CertificateVerify that the
// server's check verifies is signed by the agent's counted key while the
// fixture is made. Timing the client's CertificateVerify signature (for
// the server's check of it, say) or key share, or a signature made with
// the wrong side's key, fails here.
func TestBoundCountsNoClientWork(t *testing.T) {
	defer func(n, r int) { boundIterations, boundRounds = n, r }(boundIterations, boundRounds)
	boundIterations, boundRounds = 3, 2
	runs := 1 + boundIterations*boundRounds // one untimed warm-up, then the rounds
	for _, op := range []string{OpTokenJoin, OpPSKJoin, OpRenew, OpBoundRecovery, OpBoundRefresh} {
		for _, newConn := range []bool{true, false} {
			f, err := newBoundFixture()
			if err != nil {
				t.Fatal(err)
			}
			server, client := f.serverSigns, f.clientSigns
			if server != 0 || client == 0 || f.clientShares != 0 {
				t.Fatalf("fixture made with %d server and %d client signatures, %d client key shares: want 0, some, 0",
					server, client, f.clientShares)
			}
			// The client's CertificateVerify is the agent key's, made now.
			d := sha256.Sum256(f.clientCVMsg)
			if !ecdsa.VerifyASN1(f.agent.Public().(*ecdsa.PublicKey), d[:], f.clientCVSig) {
				t.Fatal("the fixture's client CertificateVerify is not the agent key's signature")
			}
			b, err := f.measure(op, newConn)
			if err != nil {
				t.Fatal(err)
			}
			wantServer, wantShares := 0, 0
			for _, p := range b.Parts {
				switch p.Primitive {
				case PrimCertificateVerify, PrimCertificateSign, PrimJoinStateSign:
					wantServer += runs
				case PrimKeyShare:
					wantShares++
				}
			}
			if got := f.clientSigns - client; got != 0 {
				t.Errorf("%s (new connection %v): the client's keys signed %d times while the bound was timed", op, newConn, got)
			}
			if got := f.serverSigns - server; got != wantServer {
				t.Errorf("%s (new connection %v): the server's keys signed %d times: want %d", op, newConn, got, wantServer)
			}
			if f.clientShares != wantShares {
				t.Errorf("%s (new connection %v): %d client key shares made: want %d, before the rounds", op, newConn, f.clientShares, wantShares)
			}
		}
	}
}

// TestMeasureBoundParts checks that a measured bound times exactly the
// primitives of its definition, each once, marks the handshake's, names
// the key-exchange group an agent and the authority negotiate, and sums
// to its parts.
func TestMeasureBoundParts(t *testing.T) {
	defer func(n, r int) { boundIterations, boundRounds = n, r }(boundIterations, boundRounds)
	boundIterations, boundRounds = 2, 2
	for _, tc := range []struct {
		op      string
		newConn bool
	}{
		{OpTokenJoin, true}, {OpTokenJoin, false}, {OpPSKJoin, true}, {OpRenew, true}, {OpRenew, false},
		{OpBoundRecovery, true}, {OpBoundRecovery, false}, {OpBoundRefresh, true}, {OpBoundRefresh, false},
	} {
		name := tc.op + "/shared"
		if tc.newConn {
			name = tc.op + "/new"
		}
		t.Run(name, func(t *testing.T) {
			want, err := ServerPrimitives(tc.op, tc.newConn)
			if err != nil {
				t.Fatal(err)
			}
			b, err := MeasureBound(tc.op, tc.newConn)
			if err != nil {
				t.Fatal(err)
			}
			kept, err := ServerPrimitives(tc.op, false)
			if err != nil {
				t.Fatal(err)
			}
			var got, gotOwn []Primitive
			var sum, own int64
			for _, p := range b.Parts {
				got = append(got, p.Primitive)
				if !p.Handshake {
					gotOwn = append(gotOwn, p.Primitive)
				}
				if p.PerOp <= 0 || p.What == "" {
					t.Errorf("part %+v: want it timed and described", p)
				}
				if p.Handshake != handshakePrimitive(p.Primitive) {
					t.Errorf("part %q: handshake %v", p.Primitive, p.Handshake)
				}
				sum += int64(p.PerOp)
				if !p.Handshake {
					own += int64(p.PerOp)
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("parts %v: want %v", got, want)
			}
			// What is left without the handshake is the bound of the
			// same operation on a kept connection.
			if !slices.Equal(gotOwn, kept) {
				t.Errorf("parts outside the handshake %v: want a kept connection's %v", gotOwn, kept)
			}
			if int64(b.PerOp) != sum || b.PerCore <= 0 {
				t.Errorf("per op %v, per core %v: want the sum of the parts, %v", b.PerOp, b.PerCore, sum)
			}
			hasHandshake := slices.Contains(want, PrimKeyShare)
			if (b.Group != "") != hasHandshake {
				t.Errorf("group %q with a handshake %v", b.Group, hasHandshake)
			}
			if hasHandshake && b.Group != "X25519MLKEM768" {
				// Go's default at both ends; a change of it changes the
				// bound, and should be seen.
				t.Errorf("negotiated group %s: want X25519MLKEM768", b.Group)
			}
			if (b.CipherSuite != "") != hasHandshake || (hasHandshake && b.CipherSuite != "TLS_AES_128_GCM_SHA256") {
				// The same: with AES hardware at both ends Go picks
				// AES-128-GCM, whose hash (SHA-256) the key schedule uses.
				t.Errorf("cipher suite %q with a handshake %v: want TLS_AES_128_GCM_SHA256", b.CipherSuite, hasHandshake)
			}
			per, had := b.WithoutHandshake()
			if had != hasHandshake || int64(per) != own || (had && b.KeptConnection != per) || (!had && b.KeptConnection != 0) {
				t.Errorf("WithoutHandshake = %v, %v, kept connection %v: want %v, %v", per, had, b.KeptConnection, own, hasHandshake)
			}
		})
	}
	if _, err := MeasureBound(OpStream, true); err == nil {
		t.Error("a stream has no bound, and one was measured")
	}
}

// TestHandshakeShape checks the handshake the key schedule's transcript is
// sized from: a real one between an agent's configuration and a server
// configured as the authority's listener, one round trip, TLS 1.3. Its
// ClientHello carries the ML-KEM-768 encapsulation key (1,184 bytes), its
// ServerHello the ciphertext (1,088); the server's Certificate holds its
// three certificates; an agent presenting its certificate sends its leaf
// alone (the authority names the leaf's issuer) and a CertificateVerify,
// and a joining one an empty Certificate and none.
func TestHandshakeShape(t *testing.T) {
	defer func(n, r int) { boundIterations, boundRounds = n, r }(boundIterations, boundRounds)
	boundIterations, boundRounds = 2, 1
	f, err := newBoundFixture()
	if err != nil {
		t.Fatal(err)
	}
	for _, present := range []bool{false, true} {
		s := f.shapes[present]
		if s.group != tls.X25519MLKEM768 || s.suite != tls.TLS_AES_128_GCM_SHA256 {
			t.Errorf("present %v: %s, %s: want X25519MLKEM768, TLS_AES_128_GCM_SHA256", present, s.group, tls.CipherSuiteName(s.suite))
		}
		if s.presents() != present {
			t.Errorf("present %v: the client's flight %v", present, s.clientFlight)
		}
		if s.clientHello[0] != 1 || len(s.clientHello) < 1184+32 || s.serverHello[0] != 2 || len(s.serverHello) < 1088+32 {
			t.Errorf("present %v: ClientHello of %d bytes (type %d), ServerHello of %d (type %d)", present,
				len(s.clientHello), s.clientHello[0], len(s.serverHello), s.serverHello[0])
		}
		chain := len(f.h.Issuer(ca.RoleServer).Cert.Raw) + len(f.h.Root.Raw)
		if cert := s.serverFlight[2]; cert < chain {
			t.Errorf("present %v: the server's Certificate of %d bytes: want more than its intermediate and root, %d", present, cert, chain)
		}
		if fin := s.serverFlight[4]; fin != 4+sha256.Size {
			t.Errorf("present %v: the server's Finished of %d bytes: want %d", present, fin, 4+sha256.Size)
		}
		if fin := s.clientFlight[len(s.clientFlight)-1]; fin != 4+sha256.Size {
			t.Errorf("present %v: the client's Finished of %d bytes: want %d", present, fin, 4+sha256.Size)
		}
		cert := s.clientFlight[0]
		if present && (cert < len(f.leaf.Raw) || cert >= len(f.leaf.Raw)+len(f.h.Issuer(ca.RoleAgent).Cert.Raw)) {
			t.Errorf("the client's Certificate of %d bytes: want its leaf (%d bytes) alone", cert, len(f.leaf.Raw))
		}
		if !present && cert > 8 {
			t.Errorf("a joining client's Certificate of %d bytes: want an empty one", cert)
		}
	}
	b, err := f.measure(OpRenew, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range b.Parts {
		if p.Primitive == PrimKeySchedule && !strings.Contains(p.What, "TLS_AES_128_GCM_SHA256") {
			t.Errorf("the key schedule's part %q does not name its suite", p.What)
		}
	}
}

// TestFlight checks how a side's handshake bytes are split: the hello in
// the clear, the middlebox ChangeCipherSpec skipped, each encrypted record
// one message of its length less the inner type and the tag; a second
// hello (a HelloRetryRequest round), another record type or a truncated
// record is refused rather than sized wrongly.
func TestFlight(t *testing.T) {
	record := func(typ byte, n int) []byte {
		return append([]byte{typ, 3, 3, byte(n >> 8), byte(n)}, make([]byte, n)...)
	}
	cat := func(rs ...[]byte) []byte { return slices.Concat(rs...) }
	hello, enc, err := flight(cat(record(22, 90), record(20, 1), record(23, 17+15), record(23, 17+1345)))
	if err != nil || len(hello) != 90 || !slices.Equal(enc, []int{15, 1345}) {
		t.Errorf("flight = %d-byte hello, %v, %v: want 90, [15 1345], nil", len(hello), enc, err)
	}
	for name, b := range map[string][]byte{
		"two hellos":         cat(record(22, 90), record(22, 90)),
		"an alert":           cat(record(22, 90), record(21, 2)),
		"no hello":           record(23, 40),
		"a truncated":        record(22, 90)[:50],
		"an empty record":    cat(record(22, 90), record(23, 17)),
		"a truncated header": []byte{22, 3},
	} {
		if _, _, err := flight(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

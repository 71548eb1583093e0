package loadgen

import (
	"slices"
	"testing"
)

// TestServerPrimitives is the bound's definition: the crypto the
// authority must do for each operation, and nothing the client does. A
// new connection adds the server's key share and CertificateVerify
// signature, and the agent's certificate's check where the request
// presents one; a request on a kept connection pays none of them.
func TestServerPrimitives(t *testing.T) {
	hs := []Primitive{PrimKeyShare, PrimCertificateVerify}
	mtls := []Primitive{PrimKeyShare, PrimCertificateVerify, PrimClientChain}
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
		// checks it (one ECDSA verify against the agent intermediate).
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
// certificate, the join state). Timing the client's CertificateVerify or
// key share, or a signature made with the wrong side's key, fails here.
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

package loadgen

import (
	"slices"
	"testing"
)

// TestServerPrimitives is the bound's definition: the crypto the
// authority must do for each operation, and nothing the client does. A
// new connection adds the server's key share and CertificateVerify
// signature; a request presenting the agent's certificate adds its check
// and always pays a handshake (it cannot share a connection).
func TestServerPrimitives(t *testing.T) {
	hs := []Primitive{PrimKeyShare, PrimCertificateVerify}
	mtls := []Primitive{PrimKeyShare, PrimCertificateVerify, PrimClientChain}
	issue := []Primitive{PrimCSR, PrimCertificateSign}
	cat := func(ps ...[]Primitive) []Primitive { return slices.Concat(ps...) }
	for _, tc := range []struct {
		op      string
		newConn bool
		want    []Primitive
	}{
		{OpTokenJoin, true, cat(hs, []Primitive{PrimTokenSecret}, issue)},
		{OpTokenJoin, false, cat([]Primitive{PrimTokenSecret}, issue)},
		{OpPSKJoin, true, cat(hs, []Primitive{PrimPSK}, issue)},
		{OpPSKJoin, false, cat([]Primitive{PrimPSK}, issue)},
		{OpRenew, true, cat(mtls, issue)},
		{OpRenew, false, cat(mtls, issue)},
		{OpBoundRecovery, true, cat(hs, []Primitive{PrimChallengeVerify, PrimJoinStateSign}, issue)},
		{OpBoundRecovery, false, []Primitive{PrimChallengeVerify, PrimJoinStateSign, PrimCSR, PrimCertificateSign}},
		{OpBoundRefresh, true, cat(mtls, []Primitive{PrimChallengeVerify, PrimJoinStateSign}, issue)},
	} {
		got, err := ServerPrimitives(tc.op, tc.newConn)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ServerPrimitives(%s, new connection %v) = %v, %v: want %v", tc.op, tc.newConn, got, err, tc.want)
		}
		for _, p := range got {
			if primitiveWhat[p] == "" {
				t.Errorf("%s: primitive %q is not described", tc.op, p)
			}
		}
	}
	if _, err := ServerPrimitives(OpStream, true); err == nil {
		t.Error("a stream has no bound, and one was defined")
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
		{OpTokenJoin, true}, {OpTokenJoin, false}, {OpPSKJoin, true}, {OpRenew, true},
		{OpBoundRecovery, true}, {OpBoundRecovery, false}, {OpBoundRefresh, true},
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
			var got []Primitive
			var sum, own int64
			for _, p := range b.Parts {
				got = append(got, p.Primitive)
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
			if had != hasHandshake || int64(per) != own {
				t.Errorf("WithoutHandshake = %v, %v: want %v, %v", per, had, own, hasHandshake)
			}
		})
	}
	if _, err := MeasureBound(OpStream, true); err == nil {
		t.Error("a stream has no bound, and one was measured")
	}
}

package loadgen

import (
	"strings"
	"testing"
)

// TestMeasureBoundParts checks which crypto each operation's bound counts:
// a request on a new connection pays that connection's handshake (with
// the agent's certificate when the request presents one), a join on a
// shared connection does not, and the whole is the sum of its parts.
func TestMeasureBoundParts(t *testing.T) {
	defer func(n int) { boundIterations = n }(boundIterations)
	boundIterations = 3
	const (
		serverAuth = "server certificate only"
		mutual     = "with a client certificate"
		recovery   = "Ed25519"
		issuance   = "CSR signature check"
	)
	for _, tc := range []struct {
		op      string
		newConn bool
		parts   []string
	}{
		{OpTokenJoin, true, []string{serverAuth, issuance}},
		{OpTokenJoin, false, []string{issuance}},
		{OpPSKJoin, true, []string{serverAuth, issuance}},
		{OpPSKJoin, false, []string{issuance}},
		{OpBoundRecovery, true, []string{serverAuth, recovery, issuance}},
		{OpBoundRecovery, false, []string{recovery, issuance}},
		{OpRenew, true, []string{mutual, issuance}},
		{OpBoundRefresh, true, []string{mutual, recovery, issuance}},
	} {
		name := tc.op + "/shared"
		if tc.newConn {
			name = tc.op + "/new"
		}
		t.Run(name, func(t *testing.T) {
			b, err := MeasureBound(tc.op, tc.newConn)
			if err != nil {
				t.Fatal(err)
			}
			if len(b.Parts) != len(tc.parts) {
				t.Fatalf("parts %+v: want %d (%v)", b.Parts, len(tc.parts), tc.parts)
			}
			var sum, own int64
			for i, p := range b.Parts {
				if !strings.Contains(p.What, tc.parts[i]) || p.PerOp <= 0 {
					t.Errorf("part %d = %q, %v: want %q, timed", i, p.What, p.PerOp, tc.parts[i])
				}
				if hs := strings.Contains(p.What, "handshake"); hs != p.Handshake {
					t.Errorf("part %q: handshake %v", p.What, p.Handshake)
				}
				sum += int64(p.PerOp)
				if !p.Handshake {
					own += int64(p.PerOp)
				}
			}
			if int64(b.PerOp) != sum || b.PerCore <= 0 {
				t.Errorf("per op %v, per core %v: want the sum of the parts, %v", b.PerOp, b.PerCore, sum)
			}
			per, had := b.WithoutHandshake()
			if had != (tc.newConn || tc.op == OpRenew || tc.op == OpBoundRefresh) || int64(per) != own {
				t.Errorf("WithoutHandshake = %v, %v: want %v", per, had, own)
			}
		})
	}
	if _, err := MeasureBound(OpStream, true); err == nil {
		t.Error("a stream has no bound, and one was measured")
	}
}

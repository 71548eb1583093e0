package ca

import "testing"

// TestNewSerial: serials are positive, at most 128 bits, not repeated,
// and cost two allocations (three under the race detector; rand.Int took
// five).
func TestNewSerial(t *testing.T) {
	seen := map[string]bool{}
	long := 0
	for range 1000 {
		s, err := NewSerial()
		if err != nil {
			t.Fatal(err)
		}
		if s.Sign() <= 0 || s.BitLen() > 128 {
			t.Fatalf("serial %x: want positive and at most 128 bits", s)
		}
		if s.BitLen() > 120 {
			long++
		}
		if seen[s.String()] {
			t.Fatalf("serial %x repeated", s)
		}
		seen[s.String()] = true
	}
	if long < 900 {
		t.Errorf("%d of 1000 serials longer than 120 bits: not uniform over 128", long)
	}
	if n := testing.AllocsPerRun(100, func() { NewSerial() }); n > 3 {
		t.Errorf("NewSerial: %.0f allocations, want at most 3", n)
	}
}

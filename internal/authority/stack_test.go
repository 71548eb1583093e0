package authority

import (
	"testing"
	"time"
)

// apart must return only once f has: Connect reads what f wrote (the
// stream's row, its context) without a lock.
func TestApartWaitsForF(t *testing.T) {
	done := false
	apart(func() {
		time.Sleep(10 * time.Millisecond)
		done = true
	})
	if !done {
		t.Fatal("apart returned before f did")
	}
}

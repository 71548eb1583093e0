package authority

import (
	"net"
	"testing"
	"time"
)

// A refused connection kept to tell its client why gives its place back
// at the end of its life even when nothing closes the wrapper (gRPC
// closes only the raw connection when its transport fails to start), and
// only once however it ends.
func TestRefusedConnFreesItsPlaceAtTheEndOfItsLife(t *testing.T) {
	for _, tc := range []struct {
		name string
		life time.Duration
		// closeAfter: the wrapper is closed after its life ended (the
		// place freed already); closeFirst: before.
		closeAfter, closeFirst bool
	}{
		{name: "nothing closes it", life: time.Millisecond},
		{name: "closed after its life", life: time.Millisecond, closeAfter: true},
		{name: "closed first", life: time.Hour, closeFirst: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := net.Pipe()
			defer b.Close()
			freed := make(chan struct{}, 2)
			rc := keepRefusedConn(a, func() { freed <- struct{}{} }, tc.life)
			if tc.closeFirst {
				rc.Close()
			}
			select {
			case <-freed:
			case <-time.After(30 * time.Second):
				t.Fatal("the place was not freed at the end of its life")
			}
			if tc.closeAfter {
				rc.Close()
			}
			if _, err := a.Write([]byte("x")); err == nil {
				t.Error("the connection is open after its place was freed")
			}
			select {
			case <-freed:
				t.Error("the place was freed twice")
			case <-time.After(10 * time.Millisecond):
			}
		})
	}
}

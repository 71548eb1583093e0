package authority

import (
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
)

// passCreds is a TLS handshake that succeeds at once with no client
// certificate: an anonymous connection.
type passCreds struct {
	credentials.TransportCredentials
}

func (passCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return raw, credentials.TLSInfo{}, nil
}

// anonHeld is how many anonymous places s holds.
func anonHeld(s *Server) int {
	s.shares.mu.Lock()
	defer s.shares.mu.Unlock()
	return s.shares.anon
}

// An accepted connection gives its place in its share back whatever
// closes it: when gRPC's transport fails to start after the handshake
// (a client that reset the connection), gRPC closes only the raw
// connection, never the wrapper the handshake returned, and the place
// was held for good; enough of them and every anonymous connection (a
// join, a bootstrap) was refused. Once a transport has started on it
// (read from it), the wrapper's Close frees it, once.
func TestAcceptedConnFreesItsPlaceWhateverClosesIt(t *testing.T) {
	for _, tc := range []struct {
		name string
		// started: a transport reads from the wrapper first.
		started bool
	}{
		{name: "transport never started, gRPC closes the raw connection"},
		{name: "transport started, it closes the wrapper", started: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Server{shares: newConnShares(8)}
			s.shares.startBy = time.Millisecond
			creds := sharedCreds{TransportCredentials: passCreds{}, s: s}
			raw, peer := net.Pipe()
			defer peer.Close()
			conn, _, err := creds.ServerHandshake(raw)
			if err != nil {
				t.Fatal(err)
			}
			if n := anonHeld(s); n != 1 {
				t.Fatalf("%d anonymous places held after the handshake, want 1", n)
			}
			if tc.started {
				read := make(chan struct{})
				go func() {
					defer close(read)
					conn.Read(make([]byte, 1))
				}()
				if _, err := peer.Write([]byte("P")); err != nil {
					t.Fatal(err)
				}
				<-read
				// Well past startBy: a started connection keeps its place
				// until it is closed.
				time.Sleep(50 * time.Millisecond)
				if n := anonHeld(s); n != 1 {
					t.Fatalf("a started connection lost its place before it was closed: %d held", n)
				}
				conn.Close()
				conn.Close()
			} else {
				raw.Close()
			}
			for deadline := time.Now().Add(30 * time.Second); anonHeld(s) != 0; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the place of a connection closed is still held after 30 s (%d)", anonHeld(s))
				}
			}
			// Closed twice, or by gRPC after the timer freed it: freed once.
			conn.Close()
			time.Sleep(10 * time.Millisecond)
			if n := anonHeld(s); n != 0 {
				t.Fatalf("%d anonymous places held, want 0 (freed more than once?)", n)
			}
		})
	}
}

package authority

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// passCreds is a TLS handshake that succeeds at once with no client
// certificate: an anonymous connection.
type passCreds struct {
	credentials.TransportCredentials
}

func (passCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return raw, credentials.TLSInfo{}, nil
}

// countingCreds is passCreds counting its handshakes.
type countingCreds struct {
	passCreds
	n *atomic.Int64
}

func (c countingCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c.n.Add(1)
	return c.passCreds.ServerHandshake(raw)
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

// A connection gRPC serves keeps its place past startBy: gRPC's
// transport reads the client's preface through the wrapper, which is
// what tells a started connection from one whose transport failed. Were
// that read made on the raw connection instead (a gRPC upgrade), every
// connection would be closed startBy after its handshake.
func TestServedConnKeepsItsPlace(t *testing.T) {
	s := &Server{shares: newConnShares(8)}
	s.shares.startBy = time.Millisecond
	var handshakes atomic.Int64
	srv := grpc.NewServer(grpc.Creds(sharedCreds{TransportCredentials: countingCreds{n: &handshakes}, s: s}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	check := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	check()
	// Well past startBy.
	time.Sleep(100 * time.Millisecond)
	check()
	// The client reconnects by itself: one handshake says the first
	// connection served both calls.
	if n := handshakes.Load(); n != 1 {
		t.Fatalf("%d connections made for two calls, want 1: the served connection was closed", n)
	}
	if n := anonHeld(s); n != 1 {
		t.Fatalf("%d anonymous places held by the one served connection, want 1", n)
	}
	cc.Close()
	for deadline := time.Now().Add(30 * time.Second); anonHeld(s) != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the place of a closed connection is still held after 30 s")
		}
	}
}

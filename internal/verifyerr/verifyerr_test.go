package verifyerr

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"math/big"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// refusedError is the typed error a client's verification returns.
type refusedError struct{}

// Its text has quotes in it, as x509's have, which gRPC escapes in the
// status it gives.
func (refusedError) Error() string { return `the test refuses this server ("not ours")` }

// serve runs a gRPC health server over TLS on a loopback port, with a
// self-signed certificate: a client's own VerifyConnection decides.
func serve(t *testing.T, refuseChecks bool) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}})))
	if refuseChecks {
		// A server answering UNAVAILABLE with the refusal's very text.
		healthpb.RegisterHealthServer(gs, lookAlike{})
	} else {
		healthpb.RegisterHealthServer(gs, health.NewServer())
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

type lookAlike struct {
	healthpb.UnimplementedHealthServer
}

func (lookAlike) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	return nil, status.Error(codes.Unavailable, refusedError{}.Error())
}

// dial connects to addr with a client whose verification refuses while
// refuse is set.
func dial(t *testing.T, addr string, refuse *atomic.Bool) healthpb.HealthClient {
	t.Helper()
	tc, opts := Watch(&tls.Config{InsecureSkipVerify: true, VerifyConnection: func(tls.ConnectionState) error {
		if refuse.Load() {
			return refusedError{}
		}
		return nil
	}})
	conn, err := grpc.NewClient(addr, append(opts, grpc.WithTransportCredentials(credentials.NewTLS(tc)))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// A call whose connection the client's verification refused carries the
// refusal, for errors.As, wrapped further or not, its status unchanged; a
// stream's too. Once a handshake verifies, calls succeed, and a server's
// UNAVAILABLE with the same text carries nothing.
func TestWatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var refuse atomic.Bool
	refuse.Store(true)
	c := dial(t, serve(t, false), &refuse)

	_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
	wrapped := errors.Join(errors.New("status"), err)
	if !errors.As(wrapped, new(refusedError)) {
		t.Fatalf("a call refused by the client's verification: %v; errors.As does not find the refusal", err)
	}
	s, ok := status.FromError(err)
	if !ok || s.Code() != codes.Unavailable || !tells(s.Message(), refusedError{}) || strings.HasPrefix(s.Message(), "rpc error") {
		t.Errorf("the status of a refused call: %v, %v; want gRPC's own UNAVAILABLE", s, ok)
	}
	w, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = w.Recv()
	}
	if !errors.As(err, new(refusedError)) {
		t.Errorf("a stream refused by the client's verification: %v; errors.As does not find the refusal", err)
	}

	refuse.Store(false)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err = c.Check(ctx, &healthpb.HealthCheckRequest{}); err == nil || time.Now().After(deadline) {
			break
		}
		if status.Code(err) != codes.Unavailable {
			t.Fatal(err)
		}
	}
	if err != nil {
		t.Fatalf("a call once the verification passes: %v", err)
	}

	var never atomic.Bool
	_, err = dial(t, serve(t, true), &never).Check(ctx, &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Unavailable || errors.As(err, new(refusedError)) {
		t.Errorf("a server's UNAVAILABLE in the refusal's words: %v; want it as it is, no refusal attached", err)
	}
}

// A configuration without VerifyConnection is left as it is.
func TestWatchWithoutVerification(t *testing.T) {
	tc := &tls.Config{ServerName: "x"}
	got, opts := Watch(tc)
	if got != tc || opts != nil {
		t.Errorf("Watch changed a configuration that verifies nothing itself: %v, %d options", got == tc, len(opts))
	}
}

// A refusal stays until a handshake verifies again, but a later failure
// that never reached a handshake (nothing listens any more) is not that
// refusal and carries nothing.
func TestWatchForgetsOtherFailures(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	// Forward to a real server while lis is open; once it is closed the
	// port refuses connections.
	target := serve(t, false)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				s, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer s.Close()
				go func() { _, _ = io.Copy(s, c) }()
				_, _ = io.Copy(c, s)
			}()
		}
	}()
	var refuse atomic.Bool
	refuse.Store(true)
	c := dial(t, addr, &refuse)
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); !errors.As(err, new(refusedError)) {
		t.Fatalf("a call refused by the client's verification: %v; errors.As does not find the refusal", err)
	}
	lis.Close()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		_, err = c.Check(ctx, &healthpb.HealthCheckRequest{})
		if status.Code(err) == codes.Unavailable && !tells(status.Convert(err).Message(), refusedError{}) {
			break
		}
	}
	if status.Code(err) != codes.Unavailable || tells(status.Convert(err).Message(), refusedError{}) {
		t.Fatalf("a call once nothing listens: %v; want UNAVAILABLE for another reason", err)
	}
	if errors.As(err, new(refusedError)) {
		t.Errorf("a call that failed before any handshake (%v) carries the earlier refusal", err)
	}
}

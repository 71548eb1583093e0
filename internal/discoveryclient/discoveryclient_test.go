package discoveryclient

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/referral"
)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newCA(t *testing.T) testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test discovery CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return testCA{cert, key}
}

// leaf issues a server certificate for 127.0.0.1, with eku.
func (c testCA) leaf(t *testing.T, eku x509.ExtKeyUsage) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "discovery"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{eku},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, key.Public(), c.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return cert, key
}

// chain is what a server presents: the leaf, then extra certificates.
func chain(leaf *x509.Certificate, key *ecdsa.PrivateKey, extra ...*x509.Certificate) tls.Certificate {
	tc := tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
	for _, c := range extra {
		tc.Certificate = append(tc.Certificate, c.Raw)
	}
	return tc
}

// serve starts an HTTPS server presenting cert and answering h.
func serve(t *testing.T, cert tls.Certificate, h http.Handler) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "https://")
}

const jwks = `{"keys":[]}`

func TestFetchJWKS(t *testing.T) {
	good, other := newCA(t), newCA(t)
	leaf, key := good.leaf(t, x509.ExtKeyUsageServerAuth)
	clientLeaf, clientKey := good.leaf(t, x509.ExtKeyUsageClientAuth)
	foreignLeaf, foreignKey := other.leaf(t, x509.ExtKeyUsageServerAuth)
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != JWKSPath {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(jwks))
	})
	tests := []struct {
		name    string
		cert    tls.Certificate
		handler http.Handler
		pin     string
		// wantErr is a substring of the error; "" for success.
		wantErr string
		wantPin bool // the error is ErrPin
	}{
		{name: "right pin", cert: chain(leaf, key, good.cert), pin: ca.Fingerprint(good.cert)},
		{name: "right pin in upper case", cert: chain(leaf, key, good.cert), pin: "sha256:" + strings.ToUpper(strings.TrimPrefix(ca.Fingerprint(good.cert), "sha256:"))},
		{name: "wrong pin", cert: chain(leaf, key, good.cert), pin: ca.Fingerprint(other.cert), wantErr: "no CA certificate with that key", wantPin: true},
		{name: "pinned CA not presented", cert: chain(leaf, key), pin: ca.Fingerprint(good.cert), wantErr: "no CA certificate", wantPin: true},
		{name: "pinned CA presented beside a foreign leaf", cert: chain(foreignLeaf, foreignKey, good.cert), pin: ca.Fingerprint(good.cert), wantErr: "unknown authority", wantPin: true},
		{name: "pin of the leaf, not a CA", cert: chain(leaf, key, good.cert), pin: ca.Fingerprint(leaf), wantErr: "no CA certificate", wantPin: true},
		{name: "leaf not for server auth", cert: chain(clientLeaf, clientKey, good.cert), pin: ca.Fingerprint(good.cert), wantErr: "usage", wantPin: true},
		{name: "no pin, untrusted certificate", cert: chain(leaf, key, good.cert), wantErr: "certificate signed by unknown authority"},
		{name: "malformed pin", cert: chain(leaf, key, good.cert), pin: "sha256:abc", wantErr: "want sha256:"},
		{name: "not 200", cert: chain(leaf, key, good.cert), pin: ca.Fingerprint(good.cert),
			handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", http.StatusServiceUnavailable) }),
			wantErr: "503"},
		{name: "too large", cert: chain(leaf, key, good.cert), pin: ca.Fingerprint(good.cert),
			handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Write([]byte(strings.Repeat(" ", referral.MaxJWKSBytes+1)))
			}),
			wantErr: "larger than"},
		{name: "redirect not followed", cert: chain(leaf, key, good.cert), pin: ca.Fingerprint(good.cert),
			handler: http.RedirectHandler("https://example.com/jwks.json", http.StatusFound), wantErr: "302"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.handler
			if h == nil {
				h = ok
			}
			addr := serve(t, tt.cert, h)
			got, err := FetchJWKS(context.Background(), addr, tt.pin)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("FetchJWKS: %v", err)
				}
				if string(got) != jwks {
					t.Errorf("FetchJWKS = %q, want %q", got, jwks)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("FetchJWKS error = %v, want one containing %q", err, tt.wantErr)
			}
			if tt.wantPin && !errors.Is(err, ErrPin) {
				t.Errorf("FetchJWKS error = %v, want ErrPin", err)
			}
		})
	}
}

func TestDial(t *testing.T) {
	good, other := newCA(t), newCA(t)
	leaf, key := good.leaf(t, x509.ExtKeyUsageServerAuth)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{chain(leaf, key, good.cert)}})))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)

	tests := []struct {
		name     string
		pin      string
		wantCode codes.Code
	}{
		{"right pin", ca.Fingerprint(good.cert), codes.OK},
		{"wrong pin", ca.Fingerprint(other.cert), codes.Unavailable},
		{"no pin, untrusted certificate", "", codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := Dial(lis.Addr().String(), tt.pin)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
			if got := status.Code(err); got != tt.wantCode {
				t.Fatalf("health check: %v, want %v", err, tt.wantCode)
			}
		})
	}
}

func TestArguments(t *testing.T) {
	for _, addr := range []string{"", "host", ":7450", "host:"} {
		if _, err := Dial(addr, ""); err == nil {
			t.Errorf("Dial(%q) succeeded, want an error", addr)
		}
		if _, err := FetchJWKS(context.Background(), addr, ""); err == nil {
			t.Errorf("FetchJWKS(%q) succeeded, want an error", addr)
		}
	}
	if _, err := TLSConfig("md5:abc"); err == nil {
		t.Error("TLSConfig accepted a malformed fingerprint")
	}
	if got := Issuer("d.example:7450"); got != "https://d.example:7450" {
		t.Errorf("Issuer = %q", got)
	}
}

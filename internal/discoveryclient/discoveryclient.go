// Package discoveryclient connects to a muster discovery service (DESIGN.md,
// join method 2) for agents, authorities and the CLI: a gRPC connection and
// the HTTPS fetch of its ticket keys, both over one TLS configuration.
//
// Discovery is pinned as kubeadm pins a cluster CA: with a fingerprint
// ("sha256:HEX" of a CA's SubjectPublicKeyInfo, shown by `muster discovery
// show`), the chain the server presents must hold a CA certificate with that
// key, and the server's certificate must verify against it for server
// authentication; host names are not checked, since the pin is the
// identity. Without a fingerprint the system roots and the usual host name
// check apply. A discovery certificate never proves to be an authority: the
// authority SAN is checked separately by whoever sends a secret.
package discoveryclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/h2window"
	"github.com/muster-dev/muster/internal/referral"
)

// JWKSPath is where discovery publishes its ticket keys.
const JWKSPath = "/.well-known/jwks.json"

// FetchTimeout bounds a JWKS fetch.
const FetchTimeout = 10 * time.Second

// ErrPin is returned (wrapped) by the TLS handshake when the server's chain
// does not hold the pinned CA, or its certificate does not verify against it.
var ErrPin = errors.New("discoveryclient: the discovery's certificate does not match the pinned fingerprint")

// Issuer is the issuer of the referral tickets of the discovery at addr
// (HOST:PORT): the base of its JWKS address.
func Issuer(addr string) string { return "https://" + addr }

// TLSConfig returns the client configuration for a discovery service. With
// a fingerprint, the server's chain must hold a CA certificate with that
// key and its leaf must verify against that CA for server authentication,
// whatever the host name; with "" the system roots and host name
// verification apply.
func TLSConfig(fingerprint string) (*tls.Config, error) {
	if fingerprint == "" {
		return &tls.Config{MinVersion: tls.VersionTLS12}, nil
	}
	fp, err := ca.ParseFingerprint(fingerprint)
	if err != nil {
		return nil, fmt.Errorf("discoveryclient: discovery fingerprint: %w", err)
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// The pin, not the host name, identifies discovery: the chain
		// is verified in VerifyConnection, which runs for every
		// handshake, resumed ones included.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyPinned(cs.PeerCertificates, fp, time.Now())
		},
	}, nil
}

// verifyPinned checks that certs (leaf first) hold a CA certificate whose
// key has the pin fp and that the leaf verifies against it.
func verifyPinned(certs []*x509.Certificate, fp string, now time.Time) error {
	if len(certs) == 0 {
		return fmt.Errorf("%w: no certificate presented", ErrPin)
	}
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	pinned := false
	for _, c := range certs[1:] {
		if c.IsCA && ca.Fingerprint(c) == fp {
			roots.AddCert(c)
			pinned = true
			continue
		}
		inter.AddCert(c)
	}
	if !pinned {
		return fmt.Errorf("%w %s: the server presents no CA certificate with that key; %s", ErrPin, fp, pinHint)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: inter,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}); err != nil {
		return fmt.Errorf("%w %s: %v; %s", ErrPin, fp, err, pinHint)
	}
	return nil
}

// PinMismatch returns the pin mismatch err reports, from ErrPin on, and
// whether it is one: a call's error, where gRPC keeps only the text of
// the handshake's failure. A mismatch does not pass by itself: the pin is
// discovery's CA, which lives as long as its data directory.
func PinMismatch(err error) (string, bool) {
	if err == nil {
		return "", false
	}
	msg := err.Error()
	if s, ok := status.FromError(err); ok {
		msg = s.Message()
	}
	i := strings.Index(msg, ErrPin.Error())
	if i < 0 {
		return "", false
	}
	return strings.TrimSuffix(msg[i:], `"`), true
}

// pinHint is the way out of a pin mismatch: the pin is discovery's own CA,
// which a new discovery data directory replaces, and which is easily
// confused with the authority's root fingerprint (a pin for
// --ca-fingerprint). Nothing was sent to the server.
const pinHint = "nothing was sent; pin discovery's own CA (--discovery-fingerprint, MUSTER_DISCOVERY_FINGERPRINT, " +
	"discovery.fingerprint, or a joining URI's discovery_fingerprint=), which muster discovery show --data DIR prints on discovery's machine"

// Dial returns a gRPC connection to the discovery at addr (HOST:PORT). It
// does not connect until the first call.
func Dial(addr, fingerprint string) (*grpc.ClientConn, error) {
	if err := checkAddr(addr); err != nil {
		return nil, err
	}
	tc, err := TLSConfig(fingerprint)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr, append(h2window.DialOptions(), grpc.WithTransportCredentials(credentials.NewTLS(tc)))...)
	if err != nil {
		return nil, fmt.Errorf("discoveryclient: discovery address %q: %w", addr, err)
	}
	return conn, nil
}

// FetchJWKS returns the JWKS document the discovery at addr publishes, at
// most referral.MaxJWKSBytes, within FetchTimeout (or ctx's deadline, if
// sooner). Any status but 200 is an error.
func FetchJWKS(ctx context.Context, addr, fingerprint string) ([]byte, error) {
	if err := checkAddr(addr); err != nil {
		return nil, err
	}
	tc, err := TLSConfig(fingerprint)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, FetchTimeout)
	defer cancel()
	tr := &http.Transport{
		TLSClientConfig:     tc,
		ForceAttemptHTTP2:   true,
		TLSHandshakeTimeout: FetchTimeout,
		// The transport serves this one request.
		DisableKeepAlives: true,
		Proxy:             http.ProxyFromEnvironment,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{
		Transport: tr,
		// A redirect would leave the pinned host for another.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	url := Issuer(addr) + JWKSPath
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("discoveryclient: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("discoveryclient: fetching %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("discoveryclient: fetching %s: %s", url, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, referral.MaxJWKSBytes+1))
	if err != nil {
		return nil, fmt.Errorf("discoveryclient: reading %s: %w", url, err)
	}
	if len(body) > referral.MaxJWKSBytes {
		return nil, fmt.Errorf("discoveryclient: %s is larger than %d bytes", url, referral.MaxJWKSBytes)
	}
	return body, nil
}

func checkAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || port == "" {
		return fmt.Errorf("discoveryclient: discovery address %q: want HOST:PORT", addr)
	}
	return nil
}

package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// renewMethod is the one RPC's full name.
const renewMethod = "/floor.Floor/Renew"

// rawCodec carries the request (a CSR's DER) and the answer (a chain PEM)
// as the message bytes themselves, so the tool needs no generated code.
// muster's messages are protobuf; the difference is a length-prefixed copy.
type rawCodec struct{}

func (rawCodec) Name() string { return "floor-raw" }

func (rawCodec) Marshal(v any) ([]byte, error) {
	switch b := v.(type) {
	case []byte:
		return b, nil
	case *[]byte:
		return *b, nil
	}
	return nil, fmt.Errorf("floor: cannot marshal %T", v)
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	p, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("floor: cannot unmarshal into %T", v)
	}
	// grpc-go gives Unmarshal a buffer of its own (Materialize copies), so
	// keeping it is safe.
	*p = data
	return nil
}

// floorService is the hand-written descriptor of the one service.
var floorService = grpc.ServiceDesc{
	ServiceName: "floor.Floor",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Renew",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var csr []byte
			if err := dec(&csr); err != nil {
				return nil, err
			}
			return srv.(*renewer).renew(ctx, csr)
		},
	}},
	Metadata: "floor",
}

// renewer issues renewals with the agent intermediate.
type renewer struct {
	ca  *x509.Certificate
	key *ecdsa.PrivateKey
}

// renew parses the CSR, checks its signature and key, and signs a leaf for
// the identity of the connection's client certificate: the crypto of a
// renewal and nothing else (no store, no audit, no authorization).
func (r *renewer) renew(ctx context.Context, der []byte) ([]byte, error) {
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	pub, ok := csr.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		return nil, status.Error(codes.InvalidArgument, "want an ECDSA P-256 key")
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "no peer")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 || len(ti.State.PeerCertificates[0].URIs) != 1 {
		return nil, status.Error(codes.Unauthenticated, "no client certificate with one URI")
	}
	client := ti.State.PeerCertificates[0]
	serial, err := newSerial()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	tmpl := leafTemplate(client.Subject.CommonName, client.URIs[0], time.Now(), serial)
	leaf, err := x509.CreateCertificate(rand.Reader, tmpl, r.ca, pub, r.key)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	out := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf})
	return append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.ca.Raw})...), nil
}

// serverTLS is muster's authority's TLS configuration
// (listener.ServerTLS: TLS 1.2 and up, no session tickets, h2; the key
// exchange Go's default, X25519MLKEM768 first), with the client
// certificate required and verified in the handshake against the agent
// intermediate alone: one ECDSA verification, as the authority's own
// check of a presented leaf (it asks in the handshake and verifies it
// once per connection, in its interceptor).
func serverTLS(h *hierarchy) *tls.Config {
	clientCAs := x509.NewCertPool()
	clientCAs.AddCert(h.agentCA)
	return &tls.Config{
		MinVersion:             tls.VersionTLS12,
		NextProtos:             []string{"h2"},
		SessionTicketsDisabled: true,
		Certificates: []tls.Certificate{{
			Certificate: [][]byte{h.serverLeaf.Raw, h.serverCA.Raw},
			PrivateKey:  h.serverLeafKey,
			Leaf:        h.serverLeaf,
		}},
		ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs:  clientCAs,
	}
}

func newGRPCServer(h *hierarchy) *grpc.Server {
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(serverTLS(h))), grpc.ForceServerCodec(rawCodec{}))
	gs.RegisterService(&floorService, &renewer{ca: h.agentCA, key: h.agentCAKey})
	return gs
}

func serverMain(args []string) error {
	fs := flag.NewFlagSet("floor server", flag.ContinueOnError)
	dir := fs.String("dir", "floor-data", "directory for the hierarchy the client reads and server.txt (PID and address)")
	listen := fs.String("listen", "127.0.0.1:0", "address to listen on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	h, err := newHierarchy(time.Now())
	if err != nil {
		return err
	}
	if err := h.write(*dir); err != nil {
		return err
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	info := fmt.Sprintf("%d %s\n", os.Getpid(), lis.Addr())
	if err := os.WriteFile(filepath.Join(*dir, serverFile), []byte(info), 0o644); err != nil {
		return err
	}
	fmt.Printf("floor server pid %d listening on %s\n", os.Getpid(), lis.Addr())
	return newGRPCServer(h).Serve(lis)
}

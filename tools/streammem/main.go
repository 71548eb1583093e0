// Command streammem measures the server-side memory cost of N idle gRPC-style bidi
// streams (one per TLS 1.3 connection with a client certificate) under
// different Go server transports: grpc-go, bare net/http HTTP/2, connect-go.
//
//	streammem -mode gencerts -dir certs
//	streammem -mode server -transport grpc|h2|connect -addr 127.0.0.1:7443 -debug 127.0.0.1:7444
//	streammem -mode client -addr 127.0.0.1:7443 -n 2000 -c 64
//	curl 127.0.0.1:7444/stats?n=2000
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	_ "net/http/pprof"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
)

const procedure = "/exp.Hold/Hold"

var (
	mode       = flag.String("mode", "server", "gencerts|server|client")
	transport  = flag.String("transport", "grpc", "grpc|h2|connect")
	addr       = flag.String("addr", "127.0.0.1:7443", "service address")
	debugAddr  = flag.String("debug", "127.0.0.1:7444", "server debug/stats address")
	dir        = flag.String("dir", "certs", "cert directory")
	n          = flag.Int("n", 2000, "client: number of connections/streams")
	conc       = flag.Int("c", 64, "client: dial concurrency")
	mprate     = flag.Int("memprofilerate", 0, "server: runtime.MemProfileRate if >0 (profiling runs only)")
	inlineRecv = flag.Bool("inlinerecv", false, "server grpc/connect: receive loop in the handler goroutine itself (no extra receive goroutine)")
	prehs      = flag.Bool("prehandshake", false, "server h2/connect: do the TLS handshake in a short-lived goroutine before handing the conn to net/http")
)

func main() {
	flag.Parse()
	switch *mode {
	case "gencerts":
		gencerts(*dir)
	case "server":
		server()
	case "client":
		client()
	default:
		log.Fatalf("unknown mode %q", *mode)
	}
}

// ---------- certificates ----------

func gencerts(d string) {
	must(os.MkdirAll(d, 0o755))
	mk := func(tmpl *x509.Certificate, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		must(err)
		if parent == nil {
			parent, parentKey = tmpl, k
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &k.PublicKey, parentKey)
		must(err)
		c, err := x509.ParseCertificate(der)
		must(err)
		return c, k, der
	}
	now := time.Now().Add(-time.Hour)
	serial := int64(1)
	base := func(cn string) *x509.Certificate {
		serial++
		return &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now, NotAfter: now.Add(30 * 24 * time.Hour)}
	}
	rootT := base("test root")
	rootT.IsCA, rootT.BasicConstraintsValid = true, true
	rootT.KeyUsage = x509.KeyUsageCertSign
	root, rootK, rootDER := mk(rootT, nil, nil)
	intT := base("test intermediate")
	intT.IsCA, intT.BasicConstraintsValid = true, true
	intT.KeyUsage = x509.KeyUsageCertSign
	inter, interK, interDER := mk(intT, root, rootK)
	srvT := base("localhost")
	srvT.DNSNames = []string{"localhost"}
	srvT.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	srvT.KeyUsage = x509.KeyUsageDigitalSignature
	srvT.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	_, srvK, srvDER := mk(srvT, inter, interK)
	cliT := base("agent-1")
	cliT.URIs = nil
	cliT.KeyUsage = x509.KeyUsageDigitalSignature
	cliT.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	_, cliK, cliDER := mk(cliT, inter, interK)
	_ = inter
	writePEM := func(name, typ string, blocks ...[]byte) {
		var b strings.Builder
		for _, der := range blocks {
			b.Write(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
		}
		must(os.WriteFile(filepath.Join(d, name), []byte(b.String()), 0o600))
	}
	keyDER := func(k *ecdsa.PrivateKey) []byte { b, err := x509.MarshalECPrivateKey(k); must(err); return b }
	writePEM("root.pem", "CERTIFICATE", rootDER)
	writePEM("server.pem", "CERTIFICATE", srvDER, interDER)
	writePEM("server.key", "EC PRIVATE KEY", keyDER(srvK))
	writePEM("client.pem", "CERTIFICATE", cliDER, interDER)
	writePEM("client.key", "EC PRIVATE KEY", keyDER(cliK))
	fmt.Println("certs written to", d)
}

func rootPool() *x509.CertPool {
	b, err := os.ReadFile(filepath.Join(*dir, "root.pem"))
	must(err)
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		log.Fatal("bad root.pem")
	}
	return p
}

func serverTLS() *tls.Config {
	cert, err := tls.LoadX509KeyPair(filepath.Join(*dir, "server.pem"), filepath.Join(*dir, "server.key"))
	must(err)
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    rootPool(),
		// CurvePreferences left nil: default, X25519MLKEM768 first.
	}
}

func clientTLS() *tls.Config {
	cert, err := tls.LoadX509KeyPair(filepath.Join(*dir, "client.pem"), filepath.Join(*dir, "client.key"))
	must(err)
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		RootCAs:      rootPool(),
		ServerName:   "localhost",
	}
}

// ---------- codecs ----------

// rawCodec passes *[]byte through (grpc-go, both sides).
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) ([]byte, error) {
	switch m := v.(type) {
	case *[]byte:
		return *m, nil
	case *Msg:
		return m.B, nil
	}
	return nil, fmt.Errorf("rawCodec: unsupported %T", v)
}
func (rawCodec) Unmarshal(data []byte, v any) error {
	switch m := v.(type) {
	case *[]byte:
		*m = append((*m)[:0], data...)
		return nil
	case *Msg:
		m.B = append(m.B[:0], data...)
		return nil
	}
	return fmt.Errorf("rawCodec: unsupported %T", v)
}

// Msg is the connect-go message type (proto-free, via rawCodec named "proto").
type Msg struct{ B []byte }

var reply = []byte("hello-from-server")

// ---------- server ----------

type baseline struct {
	heap, stackInuse, sys, heapSys uint64
	goroutines                     int
	rss                            uint64
}

func snapshot() baseline {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return baseline{heap: ms.HeapAlloc, stackInuse: ms.StackInuse, sys: ms.Sys, heapSys: ms.HeapSys,
		goroutines: runtime.NumGoroutine(), rss: vmRSS()}
}

func vmRSS() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	must(err)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			f := strings.Fields(line)
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}

var (
	active   atomic.Int64 // streams that received their first message
	received atomic.Int64
)

func server() {
	if *mprate > 0 {
		runtime.MemProfileRate = *mprate
	}
	ln, err := net.Listen("tcp", *addr)
	must(err)
	base := snapshot()
	go func() {
		http.HandleFunc("/stats", func(w http.ResponseWriter, r *http.Request) {
			s := snapshot()
			k := active.Load()
			nn, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
			if nn == 0 {
				nn = k
			}
			per := func(a, b uint64) float64 { return (float64(a) - float64(b)) / float64(nn) }
			fmt.Fprintf(w, "transport=%s prehs=%v inlinerecv=%v n=%d active=%d heap_per=%.0f stack_per=%.0f goroutines_per=%.2f rss_per=%.0f sys_per=%.0f heap_total_MiB=%.1f rss_MiB=%.1f\n",
				*transport, *prehs, *inlineRecv, nn, k, per(s.heap, base.heap), per(s.stackInuse, base.stackInuse),
				float64(s.goroutines-base.goroutines)/float64(nn), per(s.rss, base.rss), per(s.sys, base.sys),
				float64(s.heap)/(1<<20), float64(s.rss)/(1<<20))
		})
		http.HandleFunc("/active", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, active.Load()) })
		log.Fatal(http.ListenAndServe(*debugAddr, nil))
	}()
	log.Printf("server transport=%s listening on %s, debug on %s", *transport, *addr, *debugAddr)
	switch *transport {
	case "grpc":
		serveGRPC(ln)
	case "h2":
		serveHTTP(ln, http.HandlerFunc(rawH2Handler))
	case "grpchttp":
		// grpc-go's handler transport: grpc.Server.ServeHTTP on net/http's HTTP/2.
		serveHTTP(ln, newGRPCServer(grpc.Creds(nil)))
	case "connect":
		mux := http.NewServeMux()
		mux.Handle(procedure, connect.NewBidiStreamHandler(procedure, connectHandler, connect.WithCodec(rawCodec{})))
		serveHTTP(ln, mux)
	default:
		log.Fatalf("unknown transport %q", *transport)
	}
}

func serveGRPC(ln net.Listener) {
	must(newGRPCServer(grpc.Creds(credentials.NewTLS(serverTLS()))).Serve(ln))
}

func newGRPCServer(creds grpc.ServerOption) *grpc.Server {
	opts := []grpc.ServerOption{
		grpc.ForceServerCodec(rawCodec{}),
		grpc.ReadBufferSize(0),
		grpc.SharedWriteBuffer(true),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 5 * time.Minute}),
	}
	if *transport == "grpc" {
		opts = append(opts, creds)
	}
	s := grpc.NewServer(opts...)
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: "exp.Hold",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{
			StreamName:    "Hold",
			ServerStreams: true,
			ClientStreams: true,
			Handler: func(_ any, ss grpc.ServerStream) error {
				if *inlineRecv {
					if err := ss.SendMsg(&reply); err != nil {
						return err
					}
					for first := true; ; first = false {
						var m []byte
						if err := ss.RecvMsg(&m); err != nil {
							if errors.Is(err, io.EOF) {
								return nil
							}
							return err
						}
						received.Add(1)
						if first {
							active.Add(1)
						}
					}
				}
				ctx := ss.Context()
				errc := make(chan error, 1)
				first := true
				go func() {
					for {
						var m []byte
						if err := ss.RecvMsg(&m); err != nil {
							errc <- err
							return
						}
						received.Add(1)
						if first {
							first = false
							active.Add(1)
						}
					}
				}()
				if err := ss.SendMsg(&reply); err != nil {
					return err
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case err := <-errc:
					if errors.Is(err, io.EOF) {
						return nil
					}
					return err
				}
			},
		}},
	}, struct{}{})
	return s
}

func serveHTTP(ln net.Listener, h http.Handler) {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetHTTP2(true)
	srv := &http.Server{Handler: h, TLSConfig: serverTLS(), Protocols: &p}
	if *prehs {
		srv.TLSConfig.NextProtos = []string{"h2", "http/1.1"}
		must(srv.Serve(newHSListener(ln, srv.TLSConfig)))
	}
	must(srv.ServeTLS(ln, "", ""))
}

// hsListener completes each TLS handshake in its own short-lived goroutine,
// so the long-lived net/http connection goroutine starts with a fresh small
// stack instead of inheriting the one grown by the TLS 1.3 + ML-KEM + X.509
// verification handshake.
type hsListener struct {
	net.Listener
	ch chan net.Conn
}

func newHSListener(ln net.Listener, cfg *tls.Config) *hsListener {
	l := &hsListener{Listener: ln, ch: make(chan net.Conn)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(l.ch)
				return
			}
			go func() {
				tc := tls.Server(c, cfg)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := tc.HandshakeContext(ctx); err != nil {
					c.Close()
					return
				}
				l.ch <- tc
			}()
		}
	}()
	return l
}

func (l *hsListener) Accept() (net.Conn, error) {
	c, ok := <-l.ch
	if !ok {
		return nil, net.ErrClosed
	}
	return c, nil
}

// rawH2Handler is the minimum a gRPC/Connect bidi stream over net/http
// needs: full duplex, write+flush one gRPC-framed message, then read the
// request body in a loop in the handler goroutine.
func rawH2Handler(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != procedure {
		http.NotFound(w, r)
		return
	}
	rc := http.NewResponseController(w)
	_ = rc.EnableFullDuplex() // no-op/ErrNotSupported on HTTP/2, which is full duplex anyway
	w.Header().Set("Content-Type", "application/grpc")
	w.Header().Set("Trailer", "Grpc-Status")
	w.WriteHeader(http.StatusOK)
	frame := make([]byte, 5+len(reply))
	binary.BigEndian.PutUint32(frame[1:5], uint32(len(reply)))
	copy(frame[5:], reply)
	if _, err := w.Write(frame); err != nil {
		return
	}
	if err := rc.Flush(); err != nil {
		return
	}
	var hdr [5]byte
	first := true
	for {
		if _, err := io.ReadFull(r.Body, hdr[:]); err != nil {
			break
		}
		sz := binary.BigEndian.Uint32(hdr[1:5])
		if _, err := io.CopyN(io.Discard, r.Body, int64(sz)); err != nil {
			break
		}
		received.Add(1)
		if first {
			first = false
			active.Add(1)
		}
	}
	w.Header().Set("Grpc-Status", "0")
}

func connectHandler(ctx context.Context, st *connect.BidiStream[Msg, Msg]) error {
	if *inlineRecv {
		if err := st.Send(&Msg{B: reply}); err != nil {
			return err
		}
		for first := true; ; first = false {
			if _, err := st.Receive(); err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
			received.Add(1)
			if first {
				active.Add(1)
			}
		}
	}
	errc := make(chan error, 1)
	go func() {
		first := true
		for {
			if _, err := st.Receive(); err != nil {
				errc <- err
				return
			}
			received.Add(1)
			if first {
				first = false
				active.Add(1)
			}
		}
	}()
	if err := st.Send(&Msg{B: reply}); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case err := <-errc:
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
}

// ---------- client ----------

// client uses grpc-go for every transport (same wire: gRPC over HTTP/2),
// one ClientConn (= one TLS connection) per stream.
func client() {
	tcfg := clientTLS()
	sem := make(chan struct{}, *conc)
	var wg sync.WaitGroup
	var ok, failed atomic.Int64
	start := time.Now()
	desc := &grpc.StreamDesc{StreamName: "Hold", ServerStreams: true, ClientStreams: true}
	for i := 0; i < *n; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			cc, err := grpc.NewClient("passthrough:///"+*addr,
				grpc.WithTransportCredentials(credentials.NewTLS(tcfg.Clone())),
				grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})),
				grpc.WithSharedWriteBuffer(true),
				grpc.WithReadBufferSize(0),
			)
			if err != nil {
				failed.Add(1)
				log.Print(err)
				return
			}
			st, err := cc.NewStream(context.Background(), desc, procedure)
			if err != nil {
				failed.Add(1)
				log.Print(err)
				return
			}
			msg := []byte("hello-from-agent")
			if err := st.SendMsg(&msg); err != nil {
				failed.Add(1)
				log.Print(err)
				return
			}
			var m []byte
			if err := st.RecvMsg(&m); err != nil {
				failed.Add(1)
				log.Print(err)
				return
			}
			ok.Add(1)
			// hold: keep cc and st referenced forever
			go func() { var x []byte; _ = st.RecvMsg(&x); log.Printf("stream ended"); _ = cc }()
		}()
	}
	wg.Wait()
	fmt.Printf("ESTABLISHED ok=%d failed=%d in %s\n", ok.Load(), failed.Load(), time.Since(start).Round(time.Millisecond))
	select {}
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

// Command floor measures what any Go server must spend on a renewal on
// muster's stack, with no store, no audit and no muster code: grpc-go over
// TLS 1.3 (P-256 ECDSA server certificate, a client certificate required
// and verified, X25519MLKEM768 as Go's default, no session tickets) and one
// unary RPC, Renew, which takes a PKCS#10 CSR (P-256), checks its signature
// and answers a leaf certificate of muster's shape (SPIFFE URI SAN,
// digitalSignature, clientAuth, 1 h) signed by a P-256 intermediate, as a
// chain PEM. Nothing else.
//
//	floor server -dir D [-listen 127.0.0.1:0]
//	floor client -dir D -conn new|kept [-c 16] [-n 3000 | -d 10s] [-conns N] [-o json]
//
// The server makes a fresh hierarchy in D (the client mints its first
// certificates with the agent intermediate's key written there) and writes
// its PID and address to D/server.txt. The client reads the server's
// utime+stime from /proc/PID/stat before and after the timed part and
// prints the server's CPU per renewal, throughput and the user/system split.
// See README.md.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: floor server|client [flags] (floor ROLE -h for the flags)")
		os.Exit(2)
	}
	role, args := os.Args[1], os.Args[2:]
	var err error
	switch role {
	case "server":
		err = serverMain(args)
	case "client":
		err = clientMain(args)
	default:
		err = fmt.Errorf("unknown role %q: want server or client", role)
	}
	if err != nil && err != flag.ErrHelp {
		fmt.Fprintln(os.Stderr, "floor:", err)
		os.Exit(1)
	}
}

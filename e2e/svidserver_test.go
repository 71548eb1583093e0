package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/pem"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
)

// svidFiles writes the SVID of src as files OpenSSL reads: the leaf, the
// intermediate, the leaf then the intermediate, the key, and the trust
// domain's roots.
type svidFiles struct{ leaf, inter, chain, key, bundle string }

func writeSVID(t *testing.T, src *workloadapi.X509Source, td spiffeid.TrustDomain) svidFiles {
	t.Helper()
	svid, err := src.GetX509SVID()
	if err != nil {
		t.Fatal(err)
	}
	if len(svid.Certificates) != 2 {
		t.Fatalf("%s: %d certificates, want leaf and intermediate", svid.ID, len(svid.Certificates))
	}
	chain, key, err := svid.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	b, err := src.GetX509BundleForTrustDomain(td)
	if err != nil {
		t.Fatal(err)
	}
	roots, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	f := svidFiles{filepath.Join(dir, "leaf.pem"), filepath.Join(dir, "inter.pem"), filepath.Join(dir, "chain.pem"),
		filepath.Join(dir, "key.pem"), filepath.Join(dir, "bundle.pem")}
	for path, data := range map[string][]byte{
		f.leaf:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: svid.Certificates[0].Raw}),
		f.inter:  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: svid.Certificates[1].Raw}),
		f.chain:  chain,
		f.key:    key,
		f.bundle: roots,
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// openssl runs openssl with args and returns its combined output.
func openssl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "openssl", args...).CombinedOutput()
	return string(out), err
}

// Two agents joined with --svid-usage client,server after the agent
// intermediate's rotation (ca rotate agent, then --activate) serve TLS with
// their SVIDs to OpenSSL, which checks the key usage of every certificate
// in the chain: each SVID verifies with -purpose sslserver against the
// bundle, openssl s_server with a's SVID completes an mTLS handshake with
// b's go-spiffe client authorizing a's ID (s_server verifying b's SVID as
// a client certificate), and openssl s_client with b's SVID verifies a's
// go-spiffe server. A default agent's client-only SVID does not verify as
// a server certificate.
func TestServerSVIDsVerifyInOpenSSL(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	prep := caRotate(t, e.dir, "agent")
	serial := prep.Intermediate.Serial
	if !pollFor(30*time.Second, func() bool {
		return muster(t, nil, "ca", "rotate", "agent", "--activate", "--data", e.dir).code == 0
	}) {
		t.Fatal("ca rotate agent --activate did not succeed within 30 s of preparing")
	}
	join := func(node string, usage ...string) string {
		adir := filepath.Join(t.TempDir(), "agent-"+node)
		tok := e.createToken(t, usage...)
		mustRun(t, "agent", "join", "--data", adir, "--node", node, tok.URI)
		return adir
	}
	adirA, adirB, adirC := join("svc-a", "--svid-usage", "client,server"), join("svc-b", "--svid-usage", "client,server"), join("plain")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	srcA, srcB, srcC := serveWorkloadAPI(t, ctx, adirA), serveWorkloadAPI(t, ctx, adirB), serveWorkloadAPI(t, ctx, adirC)
	td := spiffeid.RequireTrustDomainFromString(e.authorityID)
	idA, idB := spiffeid.RequireFromPath(td, "/agent/svc-a"), spiffeid.RequireFromPath(td, "/agent/svc-b")
	a, b, c := writeSVID(t, srcA, td), writeSVID(t, srcB, td), writeSVID(t, srcC, td)

	svidA, _ := srcA.GetX509SVID()
	if got := svidA.Certificates[1].SerialNumber.Text(16); got != serial {
		t.Fatalf("a's SVID is issued by intermediate %s, want the rotated %s", got, serial)
	}
	for name, f := range map[string]svidFiles{"a": a, "b": b} {
		if out, err := openssl(t, "verify", "-purpose", "sslserver", "-CAfile", f.bundle, "-untrusted", f.inter, f.leaf); err != nil || !strings.Contains(out, ": OK") {
			t.Errorf("openssl verify -purpose sslserver of %s's SVID: %v\n%s", name, err, out)
		}
		if out, err := openssl(t, "verify", "-purpose", "sslclient", "-CAfile", f.bundle, "-untrusted", f.inter, f.leaf); err != nil || !strings.Contains(out, ": OK") {
			t.Errorf("openssl verify -purpose sslclient of %s's SVID: %v\n%s", name, err, out)
		}
	}
	if out, err := openssl(t, "verify", "-purpose", "sslserver", "-CAfile", c.bundle, "-untrusted", c.inter, c.leaf); err == nil {
		t.Errorf("a client-only SVID verified as a TLS server certificate:\n%s", out)
	}

	// openssl s_server with a's SVID, requiring and verifying a client
	// certificate; b's go-spiffe client authorizes a's ID.
	srv := exec.CommandContext(ctx, "openssl", "s_server", "-accept", "127.0.0.1:0", "-naccept", "1", "-www",
		"-cert", a.leaf, "-cert_chain", a.inter, "-key", a.key, "-CAfile", a.bundle, "-Verify", "2", "-verify_return_error")
	stdout, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	srv.Stderr = srv.Stdout
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	sc := bufio.NewScanner(stdout)
	addr := ""
	for addr == "" && sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "ACCEPT "); ok {
			addr = rest
		}
	}
	if addr == "" {
		t.Fatal("openssl s_server printed no ACCEPT line")
	}
	go io.Copy(io.Discard, stdout)
	conn, err := tls.Dial("tcp", addr, tlsconfig.MTLSClientConfig(srcB, srcB, tlsconfig.AuthorizeID(idA)))
	if err != nil {
		t.Fatalf("b's go-spiffe client with openssl s_server serving a's SVID: %v", err)
	}
	conn.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	resp, _ := io.ReadAll(conn)
	conn.Close()
	if !strings.HasPrefix(string(resp), "HTTP/1.0 200") {
		t.Fatalf("openssl s_server refused b's SVID as a client certificate: %q", resp)
	}

	// openssl s_client with b's SVID verifies a's go-spiffe server.
	lis, err := tls.Listen("tcp", "127.0.0.1:0", tlsconfig.MTLSServerConfig(srcA, srcA, tlsconfig.AuthorizeID(idB)))
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if c.(*tls.Conn).Handshake() == nil {
					c.Write([]byte("hello from a\n"))
				}
			}()
		}
	}()
	cl := exec.CommandContext(ctx, "openssl", "s_client", "-connect", lis.Addr().String(), "-cert", b.leaf, "-cert_chain", b.inter, "-key", b.key,
		"-CAfile", b.bundle, "-verify_return_error", "-verify", "2", "-ign_eof")
	cl.Stdin = strings.NewReader("")
	out, err := cl.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Verify return code: 0 (ok)") || !strings.Contains(string(out), "hello from a") {
		t.Fatalf("openssl s_client (b's SVID) to a's go-spiffe server: %v\n%s", err, out)
	}
}

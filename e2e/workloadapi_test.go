package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// socketDir is a short directory for a Unix socket (sun_path holds 108
// bytes; t.TempDir's names can be longer).
func socketDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "wapi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// joinedAgent joins a token agent as node and returns its data directory.
func joinedAgent(t *testing.T, e *agentEnv, node string) string {
	t.Helper()
	adir := filepath.Join(t.TempDir(), "agent-"+node)
	mustRun(t, "agent", "join", "--data", adir, "--node", node, e.createToken(t).URI)
	return adir
}

// x509Updates watches X.509 contexts and forwards each one.
type x509Updates chan *workloadapi.X509Context

func (u x509Updates) OnX509ContextUpdate(c *workloadapi.X509Context) { u <- c }
func (u x509Updates) OnX509ContextWatchError(error)                  {}

type bundleUpdates chan *x509bundle.Set

func (u bundleUpdates) OnX509BundlesUpdate(s *x509bundle.Set) { u <- s }
func (u bundleUpdates) OnX509BundlesWatchError(error)         {}

func TestWorkloadAPIServesAndPushes(t *testing.T) {
	e := newAgentEnv(t)
	adir := joinedAgent(t, e, "web-1")
	sock := filepath.Join(socketDir(t), "agent.sock")
	addr := "unix://" + sock
	p, started := startProcEnv(t, "agent", "agent started", []string{"MUSTER_WORKLOAD_API=" + addr},
		"agent", "run", "--data", adir, "--log-format", "json", "--metrics-listen", "127.0.0.1:0")
	if started["workload_api"] != sock {
		t.Fatalf("agent started record: %v", started)
	}
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v %v", fi, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client, err := workloadapi.New(ctx, workloadapi.WithAddr(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	td := spiffeid.RequireTrustDomainFromString(e.authorityID)
	want := spiffeid.RequireFromPath(td, "/agent/web-1")
	svid, err := client.FetchX509SVID(ctx)
	if err != nil {
		t.Fatalf("FetchX509SVID: %v\n%s", err, p.Logs())
	}
	bundles, err := client.FetchX509Bundles(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if svid.ID != want {
		t.Fatalf("SVID ID %v, want %v", svid.ID, want)
	}
	if _, _, err := x509svid.Verify(svid.Certificates, bundles); err != nil {
		t.Fatalf("the SVID does not verify against the bundle: %v", err)
	}
	onDisk, _ := os.ReadFile(filepath.Join(adir, "certs", "agent.crt"))
	if blk, _ := pem.Decode(onDisk); blk == nil || !svid.Certificates[0].Equal(mustParse(t, blk.Bytes)) {
		t.Fatal("the SVID served is not certs/agent.crt")
	}

	// Open streams get a renewal by another process (the push is logged
	// with how long it took; the test waits for it with the test's
	// deadline, so a loaded machine cannot fail it).
	svids := make(x509Updates, 8)
	go client.WatchX509Context(ctx, svids)
	first := <-svids
	bset := make(bundleUpdates, 8)
	go client.WatchX509Bundles(ctx, bset)
	<-bset
	mustRun(t, "agent", "renew", "--data", adir)
	renewed := time.Now()
	select {
	case c := <-svids:
		got := c.DefaultSVID()
		if got.Certificates[0].Equal(first.DefaultSVID().Certificates[0]) || got.ID != want {
			t.Fatalf("update after the renewal carries the old certificate or another ID: %v", got.ID)
		}
		onDisk, _ := os.ReadFile(filepath.Join(adir, "certs", "agent.crt"))
		if blk, _ := pem.Decode(onDisk); blk == nil || !got.Certificates[0].Equal(mustParse(t, blk.Bytes)) {
			t.Fatal("the pushed SVID is not the renewed certs/agent.crt")
		}
		t.Logf("renewal pushed %v after agent renew exited", time.Since(renewed))
	case <-ctx.Done():
		t.Fatalf("no SVID update after agent renew\n%s", p.Logs())
	}

	// A bundle change reaches the bundle stream after the agent writes
	// it: a root rotation begins, the agent takes the new
	// root from its stream (through the cross-certificate) and writes
	// ca.crt with both roots.
	caFile := filepath.Join(adir, "certs", "ca.crt")
	mustRun(t, "ca", "root", "rotate", "--data", e.dir)
	var changed time.Time
	for end := time.Now().Add(15 * time.Second); changed.IsZero(); time.Sleep(10 * time.Millisecond) {
		if b, _ := os.ReadFile(caFile); bytes.Count(b, []byte("BEGIN CERTIFICATE")) == 2 {
			changed = time.Now()
		} else if time.Now().After(end) {
			t.Fatalf("the agent did not take the new root within 15 s of the rotation\n%s", p.Logs())
		}
	}
	for done := false; !done; {
		select {
		case s := <-bset:
			b, ok := s.Get(td)
			if ok && len(b.X509Authorities()) == 2 {
				t.Logf("bundle change pushed after %v", time.Since(changed))
				done = true
			}
		case <-ctx.Done():
			t.Fatalf("no bundle update with the new root\n%s", p.Logs())
		}
	}

	// Without the security header: INVALID_ARGUMENT.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := workload.NewSpiffeWorkloadAPIClient(conn).FetchX509SVID(ctx, &workload.X509SVIDRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a call without workload.spiffe.io: %v, want INVALID_ARGUMENT", err)
	}
	if m := metricsOf(t, p.metrics); !strings.Contains(m, `muster_agent_workload_api_refusals_total{reason="missing_header"} 1`) {
		t.Errorf("refusal not counted:\n%s", grepLines(m, "workload_api"))
	}
}

func TestWorkloadAPIRefusesUIDsNotAllowed(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	adir := joinedAgent(t, e, "web-2")
	sock := filepath.Join(socketDir(t), "agent.sock")
	// The test runs as root; the allow-list names someone else.
	p, _ := startProc(t, "agent", "agent started", "agent", "run", "--data", adir, "--log-format", "json",
		"--metrics-listen", "127.0.0.1:0", "--workload-api", "unix://"+sock, "--workload-api-allow-uids", "4242",
		"--workload-api-socket-mode", "0666")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := workloadapi.New(ctx, workloadapi.WithAddr("unix://"+sock))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// FetchX509SVID retries PERMISSION_DENIED in go-spiffe's watch, but
	// its one-shot Fetch returns it.
	_, err = client.FetchX509Bundles(ctx)
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "UID 0") {
		t.Fatalf("a caller not allowed: %v, want PERMISSION_DENIED naming its UID", err)
	}
	if m := metricsOf(t, p.metrics); !strings.Contains(m, `muster_agent_workload_api_refusals_total{reason="uid_not_allowed"} 1`) {
		t.Errorf("refusal not counted:\n%s", grepLines(m, "workload_api"))
	}
	if !strings.Contains(p.Logs(), "workload api: caller refused") {
		t.Errorf("refusal not logged:\n%s", p.Logs())
	}
}

func mustParse(t *testing.T, der []byte) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// serveWorkloadAPI runs agent run for adir with a Workload API and returns
// an X.509 source on it.
func serveWorkloadAPI(t *testing.T, ctx context.Context, adir string) *workloadapi.X509Source {
	t.Helper()
	sock := filepath.Join(socketDir(t), "agent.sock")
	startProc(t, "agent "+filepath.Base(adir), "agent started", "agent", "run", "--data", adir, "--log-format", "json",
		"--workload-api", "unix://"+sock)
	src, err := workloadapi.NewX509Source(ctx, workloadapi.WithClientOptions(workloadapi.WithAddr("unix://"+sock)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return src
}

func hasServerAuth(c *x509.Certificate) bool {
	for _, u := range c.ExtKeyUsage {
		if u == x509.ExtKeyUsageServerAuth {
			return true
		}
	}
	return false
}

// Two agents joined with --svid-usage client,server tokens mTLS each other
// with the SVIDs their Workload APIs serve, each authorizing the other's
// SPIFFE ID; a renewal keeps the usage; a default token's agent gets a
// client-only SVID.
func TestWorkloadAPIServerSVIDsMTLS(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	join := func(node string, usage ...string) string {
		adir := filepath.Join(t.TempDir(), "agent-"+node)
		tok := e.createToken(t, usage...)
		mustRun(t, "agent", "join", "--data", adir, "--node", node, tok.URI)
		return adir
	}
	if line := mustFail(t, "token", "create", "--data", e.dir, "--svid-usage", "server"); !strings.Contains(line, "INVALID_ARGUMENT") ||
		!strings.Contains(line, "client,server") {
		t.Errorf("--svid-usage server alone: %q", line)
	}
	adirA, adirB := join("svc-a", "--svid-usage", "client,server"), join("svc-b", "--svid-usage", "client,server")
	adirC := join("plain")
	mustRun(t, "agent", "renew", "--data", adirA)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srcA, srcB, srcC := serveWorkloadAPI(t, ctx, adirA), serveWorkloadAPI(t, ctx, adirB), serveWorkloadAPI(t, ctx, adirC)
	td := spiffeid.RequireTrustDomainFromString(e.authorityID)
	idA, idB := spiffeid.RequireFromPath(td, "/agent/svc-a"), spiffeid.RequireFromPath(td, "/agent/svc-b")
	for _, c := range []struct {
		src  *workloadapi.X509Source
		want bool
	}{{srcA, true}, {srcB, true}, {srcC, false}} {
		svid, err := c.src.GetX509SVID()
		if err != nil {
			t.Fatal(err)
		}
		if hasServerAuth(svid.Certificates[0]) != c.want {
			t.Errorf("%s: server auth %v, want %v", svid.ID, !c.want, c.want)
		}
	}

	lis, err := tls.Listen("tcp", "127.0.0.1:0", tlsconfig.MTLSServerConfig(srcA, srcA, tlsconfig.AuthorizeID(idB)))
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	served := make(chan error, 1)
	go func() {
		c, err := lis.Accept()
		if err == nil {
			err = c.(*tls.Conn).Handshake()
			if err == nil {
				_, err = c.Write([]byte("hello from a\n"))
			}
			c.Close()
		}
		served <- err
	}()
	conn, err := tls.Dial("tcp", lis.Addr().String(), tlsconfig.MTLSClientConfig(srcB, srcB, tlsconfig.AuthorizeID(idA)))
	if err != nil {
		t.Fatalf("agent b's mTLS handshake with agent a: %v", err)
	}
	line, _ := io.ReadAll(conn)
	conn.Close()
	if err := <-served; err != nil || string(line) != "hello from a\n" {
		t.Fatalf("agent a's side: %v, read %q", err, line)
	}
	if got := conn.ConnectionState().PeerCertificates[0].URIs[0].String(); got != idA.String() {
		t.Errorf("b talked to %s", got)
	}

	// Agent b refuses a server that is not a (another agent's SVID).
	go func() {
		c, err := lis.Accept()
		if err == nil {
			c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	if c, err := tls.Dial("tcp", lis.Addr().String(), tlsconfig.MTLSClientConfig(srcB, srcB, tlsconfig.AuthorizeID(idB))); err == nil {
		c.Close()
		t.Fatal("a client authorizing only svc-b accepted svc-a's certificate")
	}
}

// A bound-keypair agent's refreshes, the one that rotates its bound key
// included, made by agent run itself, reach an open FetchX509SVID stream
// (the renewal path tells the Workload API in process; how long after the
// refresh's log record is logged).
func TestWorkloadAPIPushesBoundKeyRotation(t *testing.T) {
	e := newAgentEnv(t, "--agent-cert-ttl", "6s")
	adir := filepath.Join(t.TempDir(), "agent")
	pubLine := strings.TrimSpace(mustRun(t, "keypair", "create", "--data", adir))
	keyFile := filepath.Join(t.TempDir(), "bot.pub")
	if err := os.WriteFile(keyFile, []byte(pubLine+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "bot", "add", "rotor", "--public-key", keyFile, "--data", e.dir)
	mustRun(t, "agent", "join", "--data", adir, "--bound-keypair", "rotor", "--authority", e.auth.addr, "--ca-fingerprint", e.fingerprint)

	sock := filepath.Join(socketDir(t), "agent.sock")
	p, _ := startProc(t, "agent", "agent started", "agent", "run", "--data", adir, "--log-format", "json",
		"--workload-api", "unix://"+sock)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type received struct {
		serial string
		at     time.Time
	}
	var (
		mu   sync.Mutex
		got  []received
		svid = make(x509Updates, 64)
	)
	go workloadapi.WatchX509Context(ctx, svid, workloadapi.WithAddr("unix://"+sock))
	go func() {
		for c := range svid {
			mu.Lock()
			got = append(got, received{fmt.Sprintf("%x", c.DefaultSVID().Certificates[0].SerialNumber), time.Now()})
			mu.Unlock()
		}
	}()

	file := filepath.Join(t.TempDir(), "token.yaml")
	yaml := fmt.Sprintf("kind: token\nmetadata: {name: rotor}\nspec:\n  join_method: bound-keypair\n  node: rotor\n"+
		"  bound_keypair:\n    onboarding: {initial_public_key: %q}\n    recovery: {limit: 1, mode: standard}\n    rotate_after: %q\n",
		pubLine, time.Now().Add(-time.Minute).UTC().Format(time.RFC3339))
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "token", "apply", "-f", file, "--data", e.dir)
	waitLog(t, p, "bound key rotated", 1, 20*time.Second)
	waitLog(t, p, "refresh done", 2, 20*time.Second)

	// Every refresh logged reaches the stream, the rotating one (the
	// first after "bound key rotated") among them; how long after its
	// record is logged, not asserted. The log is read once every serial
	// it holds has arrived (or the test's deadline has passed).
	logs := p.Logs()
	for {
		missing := false
		for _, line := range strings.Split(logs, "\n") {
			var rec struct {
				Msg    string `json:"msg"`
				Serial string `json:"serial"`
			}
			if json.Unmarshal([]byte(line), &rec) != nil || rec.Msg != "refresh done" {
				continue
			}
			mu.Lock()
			seen := slices.ContainsFunc(got, func(r received) bool { return r.serial == rec.Serial })
			mu.Unlock()
			missing = missing || !seen
		}
		if !missing || ctx.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	rotated := false
	refreshes := 0
	for _, line := range strings.Split(logs, "\n") {
		var rec struct {
			Msg    string    `json:"msg"`
			Time   time.Time `json:"time"`
			Serial string    `json:"serial"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		if rec.Msg == "bound key rotated" {
			rotated = true
		}
		if rec.Msg != "refresh done" {
			continue
		}
		refreshes++
		mu.Lock()
		var at time.Time
		for _, r := range got {
			if r.serial == rec.Serial {
				at = r.at
			}
		}
		mu.Unlock()
		if at.IsZero() {
			t.Fatalf("refresh %d (serial %s, rotation seen: %v) never reached the stream\n%s", refreshes, rec.Serial, rotated, p.Logs())
		}
		t.Logf("refresh %d (rotation seen: %v) pushed %v after its log record", refreshes, rotated, at.Sub(rec.Time).Round(time.Millisecond))
	}
	if !rotated || refreshes < 2 {
		t.Fatalf("rotation %v, %d refreshes", rotated, refreshes)
	}
}

// jwtEnv is an authority serving its JWKS on --crl-listen and an agent
// joined as node serving the Workload API, with a client of it (closed at
// the test's end): what the JWT-SVID tests share.
type jwtEnv struct {
	*agentEnv
	client    *workloadapi.Client
	td        spiffeid.TrustDomain
	crlListen string
}

func newJWTEnv(t *testing.T, ctx context.Context, node string) jwtEnv {
	t.Helper()
	e := newAgentEnv(t, "--crl-listen", "127.0.0.1:0")
	var crlListen string
	for _, line := range strings.Split(e.auth.Logs(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "authority started" {
			crlListen, _ = rec["crl_listen"].(string)
		}
	}
	if crlListen == "" {
		t.Fatalf("no crl_listen in the authority's start record\n%s", e.auth.Logs())
	}
	adir := joinedAgent(t, e, node)
	sock := filepath.Join(socketDir(t), "agent.sock")
	startProc(t, "agent", "agent started", "agent", "run", "--data", adir, "--log-format", "json", "--workload-api", "unix://"+sock)
	client, err := workloadapi.New(ctx, workloadapi.WithAddr("unix://"+sock))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return jwtEnv{agentEnv: e, client: client, td: spiffeid.RequireTrustDomainFromString(e.authorityID), crlListen: crlListen}
}

// authorityJWKS is the JWKS the authority serves relying parties over
// HTTP (/.well-known/jwks.json on --crl-listen).
func (j jwtEnv) authorityJWKS(t *testing.T) *jwtbundle.Bundle {
	t.Helper()
	resp, err := http.Get("http://" + j.crlListen + "/.well-known/jwks.json")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET jwks.json: %s %s", resp.Status, body)
	}
	b, err := jwtbundle.Parse(j.td, body)
	if err != nil {
		t.Fatalf("the authority's JWKS: %v\n%s", err, body)
	}
	return b
}

// A JWT-SVID fetched through the agent's Workload API (minted by the
// authority, AgentService.MintJWTSVID) verifies against the JWKS the
// authority serves relying parties on --crl-listen, and against the
// Workload API's own FetchJWTBundles and ValidateJWTSVID; another
// audience does not.
func TestWorkloadAPIJWTSVIDs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	j := newJWTEnv(t, ctx, "api-1")
	client, td := j.client, j.td
	want := spiffeid.RequireFromPath(td, "/agent/api-1")

	svid, err := client.FetchJWTSVID(ctx, jwtsvid.Params{Audience: "db", ExtraAudiences: []string{"cache"}})
	if err != nil {
		t.Fatalf("FetchJWTSVID: %v", err)
	}
	if svid.ID != want || time.Until(svid.Expiry) > 5*time.Minute+5*time.Second || time.Until(svid.Expiry) < 4*time.Minute {
		t.Fatalf("JWT-SVID %s expiring %v", svid.ID, svid.Expiry)
	}
	token := svid.Marshal()

	// The relying party's path: the authority's JWKS over HTTP.
	b := j.authorityJWKS(t)
	got, err := jwtsvid.ParseAndValidate(token, b, []string{"cache"})
	if err != nil || got.ID != want {
		t.Fatalf("validating against the authority's JWKS: %v %v", got, err)
	}
	if _, err := jwtsvid.ParseAndValidate(token, b, []string{"other"}); err == nil {
		t.Fatal("a JWT-SVID for db,cache validated for audience other")
	}

	// The Workload API's own bundle and validation.
	bundles, err := client.FetchJWTBundles(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wb, ok := bundles.Get(td)
	if !ok {
		t.Fatal("FetchJWTBundles has no bundle of the trust domain")
	}
	if _, err := jwtsvid.ParseAndValidate(token, wb, []string{"db"}); err != nil {
		t.Fatalf("validating against FetchJWTBundles: %v", err)
	}
	v, err := client.ValidateJWTSVID(ctx, token, "db")
	if err != nil || v.ID != want {
		t.Fatalf("ValidateJWTSVID: %v %v", v, err)
	}
	if _, err := client.ValidateJWTSVID(ctx, token, "other"); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("ValidateJWTSVID for another audience: %v, want INVALID_ARGUMENT", err)
	}
}

// TestWorkloadAPICallTimeoutSetting: agent run's
// --workload-api-call-timeout (workload_api.call_timeout) ends a unary
// Workload API call whose request never comes at that timeout
// (DEADLINE_EXCEEDED), counted as call_timeout; a value under 1s stops
// agent run with the setting named. Before, the timeout was a fixed
// minute.
func TestWorkloadAPICallTimeoutSetting(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	adir := joinedAgent(t, e, "slow-1")
	sock := filepath.Join(socketDir(t), "agent.sock")
	if msg := mustFail(t, "agent", "run", "--data", adir, "--workload-api", "unix://"+sock, "--workload-api-call-timeout", "10ms"); !strings.Contains(msg, `workload_api.call_timeout "10ms": want a duration of at least 1s`) {
		t.Errorf("a call timeout under 1s: %q", msg)
	}
	p, _ := startProc(t, "agent", "agent started", "agent", "run", "--data", adir, "--log-format", "json",
		"--metrics-listen", "127.0.0.1:0", "--workload-api", "unix://"+sock, "--workload-api-call-timeout", "1s")
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "workload.spiffe.io", "true"), 30*time.Second)
	defer cancel()
	// The headers go out at once; the request never does.
	cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/SpiffeWorkloadAPI/FetchJWTSVID")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cs.RecvMsg(&emptypb.Empty{}); status.Code(err) != codes.DeadlineExceeded || ctx.Err() != nil {
		t.Fatalf("a unary call whose request never came: %v after %s, want DEADLINE_EXCEEDED at the 1 s call timeout", err, time.Since(start).Round(time.Millisecond))
	}
	waitFor(t, 10*time.Second, "the call timeout is counted", func() bool {
		return strings.Contains(metricsOf(t, p.metrics), `muster_agent_workload_api_refusals_total{reason="call_timeout"} 1`)
	})
}

// The socket's directory removed while the agent serves it (a cleaner of
// /tmp or /run, an operator's rm -r): the agent makes the socket again,
// so a workload that starts afterwards gets its SVID, and says so in its
// log. It used to keep accepting on a socket nobody could reach, ready
// and silent.
func TestWorkloadAPISocketRemovedWhileServing(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	adir := joinedAgent(t, e, "web-1")
	sock := filepath.Join(socketDir(t), "run", "agent.sock")
	addr := "unix://" + sock
	p, _ := startProcEnv(t, "agent", "agent started", nil,
		"agent", "run", "--data", adir, "--log-format", "json", "--metrics-listen", "127.0.0.1:0", "--workload-api", addr)
	if err := os.RemoveAll(filepath.Dir(sock)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		svid, err := workloadapi.FetchX509SVID(cctx, workloadapi.WithAddr(addr))
		ccancel()
		if err == nil {
			if svid.ID.Path() != "/agent/web-1" {
				t.Fatalf("SVID %v", svid.ID)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no SVID after the socket's directory was removed: %v\n%s", err, p.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	for !strings.Contains(p.Logs(), "the socket was removed while the agent served it") {
		if ctx.Err() != nil {
			t.Fatalf("the agent did not say it made the socket again\n%s", p.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"database/sql"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"

	_ "github.com/jackc/pgx/v5/stdlib"
)

// crashKills is how many times TestAuthorityCrashConsistency kills the
// authority: a handful in CI, MUSTER_CRASH_KILLS in the long mode
// (docs/threat-model.md).
func crashKills(t *testing.T) int {
	if s := os.Getenv("MUSTER_CRASH_KILLS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("MUSTER_CRASH_KILLS=%q: want a positive number", s)
		}
		return n
	}
	return 6
}

// crashRun is what the clients of TestAuthorityCrashConsistency saw: the
// successes are the ground truth the store is checked against.
type crashRun struct {
	dir, addr string
	root      *x509.Certificate
	td        string

	mu         sync.Mutex
	tokens     map[string]string // token ID -> token
	tokenOK    map[string]int    // token ID -> joins answered with a certificate
	received   map[string][]string
	identities []*crashIdentity
	psk        string
	nodes      atomic.Int64
	bots       []*crashBot
}

type crashIdentity struct {
	node string
	id   *identity.Identity
}

// freePort reserves a loopback port for the authority to listen on again
// after each restart, so clients keep one address.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestAuthorityCrashConsistency kills the authority with SIGKILL at random
// moments while clients join with multi-use tokens, the bootstrap PSK and
// bound keypairs (first joins, recoveries, refreshes and key rotations),
// renew, create tokens and rotate the PSK; it restarts the authority on the
// same data directory and store each time, on SQLite and on PostgreSQL.
// Whatever the moment: no token is used more often than allowed (nor less
// than the joins clients saw answered), every certificate a client received
// has its issuance record, the audit chain verifies, at most one PSK is
// active and one in grace, no node has two current instances, a bound-keypair
// token counts one recovery per instance it made (so none twice from one
// join state) and its bound key is one its client offered.
func TestAuthorityCrashConsistency(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) { crashConsistency(t, "") })
	t.Run("postgres", func(t *testing.T) { crashConsistency(t, postgres(t)) })
}

// crashConsistency runs the test on the store storeURL names ("" for the
// data directory's SQLite file).
func crashConsistency(t *testing.T, storeURL string) {
	var initArgs, storeArgs []string
	if storeURL != "" {
		initArgs, storeArgs = []string{"--store", storeURL}, []string{"--store", storeURL}
	}
	dir, init := initDir(t, initArgs...)
	addr := freePort(t)
	start := func() *authorityProc {
		p, rec := startProc(t, "authority", "authority started", append([]string{"authority", "--data", dir,
			"--listen", addr, "--metrics-listen", "127.0.0.1:0", "--log-format", "json"}, storeArgs...)...)
		p.addr, _ = rec["advertise"].(string)
		return p
	}
	auth := start()
	je := &joinEnv{dir: dir, auth: auth}
	je.setup(t)
	c := &crashRun{dir: dir, addr: auth.addr, root: je.root, td: je.td,
		tokens: map[string]string{}, tokenOK: map[string]int{}, received: map[string][]string{},
		psk: init["bootstrap_psk"].(string)}
	c.createToken(t)
	c.addBots(t, 3)

	kills := crashKills(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c.step(t)
			}
		}()
	}
	for i := 0; i < kills; i++ {
		time.Sleep(time.Duration(200+mrand.IntN(1300)) * time.Millisecond)
		auth.cmd.Process.Signal(syscall.SIGKILL)
		<-auth.done
		auth = start()
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()

	c.mu.Lock()
	defer c.mu.Unlock()
	joins := 0
	for node, serials := range c.received {
		var show struct {
			Certificates []struct {
				Serial string `json:"serial"`
			} `json:"certificates"`
		}
		if err := json.Unmarshal([]byte(mustRun(t, "agents", "show", node, "--data", dir, "-o", "json")), &show); err != nil {
			t.Fatal(err)
		}
		known := map[string]bool{}
		for _, ce := range show.Certificates {
			known[ce.Serial] = true
		}
		for _, s := range serials {
			joins++
			if !known[s] {
				t.Errorf("node %s received certificate %s, which has no issuance record (records: %v)", node, s, show.Certificates)
			}
		}
	}
	if !strings.Contains(mustRun(t, "audit", "verify", "--data", dir), "intact") {
		t.Error("audit verify does not say intact")
	}
	showPSKs(t, dir)
	auth.stop(t)

	db := openStoreDB(t, dir, storeURL)
	rows, err := db.Query(`SELECT id, uses_allowed, uses_count FROM tokens`)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]int{}
	for rows.Next() {
		var id string
		var allowed, count int
		if err := rows.Scan(&id, &allowed, &count); err != nil {
			t.Fatal(err)
		}
		used[id] = count
		if allowed != 0 && count > allowed {
			t.Errorf("token %s used %d times, %d allowed", id, count, allowed)
		}
	}
	rows.Close()
	for id, ok := range c.tokenOK {
		if ok > used[id] {
			t.Errorf("token %s: clients received %d certificates, the store counts %d uses", id, ok, used[id])
		}
	}
	live := map[string]int{}
	prow, err := db.Query(`SELECT status, count(*) FROM bootstrap_psks WHERE status IN ('active', 'grace') GROUP BY status`)
	if err != nil {
		t.Fatal(err)
	}
	for prow.Next() {
		var s string
		var n int
		prow.Scan(&s, &n)
		live[s] = n
	}
	prow.Close()
	if live["active"] != 1 || live["grace"] > 1 {
		t.Errorf("bootstrap PSKs after the crashes: %v, want one active and at most one in grace", live)
	}
	c.checkBots(t, db)
	if joins == 0 || len(c.tokens) < 2 {
		t.Errorf("the clients got %d certificates and created %d tokens in %d kills: the test exercised nothing", joins, len(c.tokens), kills)
	}
	t.Logf("%d kills: %d certificates received by clients, %d tokens known; bound keypairs: %v", kills, joins, len(c.tokens), c.botOutcomes())
}

// openStoreDB opens the authority's store for the checks: the data
// directory's SQLite file, or the PostgreSQL database storeURL names.
func openStoreDB(t *testing.T, dir, storeURL string) *sql.DB {
	t.Helper()
	driver, dsn := "sqlite", filepath.Join(dir, "muster.db")+"?_pragma=busy_timeout(10000)"
	if storeURL != "" {
		driver, dsn = "pgx", storeURL
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// step runs one client operation, chosen at random; a failure (the
// authority is down, or died mid-answer) is expected and not counted.
func (c *crashRun) step(t *testing.T) {
	switch n := mrand.IntN(20); {
	case n < 7:
		c.tokenJoin(t)
	case n < 10:
		c.pskJoin(t)
	case n < 14:
		c.renew(t)
	case n < 17:
		c.boundJoin(t)
	case n < 19:
		c.createToken(t)
	default:
		c.rotate(t)
	}
	time.Sleep(20 * time.Millisecond)
}

func (c *crashRun) conn(t *testing.T, id *identity.Identity, opts ...grpc.DialOption) *grpc.ClientConn {
	pool := x509.NewCertPool()
	pool.AddCert(c.root)
	want, _ := spiffeid.New(c.td, spiffeid.RoleAuthority, c.td)
	opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(identity.ClientTLS(id, pool, identity.MatchID(want)))))
	conn, err := grpc.NewClient(c.addr, opts...)
	if err != nil {
		t.Error(err)
		return nil
	}
	return conn
}

// got records a certificate a client received and keeps the identity for
// renewals.
func (c *crashRun) got(t *testing.T, node, chainPEM string, key *ecdsa.PrivateKey, old *crashIdentity) {
	chain, err := ca.ParseCertsPEM([]byte(chainPEM))
	if err != nil || len(chain) == 0 {
		t.Errorf("node %s: the authority answered an unreadable chain: %v", node, err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.received[node] = append(c.received[node], chain[0].SerialNumber.Text(16))
	id := &identity.Identity{Chain: chain, Key: key, Roots: []*x509.Certificate{c.root}}
	if old != nil {
		old.id = id
		return
	}
	c.identities = append(c.identities, &crashIdentity{node: node, id: id})
}

func csrFor(t *testing.T, cn string) (*ecdsa.PrivateKey, []byte) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn}}, key)
	if err != nil {
		t.Error(err)
	}
	return key, der
}

func (c *crashRun) tokenJoin(t *testing.T) {
	c.mu.Lock()
	var id, tok string
	for i, v := range c.tokens { // map order: a random token
		id, tok = i, v
		break
	}
	c.mu.Unlock()
	node := fmt.Sprintf("crash-t%d", c.nodes.Add(1))
	key, csr := csrFor(t, "")
	conn := c.conn(t, nil)
	if conn == nil {
		return
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := musterv1.NewBootstrapServiceClient(conn).ExchangeJoinToken(ctx,
		&musterv1.ExchangeJoinTokenRequest{JoinToken: tok, NodeId: node, Csr: csr})
	if err != nil {
		return
	}
	c.mu.Lock()
	c.tokenOK[id]++
	c.mu.Unlock()
	c.got(t, node, resp.GetCertificateChainPem(), key, nil)
}

func (c *crashRun) pskJoin(t *testing.T) {
	c.mu.Lock()
	key := c.psk
	c.mu.Unlock()
	node := fmt.Sprintf("crash-p%d", c.nodes.Add(1))
	priv, csr := csrFor(t, node)
	conn := c.conn(t, nil)
	if conn == nil {
		return
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := musterv1.NewCertificateServiceClient(conn).RequestCertificate(ctx,
		&musterv1.RequestCertificateRequest{Csr: csr, BootstrapPsk: key})
	if err != nil {
		return
	}
	c.got(t, node, resp.GetCertificateChainPem(), priv, nil)
}

func (c *crashRun) renew(t *testing.T) {
	c.mu.Lock()
	if len(c.identities) == 0 {
		c.mu.Unlock()
		return
	}
	ci := c.identities[mrand.IntN(len(c.identities))]
	id := ci.id
	c.mu.Unlock()
	key, csr := csrFor(t, "")
	conn := c.conn(t, id)
	if conn == nil {
		return
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := musterv1.NewCertificateServiceClient(conn).RequestCertificate(ctx, &musterv1.RequestCertificateRequest{Csr: csr})
	if err != nil {
		return
	}
	c.got(t, ci.node, resp.GetCertificateChainPem(), key, ci)
}

func (c *crashRun) createToken(t *testing.T) {
	r := muster(t, nil, "token", "create", "--data", c.dir, "--uses", "3", "--ttl", "1h", "-o", "json")
	var tok createdToken
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &tok) != nil || tok.ID == "" {
		return
	}
	c.mu.Lock()
	c.tokens[tok.ID] = tok.Token
	c.mu.Unlock()
}

func (c *crashRun) rotate(t *testing.T) {
	grace := "1h"
	if mrand.IntN(3) == 0 {
		grace = "0"
	}
	// A PSK still in grace from the rotation before is revoked: without
	// --revoke-grace every rotation after the first would be refused.
	r := muster(t, nil, "psk", "rotate", "--data", c.dir, "--grace", grace, "--revoke-grace", "-o", "json")
	var out pskRotate
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &out) != nil || out.Active == nil {
		return
	}
	c.mu.Lock()
	c.psk = out.Active.PSK
	c.mu.Unlock()
}

// TestAgentCrashConsistency kills agent join and agent renew with SIGKILL
// at random moments. Whatever the moment, agent run recovers the data
// directory (joining with the same single-use token if the join had not
// finished, or loading the identity it has), and the identity it holds is
// one the authority issued and still renews.
func TestAgentCrashConsistency(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	rounds := 6
	// outcomes counts what each kill left behind, so the log shows the
	// kills landed at different moments.
	outcomes := map[string]int{}
	// A kill falls within span of the start: about how long the whole
	// command takes here, so most kills land while it runs.
	killAt := func(adir string, span time.Duration, args []string, env []string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := execCommand(ctx, args...)
		cmd.Env = append(cmd.Env, env...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(mrand.Int64N(int64(span))))
		cmd.Process.Signal(syscall.SIGKILL)
		err := cmd.Wait()
		left := "no state"
		if _, serr := os.Stat(filepath.Join(adir, "state.json")); serr == nil {
			left = "state"
		}
		if _, perr := os.Stat(filepath.Join(adir, "keys", "pending.key")); perr == nil {
			left += "+pending key"
		}
		if err == nil {
			left += " (finished first)"
		}
		outcomes[args[1]+": "+left]++
	}
	// recover runs agent run until it loads an identity, then checks the
	// authority issued it and that it renews.
	recover := func(adir, node string, env []string) {
		t.Helper()
		p, _ := startProcEnv(t, "agent run", "identity loaded", env, "agent", "run", "--data", adir, "--log-format", "json",
			"--metrics-listen", "127.0.0.1:0")
		p.stop(t)
		st := agentStatus(t, adir)
		if st["node_id"] != node {
			t.Fatalf("after recovery the agent is %v, want node %s", st["node_id"], node)
		}
		var show struct {
			Certificates []struct {
				Serial string `json:"serial"`
			} `json:"certificates"`
		}
		if err := json.Unmarshal([]byte(mustRun(t, "agents", "show", node, "--data", e.dir, "-o", "json")), &show); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, c := range show.Certificates {
			found = found || c.Serial == st["serial"]
		}
		if !found {
			t.Fatalf("the agent holds certificate %v, which the authority has no record of: %v", st["serial"], show.Certificates)
		}
		for _, name := range []string{"state.json", "certs"} {
			if _, err := os.Stat(filepath.Join(adir, name)); err != nil {
				t.Fatalf("after recovery: %v", err)
			}
		}
		for _, sub := range []string{"", "certs", "keys"} {
			if tmps, _ := filepath.Glob(filepath.Join(adir, sub, ".*.tmp-*")); len(tmps) > 0 {
				t.Errorf("temporary files outlived agent run: %v", tmps)
			}
		}
		mustRun(t, "agent", "renew", "--data", adir)
	}
	joinSpan, renewSpan := 300*time.Millisecond, time.Duration(0)
	for i := 0; i < rounds; i++ {
		node := fmt.Sprintf("crash-agent-%d", i)
		adir := filepath.Join(t.TempDir(), node)
		tok := e.createToken(t)
		env := []string{"MUSTER_JOIN_URI=" + tok.URI, "MUSTER_NODE_ID=" + node}
		killAt(adir, joinSpan, []string{"agent", "join", "--data", adir, "--node", node}, env)
		recover(adir, node, env)
		if renewSpan == 0 {
			begin := time.Now()
			mustRun(t, "agent", "renew", "--data", adir)
			renewSpan = time.Since(begin)
			joinSpan = renewSpan * 3 / 2 // a join's exchange is about a renewal's
		}
		for j := 0; j < 2; j++ {
			killAt(adir, renewSpan, []string{"agent", "renew", "--data", adir}, nil)
			recover(adir, node, nil)
		}
	}
	t.Logf("what the kills left: %v", outcomes)
}

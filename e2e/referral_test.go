package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/discoveryclient"
	"github.com/muster-dev/muster/internal/psk"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// referralEnv is a discovery, and an authority registered with it.
type referralEnv struct {
	disc        *discoveryProc
	discDir     string
	dir         string
	auth        *authorityProc
	authorityID string
	fingerprint string
	psk         string
}

// newReferralEnv starts a discovery that allows a new authority, and the
// authority with --discovery; config, if set, is the authority's
// authority.yaml.
func newReferralEnv(t *testing.T, config string, authorityArgs ...string) *referralEnv {
	t.Helper()
	e := &referralEnv{discDir: filepath.Join(t.TempDir(), "discovery")}
	var init map[string]any
	e.dir, init = initDir(t)
	e.authorityID, e.fingerprint, e.psk = init["authority_id"].(string), init["ca_fingerprint"].(string), init["bootstrap_psk"].(string)
	e.disc = startDiscovery(t, e.discDir, allowing(init)...)
	if config != "" {
		if err := os.WriteFile(filepath.Join(e.dir, "authority.yaml"), []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	e.auth = startAuthority(t, e.dir, append([]string{"--discovery", e.disc.addr, "--discovery-fingerprint", e.disc.fingerprint}, authorityArgs...)...)
	e.waitRegistered(t)
	return e
}

// waitRegistered waits until discovery knows the authority.
func (e *referralEnv) waitRegistered(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r := muster(t, nil, "discovery", "lookup", e.authorityID, "--discovery", e.disc.addr, "--discovery-fingerprint", e.disc.fingerprint)
		if r.code == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the authority did not register with discovery: %s\n%s", r.stderr, e.auth.Logs())
		}
	}
}

// join runs agent join through discovery with the given PSK ("" : none).
func (e *referralEnv) join(t *testing.T, adir, node, key string, extra ...string) result {
	t.Helper()
	var env []string
	if key != "" {
		env = []string{"MUSTER_BOOTSTRAP_PSK=" + key}
	}
	return muster(t, env, append([]string{"agent", "join", "--data", adir, "--node", node, "--discovery", e.disc.addr,
		"--discovery-fingerprint", e.disc.fingerprint, "--authority-id", e.authorityID, "--ca-fingerprint", e.fingerprint}, extra...)...)
}

func (e *referralEnv) mustJoin(t *testing.T, node string) string {
	t.Helper()
	adir := filepath.Join(t.TempDir(), node)
	if r := e.join(t, adir, node, e.psk); r.code != 0 {
		t.Fatalf("join of %s through discovery: exit %d\n%s\nauthority:\n%s", node, r.code, r.stderr, e.auth.Logs())
	}
	return adir
}

// TestReferralJoin: the PSK flow through discovery, as DESIGN.md draws it:
// lookup, the authority proved by its root and SAN, a ticket, then the PSK
// and the ticket to the authority. Discovery, authority and agent are
// separate processes.
func TestReferralJoin(t *testing.T) {
	t.Parallel()
	e := newReferralEnv(t, "")

	adir := e.mustJoin(t, "n1")
	st := agentStatus(t, adir)
	if st["authority"] != e.auth.addr || st["join_method"] != "psk" || st["authority_id"] != e.authorityID {
		t.Fatalf("status after a join through discovery: %v", st)
	}
	cfg, _ := os.ReadFile(filepath.Join(adir, "agent.yaml"))
	if strings.Contains(string(cfg), e.psk[len(psk.Prefix):]) || !strings.Contains(string(cfg), "discovery: "+e.disc.addr) {
		t.Errorf("agent.yaml after the join:\n%s", cfg)
	}
	if a := auditJoins(t, e.dir); !strings.Contains(a, "referral ticket") {
		t.Errorf("the join's audit record does not name its referral ticket:\n%s", a)
	}
	mustRun(t, "agent", "renew", "--data", adir)

	// The authority now requires a ticket: the PSK alone is refused.
	r := muster(t, []string{"MUSTER_BOOTSTRAP_PSK=" + e.psk, "MUSTER_CA_FINGERPRINT=" + e.fingerprint},
		"agent", "join", "--data", filepath.Join(t.TempDir(), "direct"), "--node", "direct", "--authority", e.auth.addr)
	wantJoinFailure(t, r, "PERMISSION_DENIED", "referral ticket is missing")

	// The joining URI with authority_id= names discovery.
	uri := "muster+psk://" + strings.TrimPrefix(e.psk, psk.Prefix) + "@" + e.disc.addr + "?fingerprint=" + e.fingerprint +
		"&authority_id=" + e.authorityID + "&discovery_fingerprint=" + e.disc.fingerprint
	if r := muster(t, []string{"MUSTER_JOIN_URI=" + uri}, "agent", "join", "--data", filepath.Join(t.TempDir(), "n2"), "--node", "n2"); r.code != 0 {
		t.Fatalf("join through discovery by URI: exit %d\n%s", r.code, r.stderr)
	}

	// A wrong discovery pin stops the agent before it asks anything.
	r = e.join(t, filepath.Join(t.TempDir(), "pin"), "pin", e.psk, "--discovery-fingerprint", "sha256:"+strings.Repeat("0", 64))
	wantJoinFailure(t, r, "", "discovery")
	// An authority ID discovery does not know.
	r = e.join(t, filepath.Join(t.TempDir(), "unknown"), "unknown", e.psk, "--authority-id", "prod-000000")
	wantJoinFailure(t, r, "NOT_FOUND", "")

	// After an on-demand rotation of discovery's keys, tickets signed by
	// the new key are accepted: the authority fetches the JWKS again on
	// the unknown key ID. (A new key signs once it is 15 s old.)
	mustRun(t, "discovery", "rotate-key", "--data", e.discDir)
	time.Sleep(16 * time.Second)
	e.mustJoin(t, "n3")

	m := metricsOf(t, e.auth.metrics)
	for _, want := range []string{`muster_referral_tickets_total{result="ok"} 3`, `muster_referral_tickets_total{result="missing"} 1`,
		`muster_discovery_calls_total{code="OK",operation="register"}`, `muster_joins_total{method="psk",result="ok"} 3`} {
		if !strings.Contains(m, want) {
			t.Errorf("authority metrics lack %s", want)
		}
	}
}

// TestReferralPolicy: discovery enforces the policy the authority signed,
// and its daily quota counts the joins the authority reported, not the
// tickets handed out.
func TestReferralPolicy(t *testing.T) {
	t.Parallel()
	e := newReferralEnv(t, `discovery:
  policy:
    denied_node_id_patterns: ["bad-.*"]
    new_agents_per_day: 2
`)
	r := e.join(t, filepath.Join(t.TempDir(), "bad-1"), "bad-1", e.psk)
	wantJoinFailure(t, r, "PERMISSION_DENIED", "denied pattern")

	// Tickets that lead to no join do not count: a wrong PSK gets a
	// ticket, then is refused by the authority.
	other, _ := psk.Generate()
	for i := range 3 {
		node := "wrong-" + string(rune('a'+i))
		wantJoinFailure(t, e.join(t, filepath.Join(t.TempDir(), node), node, other.Reveal()), "PERMISSION_DENIED", "bootstrap PSK does not match")
	}
	e.mustJoin(t, "q1")
	e.mustJoin(t, "q2")
	// The reports travel asynchronously; once both are in, the quota is
	// spent.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		r := e.join(t, filepath.Join(t.TempDir(), "q3"), "q3", e.psk)
		if r.code != 0 && strings.Contains(r.stderr, "RESOURCE_EXHAUSTED") && strings.Contains(r.stderr, "quota") {
			break
		}
		if r.code == 0 || time.Now().After(deadline) {
			t.Fatalf("third join with a quota of 2: exit %d\n%s", r.code, r.stderr)
		}
	}
}

// TestReferralImpostorGetsNoPSK: an endpoint that discovery lists and whose
// certificate chains to the pinned root but does not name the authority
// (here a server certificate without the SPIFFE SAN, standing for a
// compromised discovery or any other server of the fleet) receives nothing:
// the agent refuses it in the handshake.
func TestReferralImpostorGetsNoPSK(t *testing.T) {
	t.Parallel()
	dir, init := initDir(t)
	h, err := ca.Load(filepath.Join(dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	issuer := h.Issuer(ca.RoleServer)
	leaf, err := issuer.Issue(ca.LeafRequest{PublicKey: key.Public(), CommonName: "impostor", ServerAuth: true,
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, NotBefore: time.Now(), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{leaf.Raw, issuer.Cert.Raw, h.Root.Raw}, PrivateKey: key}},
		NextProtos:   []string{"h2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	var received atomic.Int64
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				n, _ := io.Copy(io.Discard, c)
				received.Add(n)
			}()
		}
	}()

	// The authority advertises the impostor's address, so discovery lists
	// it as the endpoint.
	d := startDiscovery(t, filepath.Join(t.TempDir(), "discovery"), allowing(init)...)
	auth := startAuthority(t, dir, "--discovery", d.addr, "--discovery-fingerprint", d.fingerprint, "--advertise", lis.Addr().String())
	e := &referralEnv{disc: d, dir: dir, authorityID: init["authority_id"].(string), fingerprint: init["ca_fingerprint"].(string),
		psk: init["bootstrap_psk"].(string)}
	e.waitRegistered(t)
	adir := filepath.Join(t.TempDir(), "victim")
	r := e.join(t, adir, "victim", e.psk)
	wantJoinFailure(t, r, "", "not an authority")
	assertNoAgentCerts(t, adir)
	time.Sleep(200 * time.Millisecond)
	if n := received.Load(); n != 0 {
		t.Fatalf("the impostor received %d bytes of application data", n)
	}
	if a := mustRun(t, "audit", "list", "--data", dir, "--authority", auth.listen, "-o", "json"); strings.Contains(a, "victim") {
		t.Fatalf("the authority heard of the join:\n%s", a)
	}
}

// TestPSKOptionalMigration: bootstrap.psk_required false admits agents on
// a ticket alone until psk_optional_until, and only with discovery.
func TestPSKOptionalMigration(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	line := mustFail(t, "authority", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "",
		"--psk-required=false", "--psk-optional-until", time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	if !strings.Contains(line, "needs referral tickets") {
		t.Errorf("psk_required false without discovery: %q", line)
	}
	line = mustFail(t, "authority", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--psk-required=false",
		"--discovery", "127.0.0.1:1")
	if !strings.Contains(line, "psk_optional_until") {
		t.Errorf("psk_required false without an end: %q", line)
	}

	until := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	e := newReferralEnv(t, "bootstrap:\n  psk_required: false\n  psk_optional_until: "+until+"\n")
	adir := filepath.Join(t.TempDir(), "legacy")
	if r := e.join(t, adir, "legacy", ""); r.code != 0 {
		t.Fatalf("join on a ticket alone during the migration: exit %d\n%s", r.code, r.stderr)
	}
	if a := auditJoins(t, e.dir); !strings.Contains(a, "no PSK") {
		t.Errorf("the PSK-less join is not audited as such:\n%s", a)
	}
	// A wrong PSK is still refused.
	other, _ := psk.Generate()
	wantJoinFailure(t, e.join(t, filepath.Join(t.TempDir(), "w"), "w", other.Reveal()), "PERMISSION_DENIED", "does not match")
}

// TestDiscoveryReplicasOnPostgres: two discovery processes share one
// PostgreSQL database (and the same data directory files): an authority
// registered through one is looked up through the other, an agent joins
// with a ticket from either, and a key rotated through the store is served
// by both.
func TestDiscoveryReplicasOnPostgres(t *testing.T) {
	t.Parallel()
	url := postgres(t)
	dir, init := initDir(t)
	ddir := filepath.Join(t.TempDir(), "discovery")
	d1 := startDiscovery(t, ddir, append(allowing(init), "--store", url)...)
	d2 := startDiscovery(t, replicaDir(t, ddir), append(allowing(init), "--store", url)...)
	if d1.fingerprint != d2.fingerprint {
		t.Fatalf("replicas with the same files have different pins: %s, %s", d1.fingerprint, d2.fingerprint)
	}
	// Replica 2, started under another issuer while replica 1 runs,
	// says so as it starts.
	if logs := d2.Logs(); !strings.Contains(logs, "started under the ticket issuer https://"+d1.addr+", not https://"+d2.addr) {
		t.Errorf("replica 2, started under another issuer than replica 1, does not warn:\n%s", logs)
	}
	e := &referralEnv{disc: d1, discDir: ddir, dir: dir, authorityID: init["authority_id"].(string),
		fingerprint: init["ca_fingerprint"].(string), psk: init["bootstrap_psk"].(string)}
	e.auth = startAuthority(t, dir, "--discovery", d1.addr, "--discovery-fingerprint", d1.fingerprint)
	e.waitRegistered(t)
	// Replica 2 knows the registration; its tickets carry replica 2's
	// issuer, which the authority does not accept: the agent names the
	// discovery the authority trusts.
	e.disc = d2
	e.waitRegistered(t)
	// The refusal names both ways out: the discovery the authority names,
	// and the --advertise every replica must be started with.
	wantJoinFailure(t, e.join(t, filepath.Join(t.TempDir(), "via-2"), "via-2", e.psk), "PERMISSION_DENIED",
		"not by this authority's discovery \"https://"+d1.addr+"\": join through discovery at "+d1.addr+", or start every discovery replica with --advertise "+d1.addr)
	e.disc = d1
	e.mustJoin(t, "via-1")

	before := servedKeys(t, d2)
	mustRun(t, "discovery", "rotate-key", "--data", ddir, "--store", url)
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if k1, k2 := servedKeys(t, d1), servedKeys(t, d2); len(k1) == len(before)+1 && strings.Join(k1, ",") == strings.Join(k2, ",") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the rotated key is not served by both replicas: %v, %v (before %v)", servedKeys(t, d1), servedKeys(t, d2), before)
		}
	}
}

// TestReferralReportSurvivesCrash: the report of a join waits in the
// authority's store until discovery has it. A join made while discovery is
// down, by an authority killed before it could report, still counts toward
// the daily quota once both are back.
func TestReferralReportSurvivesCrash(t *testing.T) {
	t.Parallel()
	e := newReferralEnv(t, "discovery:\n  policy:\n    new_agents_per_day: 1\n")
	j := &joinEnv{dir: e.dir, auth: e.auth}
	j.setup(t)
	ctx := t.Context()
	ticket := func(d *discoveryProc, node string) (*musterv1.RequestReferralTicketResponse, error) {
		conn, err := discoveryclient.Dial(d.addr, d.fingerprint)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return musterv1.NewDiscoveryServiceClient(conn).RequestReferralTicket(ctx,
			&musterv1.RequestReferralTicketRequest{AuthorityId: e.authorityID, NodeId: node})
	}
	tk, err := ticket(e.disc, "crash-1")
	if err != nil {
		t.Fatalf("a ticket under a quota of 1 with no join yet: %v", err)
	}
	c := pskClient(t, j, e.auth.addr)
	_, csr := nodeCSR(t, "crash-1")
	// The ticket is checked before the PSK, and a refusal uses nothing:
	// this one proves the authority holds discovery's keys, so the join
	// below needs no discovery.
	other, _ := psk.Generate()
	_, err = c.RequestCertificate(ctx, &musterv1.RequestCertificateRequest{Csr: csr, BootstrapPsk: other.Reveal(), ReferralTicket: tk.GetTicket()})
	wantCode(t, err, codes.PermissionDenied, "does not match")

	e.disc.stop(t)
	if _, err := c.RequestCertificate(ctx, &musterv1.RequestCertificateRequest{Csr: csr, BootstrapPsk: e.psk, ReferralTicket: tk.GetTicket()}); err != nil {
		t.Fatalf("join with the ticket while discovery is down: %v\n%s", err, e.auth.Logs())
	}
	// The report cannot go out; the authority dies with it pending.
	waitMetric(t, e.auth, "muster_discovery_reports_pending 1", 10*time.Second)
	e.auth.cmd.Process.Kill()
	<-e.auth.done

	// Discovery comes back on the same address and data (so the issuer
	// is the same), then the authority.
	disc := startDiscovery(t, e.discDir, append(allowing(map[string]any{"authority_id": e.authorityID, "ca_fingerprint": e.fingerprint}),
		"--listen", e.disc.addr)...)
	auth := startAuthority(t, e.dir, "--discovery", disc.addr, "--discovery-fingerprint", disc.fingerprint)
	waitMetric(t, auth, `muster_discovery_calls_total{code="OK",operation="report"} 1`, 10*time.Second)
	waitMetric(t, auth, "muster_discovery_reports_pending 0", time.Second)
	_, err = ticket(disc, "crash-2")
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "quota") {
		t.Fatalf("a ticket once the join is reported: %v, want RESOURCE_EXHAUSTED quota", err)
	}
}

// waitMetric waits until the authority's metrics contain line.
func waitMetric(t *testing.T, p *authorityProc, line string, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); !strings.Contains(metricsOf(t, p.metrics), line); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the authority's metrics lack %q after %v\n%s", line, within, p.Logs())
		}
	}
}

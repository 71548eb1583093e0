// Package authority is the service layer of the muster authority: it serves
// the gRPC API over TLS, authorizes every call by the role in the caller's
// certificate (authz.go), translates requests into calls on the domain
// packages, and maps their errors to status codes in one place (status.go).
// It holds no business rule of its own.
package authority

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/callcap"
	"github.com/muster-dev/muster/internal/crl"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/enroll"
	"github.com/muster-dev/muster/internal/h2window"
	"github.com/muster-dev/muster/internal/httpserve"
	"github.com/muster-dev/muster/internal/jwtsvid"
	"github.com/muster-dev/muster/internal/listener"
	"github.com/muster-dev/muster/internal/metricsmux"
	"github.com/muster-dev/muster/internal/ratelimit"
	"github.com/muster-dev/muster/internal/requestcodec"
	"github.com/muster-dev/muster/internal/retrywait"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// Config is everything the authority needs; the CLI builds it from flags,
// authority.yaml and the data directory.
type Config struct {
	Dir datadir.Dir
	// ConfigFile is the settings file the authority was started with
	// (muster authority --config; "": DIR/authority.yaml), which the
	// offline commands it names in its ways out must read too: the store
	// URL may be only there.
	ConfigFile string
	Info       datadir.Info
	CA         *ca.Hierarchy
	Store      store.Store
	Audit      *audit.Logger
	// StorageKey seals token secrets and keys the decoy trust bundles.
	StorageKey seal.StorageKey
	// Token, if set, is the PKCS#11 token new CA intermediates and task
	// signers are generated in (docs/hsm.md); keys already sealed in the
	// store keep being used where they are.
	Token *custody.Token
	// Listen serves the whole API; BootstrapListen (optional) only the
	// unauthenticated bootstrap RPCs; MetricsListen (optional) /metrics,
	// /healthz and /readyz over plain HTTP.
	Listen          string
	Advertise       string
	BootstrapListen string
	MetricsListen   string
	AgentCertTTL    time.Duration
	// Discovery, if set, is the discovery service the authority registers
	// with; every PSK bootstrap then needs its referral ticket.
	Discovery *DiscoveryConfig
	// PSKOptionalUntil, if set (bootstrap.psk_required: false), admits
	// bootstraps with a valid referral ticket and no PSK until then. It
	// needs Discovery.
	PSKOptionalUntil time.Time
	// TrustedProxies are the TCP load balancers whose PROXY protocol
	// header names a connection's source; empty: none.
	TrustedProxies []netip.Prefix
	Version        string
	Log            *slog.Logger
	// Ready, when set, is called once every listener is bound, with the
	// address the API is reachable at and the bound metrics address (""
	// without one).
	Ready func(apiAddr, metricsAddr string)

	// SignerMinLeadTime is signer.min_lead_time: how far ahead a staged
	// signer must become effective (0: signer.DefaultMinLeadTime).
	SignerMinLeadTime time.Duration
	// RecoveriesWarnAt is bound_keypair.recoveries_warn_at: a counted
	// bound-keypair recovery that leaves this many or fewer is logged as a
	// warning and audited (token.recoveries_low); negative disables it.
	RecoveriesWarnAt int64
	// BoundKeypairCertTTL is the lifetime of bound-keypair agents'
	// certificates (zero: enroll.DefaultBoundKeypairCertTTL).
	BoundKeypairCertTTL time.Duration
	// BoundKeypairChallengeTTL is how long a bound-keypair challenge is
	// valid and waited for (zero: boundkeypair.ChallengeTTL, a minute,
	// which is also the most); a stream not answered by then is ended.
	BoundKeypairChallengeTTL time.Duration
	// CAIntermediateTTL is ca.intermediate_ttl: the lifetime of the
	// intermediates the leader prepares (zero: ca.IntermediateTTL).
	CAIntermediateTTL time.Duration
	// CADraftTTL is ca.draft_ttl: how long a draft for an offline-root
	// rotation (muster ca rotate ROLE --root-key FILE) waits for its signed
	// certificate before its key is destroyed (zero: DefaultCADraftTTL).
	CADraftTTL time.Duration
	// CAPublishWindow is how long a prepared intermediate is in the store
	// before it may be activated (zero: caPublishWindow); tests shorten it.
	CAPublishWindow time.Duration
	// Clock, if set, is the replica's clock for what it serves as of now:
	// the trust bundle leaves out every certificate past its NotAfter by
	// it (nil: time.Now). Tests move it; the authority's deadlines use
	// the store's clock, never this one.
	Clock func() time.Time
	// CATick is how often the leader's CA clock steps (zero: caTick);
	// tests shorten it, with CAPublishWindow, so that a root rotation's
	// update_servers (which waits for the clock to prepare and activate
	// intermediates under the new root) answers in moments.
	CATick time.Duration
	// WrapCACustody, if set, wraps the custody of the CA keys (tests:
	// counting what is destroyed, a token in place of sealed keys).
	WrapCACustody func(custody.Custody) (custody.Custody, error)
	// JWTKeyRotationPeriod is jwt_svid.key_rotation_period: how long a
	// JWT-SVID signing key version signs before the next one replaces it
	// (zero: DefaultJWTKeyRotationPeriod; at least MinJWTKeyRotationPeriod).
	JWTKeyRotationPeriod time.Duration
	// CRLListen (optional) serves the certificate revocation lists over
	// plain HTTP; CRLURL (optional) is the base URL relying parties fetch
	// them from, named in every new leaf. Either one keeps the lists
	// signed; CRLValidity is their lifetime (zero: crl.DefaultValidity).
	CRLListen   string
	CRLURL      string
	CRLValidity time.Duration
	// MaxConnections is limits.max_connections: the connections the api
	// and bootstrap listeners hold open at once together, from all sources
	// (zero: listener.DefaultMaxConns, from the open-file limit).
	MaxConnections int
	// CallTimeout is limits.call_timeout: the longest a call may last,
	// its request and reply included, unless the caller asked for less
	// or the call bounds itself (limits.go, callDeadline). Zero:
	// DefaultCallTimeout.
	CallTimeout time.Duration
	// MaxCallsPerSource is limits.max_calls_per_source: the calls one
	// source address may have in flight at once, agents' streams aside
	// (limits.go, callTap). Zero: DefaultMaxCallsPerSource.
	MaxCallsPerSource int
	// RenewalsPerLifetime is limits.renewals_per_lifetime: how many
	// renewals one instance is given at once, and again in each lifetime
	// of its certificates (enroll's allowRenewal). Zero:
	// DefaultRenewalsPerLifetime.
	RenewalsPerLifetime int
}

// Server is a running authority.
type Server struct {
	// token is the PKCS#11 token of the keys' custody; nil without one.
	token    *custody.Token
	info     datadir.Info
	ca       *ca.Hierarchy
	store    store.Store
	audit    *audit.Logger
	log      *slog.Logger
	metrics  *metrics
	refusals *audit.Refusals
	// connRefusals counts and logs connections the listeners close at once.
	connRefusals *listener.Refusals
	// conns is limits.max_connections, shared by the api and bootstrap
	// listeners.
	conns *listener.Cap
	// callTimeout is limits.call_timeout (callDeadline).
	callTimeout time.Duration
	// calls is limits.max_calls_per_source (callTap), shared by the api
	// and bootstrap listeners.
	calls *callcap.Cap
	// shares divide conns among callers once their handshake tells them
	// apart (connclass.go).
	shares  *connShares
	enroll  *enroll.Service
	limiter *ratelimit.Keyed
	// renewals holds each instance's allowance of renewals
	// (limits.renewals_per_lifetime), in this replica's memory.
	renewals *ratelimit.Keyed
	tokens   *seal.Sealer
	// jwt signs JWT-SVIDs for agents (MintJWTSVID): the issuer of the
	// key version this replica last read (jwtkey.go).
	jwt atomic.Pointer[jwtsvid.Issuer]
	// jwtAt is the version jwt was last read at and when it became
	// current, for the keys' publication times (publishedFor).
	jwtAt atomic.Pointer[store.JWTKey]
	// jwtInstalls counts the issuers put in jwt (bumped before each):
	// a read of the store begun after the last one that returns an
	// earlier version is the store gone back (restored), not a stale
	// read racing a rotation (useJWTKeyRead).
	jwtInstalls atomic.Int64
	// storeClock is the store's clock as this replica last read it, for
	// the keys' publication times, which the rotation time and the
	// rotations (the store's clock both) decide (jwtkey.go).
	storeClock atomic.Pointer[storeReading]
	signers    *signer.Keeper
	// setAhead notices agents holding a newer verifier set than the
	// store's (a restore).
	setAhead *setAhead
	streams  *streamMetrics
	// agentCerts counts the nodes by their certificates' expiry.
	agentCerts *agentCerts
	// hub wakes open agent streams when a change concerns them.
	hub *streamHub
	// rootStepRead, when set (tests only), runs between stepRoot's read
	// of the rotation and its conditional write, so that a test can make
	// two replicas' steps overlap for certain instead of by luck.
	rootStepRead func()
	// caStepTimeout, when set (tests only), replaces the const of that
	// name.
	caStepTimeout time.Duration
	// live is each agent's one live stream on this replica.
	live liveStreams
	// stopping ends when the authority stops: agent streams end with it
	// (streamlive.go), so the graceful stop does not wait on them.
	stopping   context.Context
	endStreams context.CancelFunc
	// discovery is nil without a discovery service.
	discovery *discoveryLink
	started   time.Time
	cfg       Config

	advertised atomic.Pointer[string]
	// replica names this replica in the rows of the streams it holds:
	// the advertised address, and when that is not the address it is
	// bound to (replicas behind one balancer share the advertised one),
	// its host name and bound address too, so agents list tells the
	// replicas apart.
	replica atomic.Pointer[string]

	// inter reads the intermediates from the store (intermediates.go).
	inter  *intermediates
	certMu sync.Mutex
	certs  map[ca.Role]*tls.Certificate
	// certFailing are the roles whose listener certificate could not be
	// re-issued at the last try (the held one is served meanwhile).
	certFailing map[ca.Role]bool
	tails       map[ca.Role]*chainTail

	// caStepFails are the CA rotation steps failing at every tick, each
	// reported once (carotate.go).
	caStepFails stepFailures
	// caDestroyRetry spaces the CA clock's tries of a retired
	// intermediate's key destruction that keeps failing.
	caDestroyRetry retrywait.Waits
	// caNoRootKey holds, by role, when the leader last warned that a
	// successor is due and the root key is absent (carotate.go).
	caNoRootKey sync.Map
	// caPoke wakes the CA clock (a root rotation phase changed).
	caPoke chan struct{}
	// sharedNow is the shared settings in force (settings.go), and
	// settingsPoke wakes settingsClock to read them again.
	sharedNow    atomic.Pointer[SharedSettings]
	settingsPoke chan struct{}
	// sharedMu makes each loadShared's applying of what it read one step,
	// and sharedVersions (under it) is, by key, the store's version in
	// force: a reading that ends after a newer one (settingsClock's and a
	// SetSetting's, at once) puts no older value back.
	sharedMu       sync.Mutex
	sharedVersions map[string]int64
	// sharedUnreadable is, by key, the stored value loadShared last
	// logged it cannot read: logged once, not at every reading.
	sharedUnreadable sync.Map
	// caCerts are the certificates the CA clock parsed (certcache.go).
	caCerts certCache
	// caDraftSwept is when the CA clock last looked for abandoned drafts
	// (a time.Time).
	caDraftSwept atomic.Value
	// outage logs a store outage once, not once per failed request.
	outage *storeOutage
	// streamEnds are the ends of agent streams still to be recorded.
	streamEnds *pendingEnds

	// anchors is the client-certificate check's short path (clientchain.go).
	anchors clientAnchors

	// crl is nil unless lists are asked for (crl.go).
	crl *crl.Publisher
	// crlCache serves the lists (crlHandler); nil with crl.
	crlCache *crlCache

	// bundle is the trust bundle answers carry (trustbundle.go).
	bundle bundleCache
}

// New builds a server; Run starts it.
func New(cfg Config, m *Metrics) (*Server, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.AgentCertTTL == 0 {
		cfg.AgentCertTTL = enroll.DefaultAgentCertTTL
	}
	stopping, endStreams := context.WithCancel(context.Background())
	s := &Server{
		stopping:       stopping,
		endStreams:     endStreams,
		info:           cfg.Info,
		token:          cfg.Token,
		caPoke:         make(chan struct{}, 1),
		caDestroyRetry: retrywait.Waits{First: caDestroyFirstWait, Max: caDestroyMaxWait},
		settingsPoke:   make(chan struct{}, 1),
		ca:             cfg.CA,
		store:          cfg.Store,
		audit:          cfg.Audit,
		log:            cfg.Log,
		metrics:        m.m,
		started:        time.Now(),
		cfg:            cfg,
		certs:          map[ca.Role]*tls.Certificate{},
		hub:            newStreamHub(),
	}
	// The shared settings start as configured (the CLI has reconciled
	// them with the store's); settingsClock follows the store's after.
	first := configuredShared(cfg)
	s.sharedNow.Store(&first)
	s.outage = newStoreOutage(cfg.Log, func(ctx context.Context) error {
		_, err := cfg.Store.Now(ctx)
		return err
	})
	s.metrics.outage = s.outage
	s.streamEnds = newPendingEnds(cfg.Store, cfg.Log)
	s.streamEnds.unavailable = s.outage.fail
	s.refusals = audit.NewRefusals(cfg.Audit, "authority", cfg.Log)
	s.refusals.Reported = s.outage.fail
	if err := s.metrics.reg.Register(newTokenCollector(s)); err != nil {
		return nil, err
	}
	if err := s.metrics.reg.Register(newCACollector(s)); err != nil {
		return nil, err
	}
	connRefusals, err := listener.NewRefusalsMetric(s.metrics.reg, cfg.Log)
	if err != nil {
		return nil, err
	}
	s.connRefusals = connRefusals
	s.conns = listener.NewCap(cfg.MaxConnections).EvictSilent()
	s.callTimeout = cmp.Or(cfg.CallTimeout, DefaultCallTimeout)
	s.calls = callcap.New(cmp.Or(cfg.MaxCallsPerSource, DefaultMaxCallsPerSource), callcap.HealthWatches)
	s.shares = newConnShares(s.conns.Max())
	s.limiter = ratelimit.New(bootstrapRate, bootstrapBurst)
	// Every renewal names its own rate, from its certificates' lifetime.
	s.renewals = ratelimit.New(1, 1)
	if s.tokens, err = cfg.StorageKey.Sealer(seal.InfoToken); err != nil {
		return nil, err
	}
	if err := s.loadJWTKey(); err != nil {
		return nil, err
	}
	psks, err := cfg.StorageKey.Sealer(seal.InfoPSK)
	if err != nil {
		return nil, err
	}
	signerKeys, err := SignerCustody(cfg.StorageKey, cfg.Token)
	if err != nil {
		return nil, err
	}
	if s.inter, err = newIntermediates(s); err != nil {
		return nil, err
	}
	s.signers = signer.NewKeeper(cfg.Store, signerKeys, loggedAudit{s}, cfg.Info.AuthorityID, cfg.SignerMinLeadTime)
	if s.streams, err = newStreamMetrics(s.metrics.reg); err != nil {
		return nil, err
	}
	if s.setAhead, err = newSetAhead(s.metrics.reg); err != nil {
		return nil, err
	}
	joinStates, err := cfg.StorageKey.Sealer(seal.InfoJoinState)
	if err != nil {
		return nil, err
	}
	recoveries, err := newRecoveriesGauge(s.metrics.reg)
	if err != nil {
		return nil, err
	}
	if s.agentCerts, err = newAgentCerts(s, s.metrics.reg); err != nil {
		return nil, err
	}
	if !cfg.PSKOptionalUntil.IsZero() && cfg.Discovery == nil {
		return nil, errors.New("authority: bootstrap.psk_required false needs referral tickets: configure a discovery service")
	}
	var tickets enroll.TicketVerifier
	if cfg.Discovery != nil {
		if s.discovery, err = newDiscoveryLink(s, *cfg.Discovery); err != nil {
			return nil, err
		}
		tickets = s.discovery.verifier()
	}
	endpoints := []string{}
	if cfg.Advertise != "" {
		endpoints = append(endpoints, cfg.Advertise)
	}
	s.enroll, err = enroll.New(enroll.Config{
		Store:       cfg.Store,
		Audit:       enrollAuditor{s},
		CA:          cfg.CA,
		AuthorityID: cfg.Info.AuthorityID,
		TrustDomain: cfg.Info.TrustDomain,
		Endpoints:   endpoints,
		TokenSealer: s.tokens,
		PSKConfig: enroll.PSKConfig{
			PSKSealer: psks,
			ExpireGracePSKs: func(ctx context.Context) {
				s.expireGracePSKs(context.WithoutCancel(ctx))
			},
			PSKObserver:      s.metrics.pskValidation,
			Tickets:          tickets,
			PSKOptionalUntil: cfg.PSKOptionalUntil,
			TicketObserver:   s.metrics.ticket,
		},
		BoundKeypair: enroll.BoundKeypairConfig{
			JoinStateSealer:  joinStates,
			JoinStateCustody: JoinStateCustody(joinStates, cfg.Token),
			Observer: func(token string, remaining int64) {
				recoveries.WithLabelValues(token).Set(float64(remaining))
			},
			WarnAt:       cfg.RecoveriesWarnAt,
			CertTTL:      cfg.BoundKeypairCertTTL,
			ChallengeTTL: cfg.BoundKeypairChallengeTTL,
			Low: func(token, node string, remaining int64) {
				s.log.Warn("bound-keypair token is running out of recoveries", "token", token, "node", node,
					"recoveries_remaining", remaining, "warn_at", cfg.RecoveriesWarnAt)
			},
			Ahead: func(token, node string) {
				s.log.Warn("bound-keypair join state ahead of the store, refused: "+boundkeypair.ResyncHint, "token", token, "node", node)
			},
		},
		DecoyKey:            cfg.StorageKey.Derive(seal.InfoTrustBundleDecoy, 32),
		AgentCertTTL:        cfg.AgentCertTTL,
		Limiter:             s.limiter,
		Renewals:            s.renewals,
		RenewalsPerLifetime: cmp.Or(cfg.RenewalsPerLifetime, DefaultRenewalsPerLifetime),
	})
	if err != nil {
		return nil, err
	}
	if err := s.setupCRL(cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// advertise is the address agents reach the API at, once it is known.
func (s *Server) advertise() string {
	if a := s.advertised.Load(); a != nil {
		return *a
	}
	return s.cfg.Advertise
}

// replicaName is how the rows of this replica's streams name it.
func (s *Server) replicaName() string {
	if r := s.replica.Load(); r != nil {
		return *r
	}
	return s.advertise()
}

// enrollAuditor lets enrollment write the audit log, its refusals through
// the flood guard.
type enrollAuditor struct{ s *Server }

func (a enrollAuditor) Record(ctx context.Context, e audit.Event) error {
	// Some records follow a committed join (token.resync,
	// token.recoveries_low) whose answer must not be lost over them, so
	// their callers go on: the operator hears of the gap from
	// recordAudit's log line, the one line of a failure.
	return a.s.recordAudit(ctx, e)
}

func (a enrollAuditor) Refuse(ctx context.Context, e audit.Event) { a.s.refusals.Record(ctx, e) }

func (a enrollAuditor) Builder(e audit.Event) (*audit.Link, error) { return a.s.audit.Builder(e) }

func (a enrollAuditor) Appended(link *audit.Link) { a.s.audit.Appended(link) }

// Metrics holds the authority's metric registry. It exists before the
// audit logger so the logger can count what it writes.
type Metrics struct{ m *metrics }

// NewMetrics creates the registry.
func NewMetrics(version string) *Metrics { return &Metrics{newMetrics(version)} }

// OnAudit is the audit logger's hook.
func (m *Metrics) OnAudit(e audit.Event) { m.m.onAudit(e) }

// serverCertTTL is short because the authority re-issues its own
// certificate by itself, long before it expires.
const serverCertTTL = 24 * time.Hour

// certificate returns the listener's certificate for role, issuing a new one
// when none exists or the current one is past half its life.
func (s *Server) certificate(role ca.Role, hosts []string) (*tls.Certificate, error) {
	s.certMu.Lock()
	defer s.certMu.Unlock()
	now := time.Now()
	issuer := s.ca.Issuer(role)
	// Re-issued at half its life, and as soon as another intermediate of
	// the role is active (a rotation), so the listener's chain follows it.
	tail := s.chainTail(role, issuer.Cert)
	if c := s.certs[role]; c != nil && now.Before(c.Leaf.NotBefore.Add(c.Leaf.NotAfter.Sub(c.Leaf.NotBefore)/2)) &&
		bytes.Equal(c.Certificate[1], issuer.Cert.Raw) {
		if sameDERs(c.Certificate[2:], tail) {
			return c, nil
		}
		// The roots changed (a root rotation step): same leaf, new tail.
		c = &tls.Certificate{Certificate: append([][]byte{c.Certificate[0], c.Certificate[1]}, tail...), PrivateKey: c.PrivateKey, Leaf: c.Leaf}
		s.certs[role] = c
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	id, err := spiffeid.New(s.info.TrustDomain, spiffeid.RoleAuthority, s.info.AuthorityID)
	if err != nil {
		return nil, err
	}
	req := ca.LeafRequest{
		PublicKey:  key.Public(),
		SPIFFEID:   id.URL(),
		CommonName: s.info.AuthorityID,
		ServerAuth: true,
		NotBefore:  now,
		TTL:        serverCertTTL,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			req.IPAddresses = append(req.IPAddresses, ip)
		} else if h != "" {
			req.DNSNames = append(req.DNSNames, h)
		}
	}
	leaf, err := issuer.Issue(req)
	if err != nil {
		err = fmt.Errorf("authority: issuing the %s listener certificate: %w", role, err)
		if c := s.certs[role]; c != nil && now.Before(c.Leaf.NotAfter) {
			// The intermediate's key cannot sign now (its PKCS#11 token
			// is unavailable): the certificate held is still valid, so
			// every handshake goes on with it rather than failing, and
			// calls that need no signature (streams, admin calls, the
			// refusals that say the token is unavailable) are answered.
			// Tried again at the next handshake.
			// Logged once per failing spell, not at every handshake.
			if !s.certFailing[role] {
				s.log.Warn("the listener certificate could not be re-issued; serving the one held until it can", "role", string(role), "not_after", c.Leaf.NotAfter, "err", err)
				if s.certFailing == nil {
					s.certFailing = map[ca.Role]bool{}
				}
				s.certFailing[role] = true
			}
			return c, nil
		}
		return nil, err
	}
	if s.certFailing[role] {
		delete(s.certFailing, role)
		s.log.Info("the listener certificate re-issued again", "role", string(role), "not_after", leaf.NotAfter)
	}
	// The chain ends with the root, so an agent that pins only the root's
	// fingerprint (the PSK and bound-keypair flows) can check it before it
	// sends a secret.
	c := &tls.Certificate{Certificate: append([][]byte{leaf.Raw, issuer.Cert.Raw}, tail...), PrivateKey: key, Leaf: leaf}
	s.certs[role] = c
	return c, nil
}

// expiredWayOut is the command that replaces role's expired active
// intermediate with the authority stopped (muster ca rotate --offline):
// the pkcs11 build where the keys are in a token, which the static
// muster refuses to open.
func (s *Server) expiredWayOut(role ca.Role) string {
	bin := "muster"
	if s.token != nil {
		bin = "muster-pkcs11"
	}
	return fmt.Sprintf("%s ca rotate %s --offline --data %s%s", bin, role, shellword.Quote(string(s.cfg.Dir)), s.cfg.Dir.ConfigArg(s.cfg.ConfigFile))
}

// chainTail is what a listener presents after its leaf and intermediate:
// the root that signed the intermediate, last, so an agent pinning it
// finds it where it always was; and during a root rotation, before it,
// every other trusted root with the cross-certificate of the signing
// root's key by that root, so an agent that pins (or trusts) only the
// other root accepts the signing one (identity.VerifyPeer) and a join
// pinned to either fingerprint works (DESIGN.md "Root rotation"). Cached
// per intermediate and root set; the caller holds certMu.
func (s *Server) chainTail(role ca.Role, issuer *x509.Certificate) [][]byte {
	rs := s.ca.Roots()
	if t := s.tails[role]; t != nil && t.issuer == issuer && t.roots == rs {
		return t.ders
	}
	var signing *x509.Certificate
	for _, r := range rs.Trusted {
		if issuer.CheckSignatureFrom(r) == nil {
			signing = r
			break
		}
	}
	if signing == nil {
		signing = rs.Signing
	}
	var ders [][]byte
	for _, other := range rs.Trusted {
		if other == signing {
			continue
		}
		for _, x := range rs.Cross {
			if bytes.Equal(x.RawSubjectPublicKeyInfo, signing.RawSubjectPublicKeyInfo) && x.CheckSignatureFrom(other) == nil {
				ders = append(ders, x.Raw, other.Raw)
			}
		}
	}
	ders = append(ders, signing.Raw)
	if s.tails == nil {
		s.tails = map[ca.Role]*chainTail{}
	}
	s.tails[role] = &chainTail{issuer: issuer, roots: rs, ders: ders}
	return ders
}

// chainTail is chainTail's cache.
type chainTail struct {
	issuer *x509.Certificate
	roots  *ca.RootSet
	ders   [][]byte
}

func sameDERs(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

func (s *Server) serverTLS(role ca.Role, hosts []string) (*tls.Config, error) {
	if _, err := s.certificate(role, hosts); err != nil {
		if errors.Is(err, ca.ErrIssuerExpired) {
			// The authority was stopped (or its store restored from a
			// backup) for longer than the intermediate had left: the
			// leader's clock, which would have replaced it, runs only in
			// a started replica, so the replacement is made beside it.
			err = fmt.Errorf("%w; replace it with a new intermediate under the root, on the machine with the data directory: %s (with the root key offline add --root-key FILE; docs/ca-lifecycle.md, \"An expired intermediate\")", err, s.expiredWayOut(role))
			actx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, _ = s.audit.Record(actx, audit.Event{Actor: "authority", Action: "authority.start", Target: s.info.AuthorityID,
				Result: audit.ResultDenied, Reason: err.Error()})
			cancel()
		}
		return nil, err
	}
	// listener.ServerTLS: no session tickets, so no resumption; the
	// per-handshake checks (the connection's class and share,
	// connclass.go; its kept chain, connchain.go) see every connection's
	// own CertificateVerify (TestNoSessionTickets).
	cfg := listener.ServerTLS("h2")
	// Ask for a client certificate but do not require one: bootstrap
	// callers have none yet, and an agent that has one must be seen as
	// renewing, never as joining again. A certificate given is verified
	// by authorize (clientChain), not in the handshake, so an expired
	// or foreign one is answered UNAUTHENTICATED with its reason, and
	// audited, rather than as a failed connection (UNAVAILABLE).
	cfg.ClientAuth = tls.RequestClientCert
	cfg.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		return s.certificate(role, hosts)
	}
	if role == ca.RoleServer {
		// Name the agent and admin intermediates in the CertificateRequest
		// (certificate_authorities), so a client whose leaf one of them
		// issued presents the leaf alone (identity.ClientTLS), and the
		// connection does not keep a parsed copy of an intermediate this
		// authority has. With RequestClientCert crypto/tls only
		// advertises these names: it verifies against ClientCAs from
		// VerifyClientCertIfGiven up, so the check stays authorize's.
		// The bootstrap listener serves anonymous callers only.
		cfg.ClientCAs = s.anchors.clientIssuers(s.ca)
	}
	return cfg, nil
}

func (s *Server) grpcServer(tc *tls.Config, admin bool) *grpc.Server {
	unaryAuth, streamAuth := s.interceptors(!admin)
	name := "bootstrap"
	if admin {
		name = "api"
	}
	var gs *grpc.Server
	// Fixed flow-control windows (h2window): no WINDOW_UPDATE and PING
	// with every call.
	gs = grpc.NewServer(append(h2window.ServerOptions(),
		grpc.Creds(sharedCreds{TransportCredentials: credentials.NewTLS(tc), s: s, refused: s.connRefusals.For(name, s.conns.Max())}),
		grpc.ChainUnaryInterceptor(s.metrics.unary, unaryAuth),
		grpc.ChainStreamInterceptor(s.metrics.stream, streamAuth),
		// Every request muster takes is small; a CSR is under 1 KiB. A
		// larger message is refused with RESOURCE_EXHAUSTED before it is
		// parsed.
		grpc.MaxRecvMsgSize(maxRequestSize),
		grpc.MaxHeaderListSize(listener.MaxHeaderListSize),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// A connection must finish its TLS handshake within
		// handshakeTimeout, is closed after idleTimeout without a call,
		// and carries at most maxStreams calls at once (limits.go).
		grpc.ConnectionTimeout(handshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: idleTimeout}),
		grpc.MaxConcurrentStreams(maxStreams),
		// No source has more than limits.max_calls_per_source calls in
		// flight, and no call lasts longer than limits.call_timeout,
		// unless it bounds itself: a connection carrying a call is never
		// idle.
		grpc.InTapHandle(s.callTap()),
		// Calls to a method the listener does not serve pass the stream
		// interceptors and are audited (unknownMethod).
		grpc.UnknownServiceHandler(func(srv any, ss grpc.ServerStream) error {
			return s.unknownMethod(gs, ss)
		}),
		grpc.ForceServerCodecV2(requestcodec.New()),
		// Every agent holds a connection open for its stream, idle
		// between tasks: per-connection buffers are most of what a
		// stream costs (limits.go, streamReadBuffer).
		grpc.ReadBufferSize(streamReadBuffer),
	)...)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, newBoundedHealth(hs, s.refusals))
	// The bootstrap listener serves the unauthenticated RPCs alone: there
	// CertificateService takes PSK bootstraps only (bootstrapAccess).
	// guarded: a request body that cannot be read is refused by unaryAuth
	// (or the stream's RecvMsg), audited, rather than inside gRPC.
	gs.RegisterService(s.guarded(&musterv1.BootstrapService_ServiceDesc), &bootstrapService{s: s})
	gs.RegisterService(s.guarded(&musterv1.CertificateService_ServiceDesc), &certificateService{s: s})
	gs.RegisterService(s.guarded(&musterv1.JoinService_ServiceDesc), &joinService{s: s})
	if admin {
		gs.RegisterService(s.guarded(&musterv1.AgentService_ServiceDesc), &agentService{s: s})
		gs.RegisterService(s.guarded(&musterv1.AdminService_ServiceDesc), &adminService{s: s})
	}
	reflection.Register(gs)
	return gs
}

// Run binds every listener, records the advertised address, serves until
// ctx is done and then stops gracefully.
func (s *Server) Run(ctx context.Context) error {
	// Before any listener: every leaf, the listeners' own included, is
	// signed by the store's active intermediate.
	if err := s.inter.start(ctx); err != nil {
		if errors.Is(err, custody.ErrKeyMissing) {
			// A refusal with a way out (an intermediate's key lost
			// from the token): audited, as every refusal to start.
			_, _ = s.audit.Record(context.WithoutCancel(ctx), audit.Event{Actor: "authority", Action: "authority.start", Target: s.info.AuthorityID,
				Result: audit.ResultDenied, Reason: err.Error()})
		}
		return err
	}
	lis, err := listener.ListenAs(s.cfg.Listen, "api", s.cfg.TrustedProxies, s.conns, s.connRefusals)
	if err != nil {
		return fmt.Errorf("authority: cannot listen on %s: %w", s.cfg.Listen, err)
	}
	defer lis.Close()
	advertise := s.cfg.Advertise
	if advertise == "" {
		advertise = lis.Addr().String()
	}
	s.enroll.SetEndpoints([]string{advertise})
	s.advertised.Store(&advertise)
	replica := replicaLabel(advertise, lis.Addr().String(), os.Hostname)
	s.replica.Store(&replica)
	tc, err := s.serverTLS(ca.RoleServer, listener.Hosts(s.cfg.Listen, lis.Addr().String(), advertise))
	if err != nil {
		return err
	}
	api := s.grpcServer(tc, true)

	var bootLis net.Listener
	var boot *grpc.Server
	if s.cfg.BootstrapListen != "" {
		if bootLis, err = listener.ListenAs(s.cfg.BootstrapListen, "bootstrap", s.cfg.TrustedProxies, s.conns, s.connRefusals); err != nil {
			return fmt.Errorf("authority: cannot listen on %s (bootstrap): %w", s.cfg.BootstrapListen, err)
		}
		defer bootLis.Close()
		btc, err := s.serverTLS(ca.RoleBootstrap, listener.Hosts(s.cfg.BootstrapListen, bootLis.Addr().String()))
		if err != nil {
			return err
		}
		boot = s.grpcServer(btc, false)
	}

	var metricsLis net.Listener
	var metricsSrv *http.Server
	if s.cfg.MetricsListen != "" {
		if metricsLis, err = listener.ListenAs(s.cfg.MetricsListen, "metrics", nil, listener.NewCap(listener.MetricsMaxConns), s.connRefusals); err != nil {
			return fmt.Errorf("authority: cannot listen on %s (metrics): %w", s.cfg.MetricsListen, err)
		}
		defer metricsLis.Close()
		metricsSrv = httpserve.NewServer(s.metricsHandler(), httpserve.Default)
	}

	var crlLis net.Listener
	var crlSrv *http.Server
	if s.cfg.CRLListen != "" {
		if crlLis, err = listener.ListenAs(s.cfg.CRLListen, "crl", nil, listener.NewCap(listener.MetricsMaxConns), s.connRefusals); err != nil {
			return fmt.Errorf("authority: cannot listen on %s (crl): %w", s.cfg.CRLListen, err)
		}
		defer crlLis.Close()
		crlSrv = httpserve.NewServer(s.relyingPartyHandler(), httpserve.Default)
	}

	if err := s.cfg.Dir.WriteAddress(datadir.Address{Address: advertise, AuthorityID: s.info.AuthorityID, PID: os.Getpid()}); err != nil {
		return fmt.Errorf("authority: recording the address in %s: %w", s.cfg.Dir, err)
	}
	if err := s.ensureSigner(ctx); err != nil {
		return err
	}
	if _, err := s.audit.Record(ctx, audit.Event{Actor: "authority", Action: "authority.start", Target: s.info.AuthorityID,
		Result: audit.ResultOK, Reason: "listening on " + lis.Addr().String() + ", advertising " + advertise}); err != nil {
		return fmt.Errorf("authority: the audit log is not writable: %w", err)
	}
	s.log.Info("authority started", "authority_id", s.info.AuthorityID, "listen", lis.Addr().String(), "advertise", advertise,
		"bootstrap_listen", listener.Addr(bootLis), "metrics_listen", listener.Addr(metricsLis), "crl_listen", listener.Addr(crlLis), "trusted_proxies", fmt.Sprint(s.cfg.TrustedProxies),
		"max_connections", s.conns.Max(), "open_file_limit", openFileLimit(),
		"max_calls_per_source", s.calls.Max(), "call_timeout", s.callTimeout.String(),
		"renewals_per_lifetime", cmp.Or(s.cfg.RenewalsPerLifetime, DefaultRenewalsPerLifetime))
	if s.cfg.Ready != nil {
		s.cfg.Ready(advertise, listener.Addr(metricsLis))
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return api.Serve(lis) })
	if boot != nil {
		g.Go(func() error { return boot.Serve(bootLis) })
	}
	if metricsSrv != nil {
		g.Go(func() error {
			if err := metricsSrv.Serve(metricsLis); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	if crlSrv != nil {
		g.Go(func() error {
			if err := crlSrv.Serve(crlLis); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	if s.crl != nil {
		g.Go(func() error { return s.crl.Run(gctx) })
	}
	g.Go(func() error { s.watchChanges(gctx); return nil })
	g.Go(func() error { s.settingsClock(gctx); return nil })
	g.Go(func() error { s.agentCerts.run(gctx); return nil })
	g.Go(func() error { s.inter.run(gctx); return nil })
	g.Go(func() error { s.jwtKeyClock(gctx); return nil })
	g.Go(func() error { s.outage.run(gctx); return nil })
	g.Go(func() error { s.streamEnds.run(gctx); return nil })
	g.Go(func() error { return s.refusals.Run(gctx) })
	g.Go(func() error { return s.limiter.Run(gctx) })
	g.Go(func() error { return s.renewals.Run(gctx) })
	g.Go(func() error { return s.lead(gctx, "background", s.backgroundJobs) })
	if s.discovery != nil {
		g.Go(func() error { return s.discovery.run(gctx) })
	}
	// stopBy is when the whole stop must be over: set as it starts,
	// read by recordStop after every goroutine of g returned.
	var stopBy time.Time
	g.Go(func() error {
		<-gctx.Done()
		stopBy = time.Now().Add(stopBudget)
		s.log.Info("authority stopping", "budget", stopBudget.String())
		// Agent streams end only with their certificates: the graceful
		// stop would wait its whole grace for them, its listener closed,
		// while agents could not renew (one whose certificate ran out
		// then stopped for good). Ended first, they reconnect at once,
		// to another replica or to this one restarted.
		s.endStreams()
		var ls []stoppable
		for _, l := range []struct {
			name string
			gs   *grpc.Server
		}{{"api", api}, {"bootstrap", boot}} {
			if l.gs != nil {
				ls = append(ls, grpcStoppable(l.name, l.gs))
			}
		}
		for _, l := range []struct {
			name string
			hs   *http.Server
		}{{"metrics", metricsSrv}, {"crl", crlSrv}} {
			if l.hs != nil {
				ls = append(ls, httpStoppable(l.name, l.hs))
			}
		}
		if cut := stopAll(time.Now().Add(stopGrace), ls); len(cut) > 0 {
			s.log.Warn(fmt.Sprintf("calls still in flight after %s were cut short: their listeners were stopped hard", stopGrace),
				"listeners", strings.Join(cut, ","))
		}
		return nil
	})
	err = g.Wait()
	s.recordStop(stopBy)
	if errors.Is(err, grpc.ErrServerStopped) {
		err = nil
	}
	return err
}

// stopBudget is the longest the authority takes to stop, from SIGTERM to
// its stop recorded: the service manager kills it after its own stop
// timeout (TimeoutStopSec=30s in the systemd unit), and must not, or the
// stop goes unrecorded and agent streams end unannounced. stopGrace of it
// is what calls in flight get before every listener is stopped hard; the
// rest, at least 10 s, records the stop: a store request's whole deadline
// with the default limits.store_timeout (10 s), not with a longer one (up
// to 20 s), where a request that hangs is cut at the budget's end and
// the stop is logged as not recorded.
const (
	stopBudget = 20 * time.Second
	stopGrace  = 10 * time.Second
)

// replicaLabel is how the rows of this replica's streams name it: the
// advertised address, and when the listener is bound elsewhere (behind a
// load balancer, shared by the replicas) the host and the bound address
// too; without a host name (os.Hostname failed), the bound address alone.
func replicaLabel(advertise, bound string, hostname func() (string, error)) string {
	if bound == advertise {
		return advertise
	}
	if host, err := hostname(); err == nil && host != "" {
		return fmt.Sprintf("%s (replica %s at %s)", advertise, host, bound)
	}
	return fmt.Sprintf("%s (replica at %s)", advertise, bound)
}

// stoppable is a listener's server as the stop sees it: graceful waits
// for its calls in flight until ctx ends, then hard ends the rest.
type stoppable struct {
	name     string
	graceful func(ctx context.Context) error
	hard     func()
}

func grpcStoppable(name string, gs *grpc.Server) stoppable {
	return stoppable{name: name, hard: gs.Stop, graceful: func(ctx context.Context) error {
		done := make(chan struct{})
		go func() { gs.GracefulStop(); close(done) }()
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
}

func httpStoppable(name string, hs *http.Server) stoppable {
	return stoppable{name: name, graceful: hs.Shutdown, hard: func() { hs.Close() }}
}

// stopAll stops the listeners at once, each given until grace ends for
// its calls in flight and then stopped hard, and returns the names of
// those stopped hard. One after the other, each waited its own grace: the
// two gRPC listeners and the two HTTP ones took 30 s together, the systemd
// unit's whole stop timeout, before the stop was recorded.
func stopAll(grace time.Time, ls []stoppable) []string {
	ctx, cancel := context.WithDeadline(context.Background(), grace)
	defer cancel()
	cut := make([]bool, len(ls))
	var wg sync.WaitGroup
	for i, l := range ls {
		wg.Go(func() {
			if l.graceful(ctx) != nil {
				l.hard()
				cut[i] = true
			}
		})
	}
	wg.Wait()
	var names []string
	for i, l := range ls {
		if cut[i] {
			names = append(names, l.name)
		}
	}
	return names
}

// recordStop records, as the replica stops, the stream ends the store
// could not take before, the authority.stop audit record and a checkpoint
// of the audit chain, by stopBy (the end of stopBudget): the service
// manager's stop timeout covers the listeners' stop and this together. The
// first failure ends it: with the store unavailable each write would wait
// the store's deadline in turn; during an outage already under way
// nothing is tried, so a hung database does not hold the stop. What was
// left unrecorded is logged with the failure, which names the store's
// unavailability and the setting that bounds its requests, or the stop's
// budget when that ran out first.
func (s *Server) recordStop(stopBy time.Time) {
	left := "the ends of agent streams that ended unrecorded, the authority.stop audit record and a checkpoint of the audit chain"
	if s.outage.isDown() {
		s.log.Error("the store is unavailable as the authority stops (an outage under way): not recorded: "+left,
			"unrecorded_stream_ends", s.streamEnds.len())
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), stopBy)
	defer cancel()
	ctx, cancel2 := context.WithTimeout(ctx, storeJobTimeout)
	defer cancel2()
	err := ctx.Err()
	if err == nil {
		err = s.streamEnds.flush(ctx)
	}
	if err == nil {
		left = "the authority.stop audit record and a checkpoint of the audit chain"
		err = s.recordAudit(ctx, audit.Event{Actor: "authority", Action: "authority.stop", Target: s.info.AuthorityID, Result: audit.ResultOK})
		if err != nil && !errors.Is(err, store.ErrUnavailable) && ctx.Err() == nil {
			return // logged by recordAudit
		}
	}
	if err == nil {
		left = "a checkpoint of the audit chain"
		_, err = s.audit.Checkpoint(ctx)
	}
	switch {
	case err == nil:
	case !time.Now().Before(stopBy):
		s.log.Error(fmt.Sprintf("the authority's stop took its whole %s (calls in flight get %s of it, the store the rest): not recorded: %s", stopBudget, stopGrace, left),
			"unrecorded_stream_ends", s.streamEnds.len(), "err", err)
	case errors.Is(err, store.ErrUnavailable):
		s.log.Error("the store is unavailable as the authority stops: not recorded: "+left,
			"unrecorded_stream_ends", s.streamEnds.len(), "err", err)
	default:
		s.log.Error("recording the authority's stop failed: not recorded: "+left, "unrecorded_stream_ends", s.streamEnds.len(), "err", err)
	}
}

func (s *Server) metricsHandler() http.Handler {
	return metricsmux.New(s.metrics.reg, func(ctx context.Context) error {
		if _, err := s.store.Now(ctx); err != nil {
			return err
		}
		if err := s.inter.readyErr(); err != nil {
			return metricsmux.NotReady{Reason: err.Error()}
		}
		if s.token != nil {
			if err := s.token.Ready(); err != nil {
				return metricsmux.NotReady{Reason: "key custody: PKCS#11 token unavailable, re-opening"}
			}
		}
		return nil
	})
}

// CACustody is the custody of the CA intermediates' keys: new ones in the
// token when there is one, sealed otherwise; each existing key where its
// reference says.
func CACustody(sk seal.StorageKey, token *custody.Token) (custody.Custody, error) {
	sealed, err := custody.NewSealedCA(sk)
	if err != nil {
		return nil, err
	}
	return byRef(sealed, token, "muster-ca/"), nil
}

// SignerCustody is the custody of the task signers' keys, chosen as
// CACustody's.
func SignerCustody(sk seal.StorageKey, token *custody.Token) (*signer.InCustody, error) {
	sealed, err := custody.NewSealed(sk, seal.InfoSigner, "muster-signer/")
	if err != nil {
		return nil, err
	}
	return signer.NewInCustody(byRef(sealed, token, "muster-signer/")), nil
}

// JoinStateCustody is the custody of the join-state keys, chosen as
// CACustody's: sealed under the join-state purpose with the key ID as
// additional data (as those keys have always been sealed), or objects
// muster-join-state/ID in the token.
func JoinStateCustody(joinStates *seal.Sealer, token *custody.Token) custody.ByRef {
	sealed := custody.NewSealedWith(joinStates, "")
	b := custody.ByRef{New: sealed, Sealed: sealed}
	if token != nil {
		t := token.For("muster-join-state/")
		b.New, b.Token = t, t
	}
	return b
}

func byRef(sealed *custody.Sealed, token *custody.Token, prefix string) custody.ByRef {
	b := custody.ByRef{New: sealed, Sealed: sealed}
	if token != nil {
		t := token.For(prefix)
		b.New, b.Token = t, t
	}
	return b
}

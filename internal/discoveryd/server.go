// Package discoveryd is the service layer of muster discovery (DESIGN.md,
// join method 2): the optional directory where authorities register their
// endpoints, CA bundle and signed policy, and where agents look an
// authority up and get 60-second referral tickets within that policy.
//
// One TLS listener serves the gRPC DiscoveryService and, over HTTPS on the
// same port, the ticket keys at /.well-known/jwks.json. Discovery has its
// own data directory, storage key and self-signed CA, which authorities and
// agents pin by fingerprint; its server certificate never carries an
// authority's SPIFFE ID, so a compromised discovery cannot pose as an
// authority and collect secrets. The rules themselves (policies, signed
// documents, tickets) are in packages discovery and referral; this package
// translates requests, keeps the ticket keys, and maps errors to status
// codes in one place (status.go).
package discoveryd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/callcap"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/discovery"
	"github.com/muster-dev/muster/internal/discoveryclient"
	"github.com/muster-dev/muster/internal/httpserve"
	"github.com/muster-dev/muster/internal/listener"
	"github.com/muster-dev/muster/internal/metricsmux"
	"github.com/muster-dev/muster/internal/ratelimit"
	"github.com/muster-dev/muster/internal/requestcodec"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// DefaultListen is discovery's address unless told otherwise.
const DefaultListen = "127.0.0.1:7450"

// Limits of the listener.
const (
	// MaxRequestSize bounds a request: a registration with its CA bundle
	// and policy is a few KiB.
	MaxRequestSize = 64 << 10
	// Each source may send a burst of SourceBurst requests to each RPC
	// and SourceRate per second after it, as on the authority's
	// unauthenticated RPCs.
	SourceRate  = 5
	SourceBurst = 20
	// Join reports are signed and come from authorities, one per join:
	// a fleet joining at once must not be throttled by discovery.
	ReportRate  = 200
	ReportBurst = 1000
	// maintainEvery is the period of key rotation and cleanup.
	maintainEvery = time.Minute
	// reportRetention is how long join reports are kept: the quota
	// counts 24 hours.
	reportRetention = 48 * time.Hour
	stopTimeout     = 10 * time.Second
)

// Config is everything discovery needs; the CLI builds it from flags.
type Config struct {
	// Dir is the data directory; it is initialised if needed (Init).
	Dir string
	// Store keeps registrations, join reports, ticket keys and the audit
	// chain. StoreURL names it, without a password, for discovery.addr
	// (Address.Store), where it is not DIR/discovery.db ("": it is).
	Store    store.Store
	StoreURL string
	// Listen serves gRPC and HTTPS (default DefaultListen). Advertise is
	// the address authorities and agents reach it at, and names the
	// ticket issuer "https://ADVERTISE" (default: the bound listen
	// address).
	Listen    string
	Advertise string
	// MetricsListen, if set, serves /metrics and /healthz over plain HTTP.
	MetricsListen string
	// TrustedProxies are the TCP load balancers whose PROXY protocol
	// header names a connection's source on Listen, for allowed CIDRs,
	// rate limits, tickets and the audit log; empty: none.
	TrustedProxies []netip.Prefix
	// KeyRotation is how long a ticket key signs (default
	// DefaultKeyRotation).
	KeyRotation time.Duration
	Log         *slog.Logger
	// Ready, if set, is called once the listeners are bound, with the
	// address the listener is bound to (HOST:PORT, the port chosen when
	// Listen asked for port 0).
	Ready func(addr string)
	// AllowedAuthorities may register, each under the root fingerprint
	// listed for it only. OpenRegistration accepts any other authority ID
	// as well, locked to the first root that registers it: anyone who
	// grinds a key matching an ID's 6 hex digits can take it first. With
	// neither, every registration is refused (discovery.Allowlist).
	AllowedAuthorities []discovery.AllowEntry
	OpenRegistration   bool
	// CallTimeout is the longest a gRPC call may last, its request and
	// reply included, unless its caller asks for less (zero:
	// DefaultCallTimeout).
	CallTimeout time.Duration
	// MaxCallsPerSource is how many calls (gRPC calls and HTTPS requests)
	// one source address may have in flight at once; the next is refused
	// RESOURCE_EXHAUSTED (HTTP 429) and audited (zero:
	// callcap.DefaultPerSource).
	MaxCallsPerSource int
}

// MaxStreamsPerConn bounds the calls one connection carries at once.
const MaxStreamsPerConn = 100

// DefaultCallTimeout is Config.CallTimeout's default. Every call
// discovery serves answers at once; a health watch or a reflection
// stream, which would answer for as long as asked, watches again.
const DefaultCallTimeout = time.Minute

// errCallTimeout is the reason a call ended at CallTimeout is audited with.
var errCallTimeout = errors.New("the call lasted longer than discovery's call timeout")

// grpcTimeout reads a grpc-timeout header: up to 8 digits and a unit
// (gRPC over HTTP/2, "Timeout").
func grpcTimeout(v string) (time.Duration, bool) {
	if len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	n, err := strconv.ParseInt(v[:len(v)-1], 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	// A switch, not a map literal: this runs for every gRPC call, and a
	// map literal is built again at each.
	var unit time.Duration
	switch v[len(v)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, false
	}
	// 99999999H does not fit a Duration: it is read as the longest one
	// (as gRPC reads it), not as the negative number the product wraps to,
	// which would pass for shorter than the call timeout.
	if n > math.MaxInt64/int64(unit) {
		return math.MaxInt64, true
	}
	return time.Duration(n) * unit, true
}

// Server is a discovery service.
type Server struct {
	cfg      Config
	id       *Identity
	store    store.Store
	log      *slog.Logger
	audit    *audit.Logger
	refusals *audit.Refusals
	// connRefusals counts and logs connections the listeners close at once.
	connRefusals *listener.Refusals
	metrics      *metrics
	keys         *keyring
	sealer       *seal.Sealer
	// limiter holds the discovery's own per-source buckets; policy the
	// buckets of the authorities' policies.
	limiter *ratelimit.Keyed
	policy  *ratelimit.Keyed
	// sourceLimit and reportLimit are the per-source rates of the public
	// RPCs and of ReportJoin.
	sourceLimit, reportLimit bucket
	policies                 *policyCache
	// allow decides which authorities may register, and which stored
	// registrations are served.
	allow *discovery.Allowlist
	grpc  *grpc.Server
	now   func() time.Time
	// callTimeout is Config.CallTimeout (handler).
	callTimeout time.Duration
	// calls is Config.MaxCallsPerSource, and callcap.HealthWatches
	// within it (handler).
	calls *callcap.Cap

	addr        atomic.Pointer[string]
	issuer      atomic.Pointer[string]
	metricsAddr atomic.Pointer[string]
}

// New initialises the data directory if needed and builds the server; Run
// starts it.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("discoveryd: no store")
	}
	if cfg.Dir == "" {
		return nil, errors.New("discoveryd: no data directory")
	}
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if cfg.KeyRotation == 0 {
		cfg.KeyRotation = DefaultKeyRotation
	}
	if cfg.KeyRotation < 0 {
		return nil, fmt.Errorf("discoveryd: negative key rotation period %s", cfg.KeyRotation)
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if err := CheckAddresses(cfg.Listen, cfg.Advertise); err != nil {
		return nil, err
	}
	allow, err := discovery.NewAllowlist(cfg.AllowedAuthorities, cfg.OpenRegistration)
	if err != nil {
		return nil, err
	}
	id, err := Init(cfg.Dir)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:         cfg,
		id:          id,
		store:       cfg.Store,
		log:         cfg.Log,
		metrics:     newMetrics(),
		limiter:     ratelimit.New(SourceRate, SourceBurst),
		sourceLimit: bucket{SourceRate, SourceBurst},
		reportLimit: bucket{ReportRate, ReportBurst},
		policy:      ratelimit.New(1, 1), // every use names its own rate
		policies:    newPolicyCache(),
		allow:       allow,
		now:         time.Now,
		callTimeout: cmp.Or(cfg.CallTimeout, DefaultCallTimeout),
		calls:       callcap.New(cfg.MaxCallsPerSource, callcap.HealthWatches),
	}
	if s.audit, err = datadir.NewAuditLogger(cfg.Store, id.StorageKey, id.Dir.CheckpointFile(), s.metrics.onAudit); err != nil {
		return nil, err
	}
	s.audit.SetVerifyCommand("muster discovery audit verify --data " + shellword.Quote(string(id.Dir)))
	s.refusals = audit.NewRefusals(s.audit, "discovery", cfg.Log)
	if s.connRefusals, err = listener.NewRefusalsMetric(s.metrics.reg, cfg.Log); err != nil {
		return nil, err
	}
	if s.sealer, err = id.StorageKey.Sealer(seal.InfoDiscoveryKey); err != nil {
		return nil, err
	}
	s.keys = newKeyring(cfg.Store, s.sealer, cfg.Log)
	s.grpc = grpc.NewServer(
		grpc.ChainUnaryInterceptor(s.metrics.unary),
		// A larger message is refused with RESOURCE_EXHAUSTED before it
		// is parsed.
		grpc.MaxRecvMsgSize(MaxRequestSize),
		grpc.UnknownServiceHandler(s.unknownMethod),
		grpc.ForceServerCodecV2(requestcodec.New()),
	)
	s.grpc.RegisterService(s.guarded(&musterv1.DiscoveryService_ServiceDesc), &service{s: s})
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(musterv1.DiscoveryService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s.grpc, hs)
	reflection.Register(s.grpc)
	return s, nil
}

// Fingerprint is the pin of the server's TLS identity.
func (s *Server) Fingerprint() string { return s.id.Fingerprint() }

// Addr is the bound listen address, once Run has bound it.
func (s *Server) Addr() string {
	if a := s.addr.Load(); a != nil {
		return *a
	}
	return ""
}

// MetricsAddr is the bound metrics address, once Run has bound it; "" if
// there is none.
func (s *Server) MetricsAddr() string {
	if a := s.metricsAddr.Load(); a != nil {
		return *a
	}
	return ""
}

// Issuer is the issuer of the tickets, "https://ADVERTISE", once Run has
// bound the listener.
func (s *Server) Issuer() string {
	if a := s.issuer.Load(); a != nil {
		return *a
	}
	return ""
}

// Run installs a first ticket key if the store has none, binds the
// listeners, serves until ctx is done and then stops gracefully.
func (s *Server) Run(ctx context.Context) error {
	if err := checkOwnStore(ctx, s.store); err != nil {
		return err
	}
	// Records removed from the chain's tail (after a kill -9, or by
	// whoever can write the store) would otherwise be silently reused.
	if err := s.audit.CheckHead(ctx); err != nil {
		return fmt.Errorf("discoveryd: %w", err)
	}
	installed, err := s.keys.ensure(ctx)
	if err != nil {
		return err
	}
	if installed != "" {
		s.recordOK(ctx, "ticket_key.create", installed, "first ticket key")
	}
	// The PROXY header comes before TLS: ServeTLS wraps this listener.
	lis, err := listener.ListenAs(s.cfg.Listen, "api", s.cfg.TrustedProxies, listener.NewCap(0), s.connRefusals)
	if err != nil {
		return fmt.Errorf("discoveryd: cannot listen on %s: %w", s.cfg.Listen, err)
	}
	defer lis.Close()
	bound := lis.Addr().String()
	advertise := s.cfg.Advertise
	if advertise == "" {
		advertise = bound
	}
	issuer := discoveryclient.Issuer(advertise)
	s.addr.Store(&bound)
	s.issuer.Store(&issuer)
	certs := &serverCerts{issuer: &ca.Issuer{Cert: s.id.CA, Key: s.id.CAKey}, hosts: listener.Hosts(s.cfg.Listen, bound, advertise)}
	if _, err := certs.get(nil); err != nil {
		return err
	}
	// listener.ServerTLS: no session tickets (TestNoSessionTickets).
	tlsConfig := listener.ServerTLS("h2", "http/1.1")
	tlsConfig.GetCertificate = certs.get
	srv := &http.Server{
		Handler:           s.handler(),
		TLSConfig:         tlsConfig,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
		MaxHeaderBytes:    MaxRequestSize,
		// An answer (over HTTP/2, each call's) must be taken within the
		// call timeout: a gRPC call whose caller stops reading is blocked
		// in a write the call's context cannot end, and is reset a little
		// after the handler's deadline. (Not ReadTimeout: over HTTP/2 it
		// resets a stream whose caller has not closed its side, a watch's
		// or a reflection stream's, without a status; the handler bounds
		// reads itself.)
		WriteTimeout: s.callTimeout + 5*time.Second,
		// As the authority's listeners: at most 100 calls at once on a
		// connection (net/http's default is 250), each held at most the
		// call timeout; the connections are capped per source.
		HTTP2:    &http.HTTP2Config{MaxConcurrentStreams: MaxStreamsPerConn},
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}

	var metricsLis net.Listener
	var metricsSrv *http.Server
	if s.cfg.MetricsListen != "" {
		if metricsLis, err = listener.ListenAs(s.cfg.MetricsListen, "metrics", nil, listener.NewCap(listener.MetricsMaxConns), s.connRefusals); err != nil {
			return fmt.Errorf("discoveryd: cannot listen on %s (metrics): %w", s.cfg.MetricsListen, err)
		}
		defer metricsLis.Close()
		metricsSrv = httpserve.NewServer(s.metricsHandler(), httpserve.Default)
		ma := metricsLis.Addr().String()
		s.metricsAddr.Store(&ma)
	}

	if err := s.id.Dir.WriteAddress(Address{Listen: bound, Advertise: advertise, Issuer: issuer, PID: os.Getpid(), Store: s.cfg.StoreURL}); err != nil {
		return fmt.Errorf("discoveryd: recording the address in %s: %w", s.id.Dir, err)
	}
	// Read before this start is recorded: the others' issuers.
	if others, err := runningIssuers(ctx, s.cfg.Store, issuer); err != nil {
		s.log.Warn("cannot read the issuers other replicas started under", "err", err)
	} else if len(others) > 0 {
		s.log.Warn(otherIssuersWarning(issuer, others, s.id.Dir), "issuer", issuer, "other_issuers", strings.Join(others, ","))
	}
	if _, err := s.audit.Record(ctx, audit.Event{Actor: "discovery", Action: "discovery.start", Target: issuer,
		Result: audit.ResultOK, Reason: "listening on " + bound + ", fingerprint " + s.Fingerprint()}); err != nil {
		return fmt.Errorf("discoveryd: the audit log is not writable: %w", err)
	}
	keyID, _ := s.keys.activeSince()
	s.log.Info("discovery started", "listen", bound, "advertise", advertise, "issuer", issuer,
		"fingerprint", s.Fingerprint(), "metrics_listen", listener.Addr(metricsLis), "ticket_key", keyID, "dir", string(s.id.Dir),
		"trusted_proxies", fmt.Sprint(s.cfg.TrustedProxies), "max_calls_per_source", s.calls.Max(), "call_timeout", s.callTimeout.String())
	if s.cfg.Ready != nil {
		s.cfg.Ready(bound)
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := srv.ServeTLS(lis, "", ""); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	if metricsSrv != nil {
		g.Go(func() error {
			if err := metricsSrv.Serve(metricsLis); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	g.Go(func() error { return s.refusals.Run(gctx) })
	g.Go(func() error { return s.limiter.Run(gctx) })
	g.Go(func() error { return s.policy.Run(gctx) })
	g.Go(func() error { return s.audit.Run(gctx) })
	g.Go(func() error { return s.maintainLoop(gctx) })
	g.Go(func() error {
		<-gctx.Done()
		s.log.Info("discovery stopping")
		sctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			srv.Close()
		}
		s.grpc.Stop()
		if metricsSrv != nil {
			metricsSrv.Shutdown(sctx)
		}
		return nil
	})
	err = g.Wait()
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.audit.Record(rctx, audit.Event{Actor: "discovery", Action: "discovery.stop", Target: issuer, Result: audit.ResultOK})
	s.audit.Checkpoint(rctx)
	return err
}

// handler serves gRPC (HTTP/2 with a gRPC content type) and the HTTPS
// endpoints on one listener.
func (s *Server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+discoveryclient.JWKSPath, func(w http.ResponseWriter, r *http.Request) {
		jwks, err := s.keys.JWKS(r.Context())
		if err != nil {
			s.log.Error("cannot serve the JWKS", "err", err)
			http.Error(w, "ticket keys unavailable", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "max-age=60")
		w.Write(jwks)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		isGRPC := r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc")
		// Counted from here, before a request body is read, to the
		// handler's return: every call (and HTTPS request) discovery
		// serves answers at once, so only calls held open, a flood's,
		// reach the cap.
		src := sourceOf(r)
		method := ""
		if isGRPC {
			method = r.URL.Path
		}
		release, err := s.calls.Take(src, method)
		if err != nil {
			s.refuseHeld(w, r, src, isGRPC, err)
			return
		}
		defer release()
		if isGRPC {
			// A connection carrying a call is never idle: a call whose
			// request never comes, or a stream that answers for as long
			// as it is asked, ends at the call timeout, set as the call's
			// own (grpc-timeout) where the caller gave none or a later
			// one, so gRPC ends it with its status.
			ours := false
			if d, ok := grpcTimeout(r.Header.Get("grpc-timeout")); !ok || d > s.callTimeout {
				r.Header.Set("grpc-timeout", strconv.FormatInt(s.callTimeout.Milliseconds(), 10)+"m")
				ours = true
			}
			start := time.Now()
			s.grpc.ServeHTTP(w, r)
			if ours && time.Since(start) >= s.callTimeout {
				c := call{method: r.URL.Path, source: src}
				s.refusals.Record(r.Context(), audit.Event{Actor: "anonymous", Action: "api.access", Target: c.method, Result: audit.ResultDenied,
					Reason: fmt.Sprintf("%v (%s): send the request whole and read the reply within it", errCallTimeout, s.callTimeout), Source: c.src()})
			}
			return
		}
		// The body, which no handler here reads, too: the server reads
		// what is left of it after the handler, up to 256 KiB.
		http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.callTimeout))
		r.Body = http.MaxBytesReader(w, r.Body, MaxRequestSize)
		mux.ServeHTTP(w, r)
	})
}

func (s *Server) metricsHandler() http.Handler {
	return metricsmux.New(s.metrics.reg, func(ctx context.Context) error {
		_, err := s.store.Now(ctx)
		return err
	})
}

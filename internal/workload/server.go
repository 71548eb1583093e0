package workload

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/muster-dev/muster/internal/calldeadline"
	"github.com/prometheus/client_golang/prometheus"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// Limits of one server, defaults where zero.
const (
	DefaultMaxStreamsPerUID = 32
	DefaultSendTimeout      = 10 * time.Second
	DefaultMaxConnsPerUID   = 16
	// DefaultCallTimeout bounds a unary call (FetchJWTSVID,
	// ValidateJWTSVID), its request and reply included: longer than the
	// agent's own call to the authority a JWT-SVID waits for (30 s).
	DefaultCallTimeout = time.Minute
	// maxRecvMsg bounds a request: the largest is a JWT to validate.
	maxRecvMsg = 64 << 10
	// maxStreamsPerConn bounds the streams one connection multiplexes.
	maxStreamsPerConn = 16
)

// headerKey and headerValue are the metadata every call must carry (the
// Workload API specification, "Transport"): a browser or a proxy that
// forwards arbitrary requests cannot add it, so it cannot reach the API
// by accident.
const (
	headerKey   = "workload.spiffe.io"
	headerValue = "true"
)

// Config configures a Server.
type Config struct {
	// AllowUIDs and AllowGIDs admit a caller whose UID, or whose primary
	// GID, is listed. Both empty admits no one.
	AllowUIDs, AllowGIDs []uint32
	// MaxStreamsPerUID caps the open streams of one UID; MaxConnsPerUID
	// its open connections.
	MaxStreamsPerUID, MaxConnsPerUID int
	// SendTimeout bounds one message sent on a stream: a caller that
	// stops reading is ended (DEADLINE_EXCEEDED) rather than holding its
	// place among its UID's streams for as long as it stays connected.
	// Zero is DefaultSendTimeout.
	SendTimeout time.Duration
	// CallTimeout bounds a unary call, its request and reply included
	// (zero: DefaultCallTimeout); the streams are bounded by
	// MaxStreamsPerUID and SendTimeout instead.
	CallTimeout time.Duration
	Log         *slog.Logger
	// Registerer, if set, receives the server's metrics.
	Registerer prometheus.Registerer
	// JWT, if set, mints JWT-SVIDs and fetches their keys (the agent,
	// asking the authority); without it the JWT RPCs are UNIMPLEMENTED.
	JWT JWTSource
	// Socket, if set, is the socket Serve's listener was made with
	// (Listen): Serve makes it again whenever its path is found missing.
	Socket *Socket
}

// JWTSource is the agent's side of JWT-SVIDs.
type JWTSource interface {
	JWTSVID(ctx context.Context, audience []string) (string, time.Time, error)
	// JWTBundle returns the JWKS and, by key ID, how long from now the
	// authority keeps publishing each key (a key missing: at most
	// minKeyPublished).
	JWTBundle(ctx context.Context) (jwks []byte, publishedFor map[string]time.Duration, err error)
}

// Server is the SpiffeWorkloadAPI service over a Source.
type Server struct {
	workloadpb.UnimplementedSpiffeWorkloadAPIServer

	src       *Source
	cfg       Config
	log       *slog.Logger
	transport *peerTransport
	refusals  *prometheus.CounterVec
	open      prometheus.Gauge
	logLimit  *rate.Limiter

	mu      sync.Mutex
	streams map[uint32]int

	jwksMu sync.Mutex
	jwks   []byte
	// jwksAsked and jwksErr are the last fetch's time and failure (nil:
	// it fetched jwks): when the next one is due (jwksNow, jwksAgain).
	jwksAsked time.Time
	jwksErr   error
	// jwksGot is when jwks was asked for (the fetch that answered);
	// jwksUntil, by key ID, until when the authority may still publish
	// each of its keys (keyUsable).
	jwksGot   time.Time
	jwksUntil map[string]time.Time
	// jwksFresh is closed at the next fetch that answers (FetchJWTBundles
	// streams send the keys it brings back).
	jwksFresh chan struct{}
	// now is the clock (time.Now; tests set it), after its timers
	// (time.After; tests set it with now).
	now   func() time.Time
	after func(time.Duration) <-chan time.Time
}

// NewServer returns a server for src.
func NewServer(src *Source, cfg Config) *Server {
	if cfg.SendTimeout <= 0 {
		cfg.SendTimeout = DefaultSendTimeout
	}
	if cfg.MaxStreamsPerUID <= 0 {
		cfg.MaxStreamsPerUID = DefaultMaxStreamsPerUID
	}
	if cfg.MaxConnsPerUID <= 0 {
		cfg.MaxConnsPerUID = DefaultMaxConnsPerUID
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	s := &Server{src: src, cfg: cfg, log: cfg.Log, streams: map[uint32]int{}, now: time.Now, after: time.After,
		jwksFresh: make(chan struct{}),
		// A refused local user must not flood the log: the counter
		// counts every refusal, the log shows a few a second.
		logLimit: rate.NewLimiter(rate.Every(time.Second), 10),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "muster_agent_workload_api_refusals_total",
			Help: "Workload API calls and connections refused, by reason (uid_not_allowed, no_peer_credentials, missing_header, too_many_streams, too_many_connections, call_timeout, other_spiffe_id).",
		}, []string{"reason"}),
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "muster_agent_workload_api_streams",
			Help: "Workload API streams open (FetchX509SVID, FetchX509Bundles, FetchJWTBundles).",
		}),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	for _, r := range []string{"uid_not_allowed", "no_peer_credentials", "missing_header", "too_many_streams", "too_many_connections", "call_timeout"} {
		s.refusals.WithLabelValues(r)
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(s.refusals, s.open)
	}
	s.transport = newPeerTransport(cfg.MaxConnsPerUID, s.refused)
	return s
}

// refused counts and (within the log's rate) logs a refusal.
func (s *Server) refused(reason string, c *Creds, err error) {
	s.refusals.WithLabelValues(reason).Inc()
	if !s.logLimit.Allow() {
		return
	}
	args := []any{"reason", reason, "err", err}
	if c != nil {
		args = append(args, "uid", c.UID, "gid", c.GID, "pid", c.PID)
	}
	s.log.Warn("workload api: caller refused", args...)
}

// Serve serves the API on lis until ctx ends, then closes every stream.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	g := grpc.NewServer(
		grpc.Creds(s.transport),
		grpc.ChainUnaryInterceptor(s.unary),
		grpc.ChainStreamInterceptor(s.stream),
		grpc.MaxRecvMsgSize(maxRecvMsg),
		grpc.MaxConcurrentStreams(maxStreamsPerConn),
		grpc.ConnectionTimeout(10*time.Second),
		grpc.InTapHandle(s.callDeadline()),
	)
	workloadpb.RegisterSpiffeWorkloadAPIServer(g, s)
	done := make(chan error, 1)
	go func() { done <- g.Serve(lis) }()
	kctx, stopKeep := context.WithCancel(ctx)
	defer stopKeep()
	kept := make(chan struct{})
	go func() {
		defer close(kept)
		if s.cfg.Socket != nil {
			s.keep(kctx, *s.cfg.Socket, lis, func(l net.Listener) { go g.Serve(l) })
		}
	}()
	select {
	case <-ctx.Done():
		<-kept
		// Streams never end by themselves: Stop, not GracefulStop.
		g.Stop()
		<-done
		return nil
	case err := <-done:
		stopKeep()
		<-kept
		g.Stop()
		return err
	}
}

// unaryMethods are the API's unary calls, which callDeadline bounds.
var unaryMethods = func() map[string]bool {
	m := map[string]bool{}
	for _, d := range workloadpb.SpiffeWorkloadAPI_ServiceDesc.Methods {
		m["/"+workloadpb.SpiffeWorkloadAPI_ServiceDesc.ServiceName+"/"+d.MethodName] = true
	}
	return m
}()

// callDeadline (gRPC's InTapHandle) gives a unary call Config.CallTimeout
// where its caller gave none or a later one: a unary call whose request
// never came was held, uncounted among its UID's streams, for as long as
// its connection lasted.
func (s *Server) callDeadline() tap.ServerInHandle {
	return calldeadline.Tap(s.cfg.CallTimeout, func(method string) bool { return unaryMethods[method] },
		func(_ context.Context, method string) {
			s.refused("call_timeout", nil, fmt.Errorf("%s: the call lasted longer than the call timeout (%s): send the request whole and read the reply within it, or raise workload_api.call_timeout", method, s.cfg.CallTimeout))
		})
}

// callerCreds are the Unix credentials of ctx's caller, nil if unknown.
func callerCreds(ctx context.Context) *Creds {
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(authInfo); ok && info.err == nil {
			return &info.creds
		}
	}
	return nil
}

// admit checks the caller's credentials and the required metadata.
func (s *Server) admit(ctx context.Context) (Creds, error) {
	p, ok := peer.FromContext(ctx)
	var info authInfo
	if ok {
		info, ok = p.AuthInfo.(authInfo)
	}
	if !ok || info.err != nil {
		err := errors.New("no peer credentials")
		if ok {
			err = info.err
		}
		s.refused("no_peer_credentials", nil, err)
		return Creds{}, status.Error(codes.PermissionDenied, "workload api: the caller's Unix credentials cannot be read, so it is not admitted")
	}
	c := info.creds
	if !slices.Contains(s.cfg.AllowUIDs, c.UID) && !slices.Contains(s.cfg.AllowGIDs, c.GID) {
		s.refused("uid_not_allowed", &c, errors.New("UID and GID not in the allow-list"))
		return c, status.Errorf(codes.PermissionDenied, "workload api: UID %d (GID %d) is not allowed: the agent's workload_api allow_uids/allow_gids admit callers", c.UID, c.GID)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(headerKey); len(v) != 1 || v[0] != headerValue {
		s.refused("missing_header", &c, errors.New("no workload.spiffe.io: true metadata"))
		return c, status.Error(codes.InvalidArgument, "security header missing from request")
	}
	return c, nil
}

func (s *Server) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if _, err := s.admit(ctx); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (s *Server) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	c, err := s.admit(ss.Context())
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.streams[c.UID] >= s.cfg.MaxStreamsPerUID {
		s.mu.Unlock()
		s.refused("too_many_streams", &c, fmt.Errorf("%d streams open", s.cfg.MaxStreamsPerUID))
		return status.Errorf(codes.ResourceExhausted, "workload api: UID %d has %d streams open, the most one UID may hold", c.UID, s.cfg.MaxStreamsPerUID)
	}
	s.streams[c.UID]++
	s.mu.Unlock()
	s.open.Inc()
	defer func() {
		s.open.Dec()
		s.mu.Lock()
		if s.streams[c.UID]--; s.streams[c.UID] <= 0 {
			delete(s.streams, c.UID)
		}
		s.mu.Unlock()
	}()
	return h(srv, ss)
}

// sendWithin sends msg, waiting at most timeout (Config.SendTimeout).
// After a timeout the handler returns, which ends the stream and with it
// the blocked Send.
func sendWithin[T any](send func(*T) error, msg *T, timeout time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- send(msg) }()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return status.Errorf(codes.DeadlineExceeded, "workload api: the caller did not read its stream for %s; open it again", timeout)
	}
}

// watch sends the current snapshot, and each one after it, until the
// caller leaves. Before the agent's first identity it waits, and so it
// does while build has nothing to send (a nil message).
func watch[T any](ctx context.Context, src *Source, timeout time.Duration, send func(*T) error, build func(*Snapshot) (*T, error)) error {
	for {
		snap, changed := src.Current()
		if snap != nil {
			msg, err := build(snap)
			if err != nil {
				return status.Errorf(codes.Internal, "workload api: %v", err)
			}
			if msg != nil {
				if err := sendWithin(send, msg, timeout); err != nil {
					return err
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// FetchX509SVID streams the agent's X.509-SVID with its key and bundle.
func (s *Server) FetchX509SVID(_ *workloadpb.X509SVIDRequest, stream workloadpb.SpiffeWorkloadAPI_FetchX509SVIDServer) error {
	return watch(stream.Context(), s.src, s.cfg.SendTimeout, stream.Send, s.x509SVIDResponse)
}

// FetchX509Bundles streams the trust domain's bundle.
func (s *Server) FetchX509Bundles(_ *workloadpb.X509BundlesRequest, stream workloadpb.SpiffeWorkloadAPI_FetchX509BundlesServer) error {
	return watch(stream.Context(), s.src, s.cfg.SendTimeout, stream.Send, x509BundlesResponse)
}

func concatDER(certs []*x509.Certificate) []byte {
	var b []byte
	for _, c := range certs {
		b = append(b, c.Raw...)
	}
	return b
}

// x509SVIDResponse is nil for a certificate that has expired while the
// agent ran (a bound-keypair agent recovering while the authority is
// away): no peer accepts it, so the stream waits for the recovery's
// snapshot, as it does for an agent started with an expired one.
func (s *Server) x509SVIDResponse(snap *Snapshot) (*workloadpb.X509SVIDResponse, error) {
	if !s.now().Before(snap.Chain[0].NotAfter) {
		return nil, nil
	}
	key, err := x509.MarshalPKCS8PrivateKey(snap.Key)
	if err != nil {
		return nil, fmt.Errorf("encoding the SVID's key: %w", err)
	}
	return &workloadpb.X509SVIDResponse{Svids: []*workloadpb.X509SVID{{
		SpiffeId:    snap.ID,
		X509Svid:    concatDER(snap.Chain),
		X509SvidKey: key,
		Bundle:      concatDER(snap.Roots),
	}}}, nil
}

func x509BundlesResponse(snap *Snapshot) (*workloadpb.X509BundlesResponse, error) {
	return &workloadpb.X509BundlesResponse{Bundles: map[string][]byte{
		"spiffe://" + snap.TrustDomain: concatDER(snap.Roots),
	}}, nil
}

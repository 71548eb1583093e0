// Package enroll admits agents and renews their identities. Every join
// method verifies its own proof and then ends the same way, here: the lock
// checks, the certificate, one conditional write of the node, instance and
// issuance record, an audit record. Renewal applies the generation rule
// that tells a lost reply from a copied identity.
//
// The package knows nothing of gRPC or SQL: it takes small interfaces and
// returns *Refusal for every answer the caller may see.
package enroll

import (
	"cmp"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"golang.org/x/time/rate"
	pkcs12 "software.sslmate.com/src/go-pkcs12"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
)

// Store is what enrollment reads and writes.
type Store interface {
	// ReadJoin serves a join's reads (its token, its node, the locks that
	// would refuse it) in one round trip.
	ReadJoin(ctx context.Context, tokenID, nodeID string, targets []store.LockTarget) (store.JoinRead, error)
	// ReadRenewal serves a renewal's reads (the presented certificate's
	// record, its instance and node, the locks that would refuse it) in
	// one round trip.
	ReadRenewal(ctx context.Context, serial string, keys []string) (store.RenewalRead, error)
	GetNode(ctx context.Context, id string) (store.Node, error)
	GetInstance(ctx context.Context, id string) (store.Instance, error)
	CommitJoin(ctx context.Context, j store.Join) (store.JoinResult, error)
	CommitRenewal(ctx context.Context, r store.Renewal) (store.Instance, error)
	JoinStateKeyStore
	// ListResyncEpochs serves the bound-keypair join state's epochs.
	ListResyncEpochs(ctx context.Context) ([]store.ResyncEpoch, error)
	FindAnyLock(ctx context.Context, targets []store.LockTarget) (store.Lock, error)
	// LockEnd serves a lock's refusal only: when the last lock that
	// applies ends.
	LockEnd(ctx context.Context, targets []store.LockTarget) (time.Time, error)
	InsertLock(ctx context.Context, l store.Lock, audit func(store.AuditHead) (store.AuditRecord, error)) error
	// Now and ListPSKs serve the PSK bootstrap: grace ends by the store
	// clock.
	Now(ctx context.Context) (time.Time, error)
	ListPSKs(ctx context.Context) ([]store.PSK, error)
}

// Auditor writes the audit trail. Refusals go through Refuse, which may
// aggregate a flood from one source into a single record.
type Auditor interface {
	Record(ctx context.Context, e audit.Event) error
	Refuse(ctx context.Context, e audit.Event)
	// Builder and Appended write a record in the same store transaction
	// as the change it records (audit.Logger's methods).
	Builder(e audit.Event) (*audit.Link, error)
	Appended(link *audit.Link)
}

// Limiter is the per-source rate limit of unauthenticated requests.
type Limiter interface {
	Allow(source string) bool
}

// RenewalLimiter holds each instance's allowance of renewals: AllowRate
// takes one from key's bucket, which refills at r and holds burst
// (ratelimit.Keyed).
type RenewalLimiter interface {
	AllowRate(key string, r rate.Limit, burst int) bool
}

// Config wires a Service.
type Config struct {
	Store       Store
	Audit       Auditor
	CA          *ca.Hierarchy
	AuthorityID string
	TrustDomain string
	// Endpoints are the advertised addresses, published in the trust
	// bundle.
	Endpoints []string
	// TokenSealer opens token secrets (purpose seal.InfoToken).
	TokenSealer *seal.Sealer
	// PSKConfig configures the bootstrap-PSK join method. Each method has
	// its own configuration; the token method's is TokenSealer, which the
	// trust bundle shares.
	PSKConfig
	// BoundKeypair configures the bound-keypair join method.
	BoundKeypair BoundKeypairConfig
	// DecoyKey keys the trust bundles answered for unknown token IDs, so
	// they look like the real ones.
	DecoyKey []byte
	// AgentCertTTL is the lifetime of agent certificates.
	AgentCertTTL time.Duration
	// RetryWindow is how long a repeated join is answered with the
	// certificate already issued; DESIGN.md sets 10 minutes.
	RetryWindow time.Duration
	Limiter     Limiter
	// Renewals, with RenewalsPerLifetime above zero, bounds how often one
	// instance is given a new certificate by a renewal (renew.go,
	// allowRenewal); nil or 0: no bound.
	Renewals            RenewalLimiter
	RenewalsPerLifetime int
	Now                 func() time.Time
}

// Service performs joins and renewals.
type Service struct {
	cfg       Config
	decoyOnce sync.Once
	decoy     store.Token // a sealed token no ID names, for decoyCompare
	jsKeys    *joinStateKeys
	issued    issuedStates // join state documents this process signed
	endpoints atomic.Pointer[[]string]
	roots     atomic.Pointer[keptRootsPEM] // rootsPEM's
}

// rootsPEM are the roots the authority trusts now (during a root
// rotation, both, the signing one first), PEM: an answer's
// ca_certificate_pem. The root set is read at every answer, since a
// rotation's phase changes it while the service runs; its encoding is kept
// while the set holds the same certificates, as a string: the answer's
// field is one, so no answer copies it.
func (s *Service) rootsPEM() string {
	roots := s.cfg.CA.Roots().Trusted
	if k := s.roots.Load(); k != nil && slices.Equal(k.certs, roots) {
		return k.pem
	}
	n := 0
	for _, r := range roots {
		n += ca.CertPEMLen(r.Raw)
	}
	out := make([]byte, 0, n)
	for _, r := range roots {
		out = ca.AppendCertPEM(out, r.Raw)
	}
	k := &keptRootsPEM{certs: slices.Clone(roots), pem: string(out)}
	s.roots.Store(k)
	return k.pem
}

// keptRootsPEM is the PEM of a root set, by its certificates (compared by
// pointer: a root rotation's sets hold other certificates).
type keptRootsPEM struct {
	certs []*x509.Certificate
	pem   string
}

// New checks cfg and returns a Service.
func New(cfg Config) (*Service, error) {
	switch {
	case cfg.Store == nil, cfg.Audit == nil, cfg.CA == nil, cfg.TokenSealer == nil:
		return nil, errors.New("enroll: store, audit, CA and token sealer are required")
	case cfg.AgentCertTTL <= 0 || cfg.AgentCertTTL > MaxAgentCertTTL:
		return nil, fmt.Errorf("enroll: agent certificate lifetime must be between 1s and %s", MaxAgentCertTTL)
	case cfg.BoundKeypair.CertTTL < 0 || cfg.BoundKeypair.CertTTL > MaxAgentCertTTL:
		return nil, fmt.Errorf("enroll: bound-keypair certificate lifetime must be between 1s and %s", MaxAgentCertTTL)
	case len(cfg.DecoyKey) < 32:
		return nil, errors.New("enroll: decoy key must be 32 bytes")
	}
	if cfg.RetryWindow == 0 {
		cfg.RetryWindow = DefaultRetryWindow
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.CA.Issuer(ca.RoleAgent) == nil {
		return nil, errors.New("enroll: the hierarchy has no agent intermediate")
	}
	s := &Service{cfg: cfg}
	s.jsKeys = &joinStateKeys{store: cfg.Store, custody: cfg.BoundKeypair.JoinStateCustody, now: cfg.Now}
	if s.jsKeys.custody == nil && cfg.BoundKeypair.JoinStateSealer != nil {
		s.jsKeys.custody = custody.NewSealedWith(cfg.BoundKeypair.JoinStateSealer, "")
	}
	s.SetEndpoints(cfg.Endpoints)
	return s, nil
}

// SetEndpoints replaces the addresses published in the trust bundle, once
// the listeners are bound.
func (s *Service) SetEndpoints(eps []string) {
	eps = append([]string(nil), eps...)
	s.endpoints.Store(&eps)
}

// Lifetimes.
const (
	DefaultAgentCertTTL = 24 * time.Hour
	// DefaultBoundKeypairCertTTL is DESIGN.md's lifetime for bound-keypair
	// agents' certificates.
	DefaultBoundKeypairCertTTL = time.Hour
	MaxAgentCertTTL            = 7 * 24 * time.Hour
	DefaultRetryWindow         = 10 * time.Minute
)

// Request is who asks, for the rate limit and the audit trail.
type Request struct {
	Source        string
	CorrelationID string
}

// Issued is an identity handed to an agent.
type Issued struct {
	NodeID         string
	ChainPEM       []byte
	CAPEM          string // the trusted roots' PEM, shared by every answer: read only
	PKCS12         []byte
	PKCS12Password string
	InstanceID     string
	Generation     int64
	NotAfter       time.Time
	// Retry: the request repeated one already answered; this is the
	// certificate issued then.
	Retry bool
	// TicketID is the jti of the referral ticket a new join used, to be
	// reported to discovery.
	TicketID string
	// SignerSet is the verifier set's ID the request read with its
	// record (a renewal's store.RenewalRead), for the answer's set; zero,
	// with SignerSetRead false, when the request read none.
	SignerSet     store.SignerSetID
	SignerSetRead bool
	// audited: the audit record was written with the change itself.
	audited bool
	// serial is the leaf's, of an answer read back from the store (a
	// retry), for the audit record's reason.
	serial string
}

// The SubjectPublicKeyInfo prefixes of a P-256 key (SEQUENCE, the
// algorithm id-ecPublicKey with the curve prime256v1, the BIT STRING of the
// 65-byte uncompressed point) and of an Ed25519 key (id-Ed25519, the BIT
// STRING of its 32 bytes).
var (
	spkiP256 = []byte{0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01,
		0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00}
	spkiEd25519 = []byte{0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00}
)

// keyID is the SHA-256 of a public key's SubjectPublicKeyInfo: how the
// store remembers which key a certificate certified.
func keyID(pub crypto.PublicKey) ([]byte, error) {
	// The two key types a CSR may carry (ca.AllowedPublicKey) have a
	// SubjectPublicKeyInfo of a fixed prefix and the key's bytes (RFC 5480,
	// RFC 8410): written here without encoding/asn1's reflection, byte for
	// byte what x509.MarshalPKIXPublicKey writes (TestKeyIDIsMarshalPKIX),
	// so a key locked under its ID keeps it.
	var buf [26 + 65]byte // spkiP256 and the point
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			break
		}
		point, err := k.Bytes()
		if err != nil || len(point) != 65 {
			break
		}
		der := append(append(buf[:0], spkiP256...), point...)
		sum := sha256.Sum256(der)
		return sum[:], nil
	case ed25519.PublicKey:
		if len(k) != ed25519.PublicKeySize {
			break
		}
		der := append(append(buf[:0], spkiEd25519...), k...)
		sum := sha256.Sum256(der)
		return sum[:], nil
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(der)
	return sum[:], nil
}

// issue signs an agent certificate for nodeID, which joined by method;
// serverAuth lets it serve TLS too (the token's svid_usage).
func (s *Service) issue(nodeID, method string, pub crypto.PublicKey, now time.Time, serverAuth bool) (ca.Signed, []byte, error) {
	ttl := s.certTTL(method)
	id, err := spiffeid.New(s.cfg.TrustDomain, spiffeid.RoleAgent, nodeID)
	if err != nil {
		return ca.Signed{}, nil, err
	}
	// The active agent intermediate at this moment: a rotation between
	// two issues changes it for the next one.
	agent := s.cfg.CA.Issuer(ca.RoleAgent)
	// Signed, not parsed back: a join or renewal records only the
	// leaf's serial and validity and answers with its DER.
	leaf, err := agent.Sign(ca.LeafRequest{
		PublicKey:  pub,
		SPIFFEID:   id.URL(),
		CommonName: nodeID,
		ClientAuth: true,
		ServerAuth: serverAuth,
		NotBefore:  now,
		TTL:        ttl,
	})
	if err != nil {
		return ca.Signed{}, nil, err
	}
	return leaf, agent.ChainPEMOf(leaf.Raw), nil
}

// certTTL is the lifetime of the certificates an instance that joined by
// method is given.
func (s *Service) certTTL(method string) time.Duration {
	if method == store.JoinMethodBoundKeypair {
		return cmp.Or(s.cfg.BoundKeypair.CertTTL, DefaultBoundKeypairCertTTL)
	}
	return s.cfg.AgentCertTTL
}

// servesTLS reports whether an agent certificate the authority issued may
// serve TLS: a renewal keeps the usage its instance was given at the join.
func servesTLS(leaf *x509.Certificate) bool {
	return slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
}

// issuerOf returns the agent intermediate that signed leaf (the active one
// when leaf was issued, which a rotation since may have made retiring).
func (s *Service) issuerOf(leaf *x509.Certificate) *x509.Certificate {
	for _, c := range s.cfg.CA.Accepted(ca.RoleAgent) {
		if leaf.CheckSignatureFrom(c) == nil {
			return c
		}
	}
	return s.cfg.CA.Issuer(ca.RoleAgent).Cert
}

// keystore mints a key for an agent that sent no CSR and returns it with a
// PKCS#12 keystore holding key and chain under a random password.
func (s *Service) keystore() (*ecdsa.PrivateKey, func(ca.Signed) ([]byte, string, error), error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	return key, func(signed ca.Signed) ([]byte, string, error) {
		leaf, err := x509.ParseCertificate(signed.Raw)
		if err != nil {
			return nil, "", err
		}
		pw := make([]byte, 18)
		if _, err := rand.Read(pw); err != nil {
			return nil, "", err
		}
		password := base64.RawURLEncoding.EncodeToString(pw)
		p12, err := pkcs12.Modern.Encode(key, leaf, []*x509.Certificate{s.issuerOf(leaf), s.cfg.CA.Root}, password)
		return p12, password, err
	}, nil
}

// lockOn returns the lock in force on the earliest of targets that has
// one, or nil, in one store query: when several locks apply, the refusal
// names the same one every time, by the order the caller lists (the node
// first, then the instance, the token and the keys). An empty target (a
// key the authority is about to mint) is skipped.
func (s *Service) lockOn(ctx context.Context, targets ...store.LockTarget) (*store.Lock, error) {
	l, err := s.cfg.Store.FindAnyLock(ctx, store.Named(targets))
	switch {
	case err == nil:
		return &l, nil
	case errors.Is(err, store.ErrNotFound):
		return nil, nil
	default:
		return nil, err
	}
}

// lockOf is the lock a ReadJoin found, or nil.
func lockOf(r store.JoinRead) *store.Lock {
	if !r.Locked {
		return nil
	}
	return &r.Lock
}

// keyLock is the lock target of a public key: the hex SHA-256 of its
// SubjectPublicKeyInfo, as `muster agents show` prints it. A nil key (one
// the authority is about to mint) names no target.
func keyLock(kid []byte) store.LockTarget {
	if kid == nil {
		return store.LockTarget{Kind: store.LockPublicKey}
	}
	return store.LockTarget{Kind: store.LockPublicKey, Target: hex.EncodeToString(kid)}
}

func newLockID() string { return "lock-" + uuid.NewString()[:8] }

package agent

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/signer"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// ErrNoIdentity reports a data directory that holds no identity yet.
var ErrNoIdentity = errors.New("agent: no identity in the data directory")

// maxFileSize bounds every file of the data directory the agent reads.
const maxFileSize = 1 << 20

// Dir is an agent data directory, laid out as DESIGN.md "Agent data
// directory" says. Directories are 0700; keys, the keystore and its
// password 0600.
type Dir string

func (d Dir) path(elem ...string) string {
	return filepath.Join(append([]string{string(d)}, elem...)...)
}

// ConfigFile is agent.yaml: authority, fingerprint, node, join method, and
// a join token only until the join succeeds.
func (d Dir) ConfigFile() string { return d.path("agent.yaml") }

// StateFile is state.json, the record of the current identity. It is
// written last, so its presence means a complete identity.
func (d Dir) StateFile() string { return d.path("state.json") }

// CertFile is the leaf and its intermediate, PEM.
func (d Dir) CertFile() string { return d.path("certs", "agent.crt") }

// KeyFile is the private key of the leaf (0600).
func (d Dir) KeyFile() string { return d.path("certs", "agent.key") }

// CAFile is the pinned root CA, PEM.
func (d Dir) CAFile() string { return d.path("certs", "ca.crt") }

// BundleFile is the trust bundle the agent holds, PEM: the trusted roots,
// then the intermediates and cross-certificates that chain to them.
func (d Dir) BundleFile() string { return d.path("certs", "bundle.pem") }

// PKCS12File is the keystore holding the key and the chain (0600).
func (d Dir) PKCS12File() string { return d.path("certs", "agent.p12") }

// PKCS12PasswordFile holds the keystore's password (0600).
func (d Dir) PKCS12PasswordFile() string { return d.path("certs", "agent.p12.pass") }

// PendingKeyFile is the key of a join or renewal in flight: written before
// the request, removed once its certificate is on disk, so a lost reply is
// retried with the same key and answered with the same certificate.
func (d Dir) PendingKeyFile() string { return d.path("keys", "pending.key") }

// certFiles are every certificate file a join writes.
func (d Dir) certFiles() []string {
	return []string{d.CAFile(), d.BundleFile(), d.CertFile(), d.KeyFile(), d.PKCS12File(), d.PKCS12PasswordFile()}
}

// ensure creates the directory and its subdirectories 0700.
func (d Dir) ensure() error {
	if d == "" {
		return errors.New("agent: no data directory given")
	}
	for _, p := range []string{string(d), d.path("certs"), d.path("keys")} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			return fmt.Errorf("agent: %w", err)
		}
		// MkdirAll leaves an existing directory's mode alone; the data
		// directory is the agent's own. A top directory the agent may not
		// chmod (the root of a volume mounted for it) is accepted: the
		// secrets live in certs/ and keys/, which it creates 0700.
		if err := os.Chmod(p, 0o700); err != nil && !(p == string(d) && errors.Is(err, fs.ErrPermission)) {
			return fmt.Errorf("agent: %w", err)
		}
	}
	return nil
}

func readSmall(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxFileSize {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxFileSize)
	}
	return data, nil
}

// Config is agent.yaml.
type Config struct {
	// Authority is HOST:PORT of the authority.
	Authority string `yaml:"authority,omitempty"`
	// CAFingerprint pins the root CA's key (sha256:HEX).
	CAFingerprint string `yaml:"ca_fingerprint,omitempty"`
	Node          string `yaml:"node,omitempty"`
	JoinMethod    string `yaml:"join_method,omitempty"`
	// Token is a join token (ID.SECRET), kept only until the join
	// succeeds.
	Token string `yaml:"token,omitempty"`
	// PSK is the bootstrap PSK (muster-psk:HEX), kept only until the join
	// succeeds.
	PSK string `yaml:"psk,omitempty"`
	// Discovery is HOST:PORT of the discovery service a join goes
	// through, DiscoveryFingerprint the pin of its CA, AuthorityID the
	// authority looked up there.
	Discovery            string `yaml:"discovery,omitempty"`
	DiscoveryFingerprint string `yaml:"discovery_fingerprint,omitempty"`
	AuthorityID          string `yaml:"authority_id,omitempty"`
	// BoundKeypair is the bound-keypair token's name; RegistrationSecret
	// binds the agent's key to it, kept only until the join succeeds.
	BoundKeypair       string `yaml:"bound_keypair,omitempty"`
	RegistrationSecret string `yaml:"registration_secret,omitempty"`
	// WorkloadAPI configures the SPIFFE Workload API socket of agent run
	// (docs/workload-api.md).
	WorkloadAPI *WorkloadAPIConfig `yaml:"workload_api,omitempty"`
}

// WorkloadAPIConfig is agent.yaml's workload_api section; agent run's
// --workload-api* flags override it.
type WorkloadAPIConfig struct {
	// Listen is unix:///PATH; empty serves no Workload API.
	Listen string `yaml:"listen,omitempty"`
	// SocketMode is the socket's permission bits in octal (default
	// 0600); SocketUID and SocketGID its owner (default the agent's).
	SocketMode string `yaml:"socket_mode,omitempty"`
	SocketUID  *int   `yaml:"socket_uid,omitempty"`
	SocketGID  *int   `yaml:"socket_gid,omitempty"`
	// AllowUIDs and AllowGIDs admit callers by UID or primary GID
	// (default: the agent's own UID alone).
	AllowUIDs []uint32 `yaml:"allow_uids,omitempty"`
	AllowGIDs []uint32 `yaml:"allow_gids,omitempty"`
	// MaxStreamsPerUID caps one UID's open streams (default 32).
	MaxStreamsPerUID int `yaml:"max_streams_per_uid,omitempty"`
	// CallTimeout bounds a unary call, its request and reply included
	// (a duration of at least 1s; default 1m).
	CallTimeout string `yaml:"call_timeout,omitempty"`
}

// ReadConfig reads agent.yaml; a missing file is an empty Config. Unknown
// keys are refused, so a misspelt setting is not silently ignored.
func (d Dir) ReadConfig() (Config, error) {
	var c Config
	data, err := readSmall(d.ConfigFile())
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	} else if err != nil {
		return c, fmt.Errorf("agent: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		// yaml errors quote lines, which may hold the token: say only
		// where the file is.
		return Config{}, fmt.Errorf("agent: %s is not valid: %v", d.ConfigFile(), redactYAMLError(err))
	}
	return c, nil
}

// redactYAMLError keeps a YAML error's kind without any quoted content.
func redactYAMLError(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		return "unknown key or wrong type (keys: " + configKeys + ")"
	}
	return "malformed YAML"
}

// configKeys lists agent.yaml's keys, read from Config's tags so that a
// new setting is named without a second list to keep (the hand-kept one
// lacked workload_api's call_timeout).
var configKeys = func() string {
	keys := yamlKeys(reflect.TypeFor[Config]())
	for i, k := range keys {
		if k == "workload_api" {
			keys[i] += ": " + strings.Join(yamlKeys(reflect.TypeFor[WorkloadAPIConfig]()), ", ")
		}
	}
	return strings.Join(keys, ", ")
}()

// yamlKeys is the yaml key of each field of struct type t, in order.
func yamlKeys(t reflect.Type) []string {
	var keys []string
	for f := range t.Fields() {
		if name, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); name != "" && name != "-" {
			keys = append(keys, name)
		}
	}
	return keys
}

// ConfigReadableByOthers reports whether agent.yaml exists and other users
// can read it: worth a warning when it holds a token.
func (d Dir) ConfigReadableByOthers() bool {
	fi, err := os.Stat(d.ConfigFile())
	return err == nil && fi.Mode().Perm()&0o077 != 0
}

// WriteConfig writes agent.yaml (0600: it may hold a token).
func (d Dir) WriteConfig(c Config) error {
	if err := d.ensure(); err != nil {
		return err
	}
	data, err := yaml.Marshal(c)
	if err != nil {
		return err
	}
	return identity.WriteFileAtomic(d.ConfigFile(), data, 0o600)
}

// State is state.json: what the agent knows of its identity.
type State struct {
	NodeID      string `json:"node_id"`
	InstanceID  string `json:"instance_id"`
	AuthorityID string `json:"authority_id"`
	TrustDomain string `json:"trust_domain"`
	// Authority is the address (HOST:PORT) the agent renews at: the API
	// address the authority advertised at the join, or the join's address.
	Authority   string     `json:"authority"`
	Generation  int64      `json:"generation"`
	JoinMethod  string     `json:"join_method"`
	JoinedAt    time.Time  `json:"joined_at"`
	LastRenewal *time.Time `json:"last_renewal"`
	NotAfter    time.Time  `json:"not_after"`
	Serial      string     `json:"serial"`
	// VerifierSet is the last signed verifier set the agent accepted, as
	// received; StagedVerifiers the staged signers learnt since from
	// rotate tasks (package signer's Trust).
	VerifierSet     json.RawMessage `json:"verifier_set,omitempty"`
	StagedVerifiers []signer.SetKey `json:"staged_verifiers,omitempty"`
	// RecentTasks is the replay window: task ID -> the task's expiry.
	RecentTasks map[string]time.Time `json:"recent_tasks,omitempty"`
	// LastRotateTask is the last rotate task the agent took.
	LastRotateTask string `json:"last_rotate_task,omitempty"`
	// JoinState is the last join state document of a bound-keypair join,
	// presented at the next one; RecoveriesRemaining its budget left
	// (-1: the token's mode does not count).
	BoundKeypair        string `json:"bound_keypair,omitempty"`
	JoinState           string `json:"join_state,omitempty"`
	RecoveriesRemaining *int64 `json:"recoveries_remaining,omitempty"`
	// TrustBundle is the digest of the last trust bundle the agent took
	// (certs/bundle.pem holds what it kept of it).
	TrustBundle string `json:"trust_bundle,omitempty"`
}

// ReadState reads state.json; ErrNoIdentity if there is none.
func (d Dir) ReadState() (*State, error) {
	var s State
	if err := readStateFile(d.StateFile(), &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// nextStateFile is the state of a join written before its certificate,
// with what the join sets in agent.yaml: a crash between the certificate
// and state.json leaves what state.json and agent.yaml were to say (load
// takes it when its serial is the certificate's).
func (d Dir) nextStateFile() string { return d.path("state.next.json") }

// nextState is nextStateFile's content: the state, what the join sets
// in agent.yaml (nil in a file an agent before it wrote), and the trust
// bundle the join's answer carried (nil if none, or in a file an agent
// before it wrote).
type nextState struct {
	*State
	Config *joinConfig `json:"agent_yaml,omitempty"`
	Bundle *joinBundle `json:"trust_bundle,omitempty"`
}

// joinBundle is the trust bundle a join's answer carried, as it came: a
// crash after the certificate and before the bundle is written would
// leave certs/bundle.pem (the roots and intermediates local relying
// parties read) the old authority's, and state.json no bundle digest,
// until the new authority's next answer; load takes it as the join
// would have.
type joinBundle struct {
	AuthorityID   string   `json:"authority_id"`
	Roots         [][]byte `json:"roots"`
	Intermediates [][]byte `json:"intermediates,omitempty"`
	Cross         [][]byte `json:"cross_certificates,omitempty"`
}

func newJoinBundle(pb *musterv1.TrustBundle) *joinBundle {
	if pb == nil {
		return nil
	}
	return &joinBundle{AuthorityID: pb.GetAuthorityId(), Roots: pb.GetRoots(),
		Intermediates: pb.GetIntermediates(), Cross: pb.GetCrossCertificates()}
}

// proto is b as the answer carried it (nil: none).
func (b *joinBundle) proto() *musterv1.TrustBundle {
	if b == nil {
		return nil
	}
	return &musterv1.TrustBundle{AuthorityId: b.AuthorityID, Roots: b.Roots,
		Intermediates: b.Intermediates, CrossCertificates: b.Cross}
}

// joinConfig is what a join sets in agent.yaml: where it joined, the node,
// the join method and the pins. Every other setting (workload_api) stays,
// and the join's secret is dropped apart (once state.json exists).
type joinConfig struct {
	Authority     string `json:"authority"`
	Node          string `json:"node"`
	JoinMethod    string `json:"join_method"`
	BoundKeypair  string `json:"bound_keypair,omitempty"`
	CAFingerprint string `json:"ca_fingerprint"`
	// The discovery service and the authority looked up there, set by a
	// join through discovery: a join to an address clears them (its
	// authority_id the one it was given, if any), or a later join with
	// no flags would go back through the discovery service it replaced
	// (discovery wins over an address in agent.yaml: ResolveJoin).
	Discovery            string `json:"discovery,omitempty"`
	DiscoveryFingerprint string `json:"discovery_fingerprint,omitempty"`
	AuthorityID          string `json:"authority_id,omitempty"`
	// keepDiscovery: made by joinConfigOf, which cannot tell whether the
	// join went through discovery, so agent.yaml's are kept.
	keepDiscovery bool
}

// joinConfigOf is what a join that wrote st, with the certificate whose
// roots are roots, set in agent.yaml, for a state.next.json that does not
// say (an agent before it wrote none): the state's address, node and join
// method, and the pin: pinned, if one of roots, else the first root.
func joinConfigOf(st *State, roots []*x509.Certificate, pinned string) *joinConfig {
	pin := ""
	if fp, err := ca.ParseFingerprint(pinned); err == nil {
		for _, r := range roots {
			if ca.Fingerprint(r) == fp {
				pin = fp
			}
		}
	}
	if pin == "" && len(roots) > 0 {
		pin = ca.Fingerprint(roots[0])
	}
	return &joinConfig{Authority: st.Authority, Node: st.NodeID, JoinMethod: st.JoinMethod, BoundKeypair: st.BoundKeypair, CAFingerprint: pin,
		keepDiscovery: true}
}

// apply sets j in c.
func (j *joinConfig) apply(c *Config) {
	c.Authority, c.Node, c.JoinMethod = j.Authority, j.Node, j.JoinMethod
	c.BoundKeypair, c.CAFingerprint = j.BoundKeypair, j.CAFingerprint
	if !j.keepDiscovery {
		c.Discovery, c.DiscoveryFingerprint, c.AuthorityID = j.Discovery, j.DiscoveryFingerprint, j.AuthorityID
	}
}

// readNextState reads nextStateFile; ErrNoIdentity if there is none.
func (d Dir) readNextState() (*nextState, error) {
	n := nextState{State: &State{}}
	if err := readStateFile(d.nextStateFile(), &n); err != nil {
		return nil, err
	}
	return &n, nil
}

// readStateFile decodes the JSON in file into v; ErrNoIdentity if there
// is none.
func readStateFile(file string, v any) error {
	data, err := readSmall(file)
	if errors.Is(err, fs.ErrNotExist) {
		return ErrNoIdentity
	} else if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("agent: %s: %v", file, err)
	}
	return nil
}

// writeNextState writes n to nextStateFile.
func (d Dir) writeNextState(n nextState) error {
	if err := d.ensure(); err != nil {
		return err
	}
	data, err := json.MarshalIndent(n, "", "  ")
	if err != nil {
		return err
	}
	return identity.WriteFileAtomic(d.nextStateFile(), append(data, '\n'), 0o600)
}

// removeNextState removes nextStateFile once state.json says what it did.
func (d Dir) removeNextState() error {
	if err := os.Remove(d.nextStateFile()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("agent: %w", err)
	}
	return nil
}

// HasIdentity reports whether state.json exists.
func (d Dir) HasIdentity() bool {
	_, err := os.Stat(d.StateFile())
	return err == nil
}

func (d Dir) writeState(s *State) error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return identity.WriteFileAtomic(d.StateFile(), append(data, '\n'), 0o600)
}

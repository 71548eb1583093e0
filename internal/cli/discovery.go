package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/callcap"
	"github.com/muster-dev/muster/internal/discovery"
	"github.com/muster-dev/muster/internal/discoveryclient"
	"github.com/muster-dev/muster/internal/discoveryd"
	"github.com/muster-dev/muster/internal/listener"
	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/postgres"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// Bounds of --key-rotation: a key must sign for a while, and must not
// outlive the habit of rotating.
const (
	minKeyRotation = time.Minute
	maxKeyRotation = 90 * 24 * time.Hour
)

type discoveryOptions struct {
	dir           string
	listen        string
	advertise     string
	storeURL      string
	metricsListen string
	keyRotation   time.Duration
	logFormat     string
	logLevel      string
	// allow are --allow-authority entries (ID=sha256:HEX), added to those
	// of DIR/discovery.yaml; openRegistration accepts any other ID too.
	allow            []string
	openRegistration bool
	// trustedProxies are IPs or CIDRs of TCP load balancers whose PROXY
	// header names the client.
	trustedProxies []string
	pprofListen    string
	// configFile is the settings file in use: DIR/discovery.yaml, or the
	// one --config names.
	configFile string
	// maxCallsPerSource is limits.max_calls_per_source.
	maxCallsPerSource int
	// callTimeout is limits.call_timeout.
	callTimeout time.Duration
}

func newDiscoveryCmd(env *Env) *cobra.Command {
	var o discoveryOptions
	var configFile string
	var checkOnly bool
	cmd := &cobra.Command{
		Use:   "discovery --data DIR",
		Short: "Run a discovery service: authorities register there, agents get referral tickets",
		Long: `discovery runs muster's optional directory of authorities. Authorities
(muster authority --discovery HOST:PORT) register their endpoints, CA and
signed ticket policy; agents look an authority up and ask for a 60-second
referral ticket for their node, which the authority requires beside the
bootstrap PSK. Discovery never sees a PSK or a token.

DIR is initialised on first start: a storage key, and a CA of discovery's
own (DIR/tls) whose fingerprint authorities and agents pin with
--discovery-fingerprint; muster discovery show prints it. The ticket keys
are rotated every --key-rotation and published, with the previous key
during an overlap, at https://ADVERTISE/.well-known/jwks.json on the same
listener. The ticket issuer is https://ADVERTISE: authorities must name
discovery by that same HOST:PORT, so discovery refuses to start when it
would be 0.0.0.0 or [::] (set --advertise).

Only the authorities allowed may register, each under its own root: list
them with --allow-authority AUTHORITY_ID=sha256:HEX (the authority's ID
and ca_fingerprint, as muster init printed them) or in DIR/discovery.yaml
(or the file --config names):

  allowed_authorities:
    - {authority_id: prod-a3f2e1, ca_fingerprint: "sha256:…"}

The flags add to the file. Without any, every registration is refused.
--open-registration accepts any other authority ID too, locked to the
first root that registers it: unsafe, as whoever grinds a key matching an
ID's 6 hex digits can take the ID first. A registration is deleted with
muster discovery forget AUTHORITY_ID.

The settings file may also hold listen, advertise, store, metrics_listen,
key_rotation, trusted_proxies and log.format/log.level; MUSTER_* variables
override it and flags override both. --check-config validates the settings
and exits.

On a PostgreSQL store discovery holds the store's serving lock while it
runs, as an authority replica does: muster store reapply on that database
refuses while it serves, and while the command works discovery refuses to
start (start it again once the command has finished), or stops serving
should the command take the lock in a gap of its connection.`,
		Example: `  muster discovery --data /var/lib/muster-discovery --advertise discovery.example.com:7450
  muster discovery --data /var/lib/muster-discovery --config /etc/muster/discovery.yaml --check-config`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.dir == "" {
				return errors.New("discovery: --data DIR is required")
			}
			if err := discoverySettings(cmd, &o, configFile); err != nil {
				return fmt.Errorf("discovery: %w", err)
			}
			if checkOnly {
				return checkDiscoveryConfig(env, o)
			}
			return runDiscovery(cmd.Context(), env, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.dir, "data", "", "discovery data directory (created on first start)")
	f.StringVar(&o.listen, "listen", discoveryd.DefaultListen, "address of the API and the JWKS")
	f.StringVar(&o.advertise, "advertise", "", "HOST:PORT authorities and agents reach discovery at; names the ticket issuer (default: the listen address)")
	f.StringVar(&o.storeURL, "store", "", "store URL: sqlite://PATH or postgres://… (default: the one DIR/discovery.addr records, without a password: PGPASSWORD or PGPASSFILE gives it; else DIR/discovery.db)")
	f.StringVar(&o.metricsListen, "metrics-listen", "127.0.0.1:7451", "address of /metrics, /healthz and /readyz over plain HTTP (empty: off)")
	f.IntVar(&o.maxCallsPerSource, "max-calls-per-source", callcap.DefaultPerSource, "calls (and HTTPS requests) one source address may have in flight at once; the next is refused RESOURCE_EXHAUSTED (limits.max_calls_per_source; 0: the default)")
	f.DurationVar(&o.callTimeout, "call-timeout", discoveryd.DefaultCallTimeout, "the longest a call may last, its request and reply included, unless its caller asks for less (limits.call_timeout; at least 1s)")
	f.DurationVar(&o.keyRotation, "key-rotation", discoveryd.DefaultKeyRotation, "how long a ticket signing key is used before the next one")
	f.StringVar(&o.logFormat, "log-format", "", "log format: text or json (default: text on a terminal, json otherwise)")
	f.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	f.StringSliceVar(&o.trustedProxies, "trusted-proxy", nil, "IP or CIDR of a TCP load balancer whose PROXY protocol header gives the client address (repeatable)")
	f.StringSliceVar(&o.allow, "allow-authority", nil, "AUTHORITY_ID=sha256:HEX: an authority that may register, under that root only (repeatable; adds to DIR/discovery.yaml)")
	f.BoolVar(&o.openRegistration, "open-registration", false, "UNSAFE: also accept authority IDs not allowed, each locked to the first root that registers it")
	registerPprofFlag(cmd, &o.pprofListen)
	f.StringVar(&configFile, "config", "", "settings file (default: DIR/discovery.yaml)")
	f.BoolVar(&checkOnly, "check-config", false, "validate the settings, print those in force, and exit")
	cmd.AddCommand(newDiscoveryShowCmd(env), newDiscoveryLookupCmd(env), newDiscoveryRotateKeyCmd(env), newDiscoveryForgetCmd(env), newDiscoveryAuditCmd(env))
	return cmd
}

func runDiscovery(ctx context.Context, env *Env, o discoveryOptions) error {
	log, err := newLogger(env.Stderr, o.logFormat, o.logLevel)
	if err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	if err := checkPprof(o.pprofListen); err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	proxies, err := listener.ParseTrustedProxies(o.trustedProxies)
	if err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	allowed, err := registrationSettings(o.configFile, o.allow, o.openRegistration, log)
	if err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	id, err := discoveryd.Init(o.dir)
	if err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	ctx, stopServing := context.WithCancelCause(ctx)
	defer stopServing(nil)
	url, st, closeStore, err := openServingDiscoveryStore(ctx, id.Dir, o.storeURL, log, func(err error) {
		switch {
		case err == nil:
			log.Info("store: the serving lock is held again")
		case errors.Is(err, postgres.ErrExcluded):
			stop := discoveryStopServing(id.Dir)
			log.Error(stop.Error(), "error", err)
			stopServing(stop)
		default:
			log.Warn("store: the serving lock is lost; until it is held again (tried every 2 s), muster store reapply is not kept out while discovery serves", "error", err)
		}
	})
	if err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	defer closeStore()
	record, err := discoveryStoreRecord(id.Dir, url)
	if err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	srv, err := discoveryd.New(discoveryd.Config{
		Dir: string(id.Dir), Store: st, StoreURL: record, Listen: o.listen, Advertise: o.advertise,
		MetricsListen: o.metricsListen, KeyRotation: o.keyRotation, Log: log,
		TrustedProxies:     proxies,
		AllowedAuthorities: allowed, OpenRegistration: o.openRegistration,
		MaxCallsPerSource: o.maxCallsPerSource, CallTimeout: o.callTimeout,
	})
	if err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	if err := withPprof(ctx, o.pprofListen, log, srv.Run); err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	if cause := context.Cause(ctx); errors.Is(cause, errDiscoveryStopServing) {
		return fmt.Errorf("discovery: %w", cause)
	}
	log.Info("discovery stopped")
	return nil
}

// errDiscoveryStopServing is what stops a discovery replica whose serving
// lock muster store reapply took in a gap of its connection: the command
// rewrites the store under it (discoveryStopServing names the way out).
var errDiscoveryStopServing = errors.New("store: an offline command that needs every replica stopped (muster store reapply) took the serving lock " +
	"while discovery's connection holding it had failed, and works on the store: discovery stopped serving rather than write under it")

// discoveryStopServing is errDiscoveryStopServing with its way out.
func discoveryStopServing(d discoveryd.Dir) error {
	return fmt.Errorf("%w; start it again once the command has finished: muster discovery --data %s (with the flags it ran with)",
		errDiscoveryStopServing, shellword.Quote(string(d)))
}

// openServingDiscoveryStore opens discovery's store as openDiscoveryStore
// does and, on a shared (PostgreSQL) store, holds the serving lock as an
// authority does (openAuthorityStore): taken before the store opens,
// which may migrate it, so never under muster store reapply, and held
// while discovery runs, which keeps the command out; onLost hears of its
// loss as Store.HoldServing says. close releases both.
func openServingDiscoveryStore(ctx context.Context, d discoveryd.Dir, given string, log *slog.Logger,
	onLost func(error)) (url string, st store.Store, close func(), err error) {
	releaseOpening := func() {}
	if url, recorded, err := d.StoreURL(given); err == nil && !strings.HasPrefix(url, "sqlite://") && checkStoreURL(url) == nil {
		release, err := postgres.HoldServingAtAs(ctx, url, postgres.ServingDiscovery)
		if err != nil {
			// Not opened: the store would be migrated without the lock
			// should the database answer now. The store discovery.addr
			// records names where its password comes from.
			if recorded && !errors.Is(err, postgres.ErrExcluded) {
				return "", nil, nil, discoveryStoreError(d, url, recorded, err)
			}
			return "", nil, nil, discoveryLockErr(d, url, err)
		}
		releaseOpening = release
	}
	defer releaseOpening()
	url, st, err = openDiscoveryStore(ctx, d, given, log)
	if err != nil {
		return "", nil, nil, err
	}
	close = func() { st.Close() }
	if s, ok := st.(*postgres.Store); ok {
		release, err := s.HoldServingAs(ctx, postgres.ServingDiscovery, onLost)
		if err != nil {
			st.Close()
			return "", nil, nil, discoveryLockErr(d, url, err)
		}
		close = func() { release(); st.Close() }
	}
	return url, st, close, nil
}

// discoveryLockErr is the refusal when discovery cannot take the serving
// lock on the store at url, before its store opened or after: each names
// the store (without its password) and the way on.
func discoveryLockErr(d discoveryd.Dir, url string, err error) error {
	switch {
	case errors.Is(err, postgres.ErrExcluded):
		return fmt.Errorf("%w (muster store reapply, which re-applies what a restore from a backup undid): "+
			"start discovery again once it has finished: muster discovery --data %s (with the flags it ran with)", err, shellword.Quote(string(d)))
	case errors.Is(err, store.ErrUnavailable):
		return fmt.Errorf("the store %s is unavailable: %w; start the database or make it reachable from here, then run this again",
			storeURLWithoutPassword(url), err)
	}
	return fmt.Errorf("the store %s: %w; check that the database answers and this role may take advisory locks, then run this again: muster discovery --data %s (with the flags it ran with)",
		storeURLWithoutPassword(url), err, shellword.Quote(string(d)))
}

// discoveryStoreFlags are --data and --store of the commands that work on
// discovery's store directly, whether or not discovery runs.
type discoveryStoreFlags struct{ dir, storeURL string }

func (f *discoveryStoreFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.dir, "data", "", "discovery data directory")
	cmd.Flags().StringVar(&f.storeURL, "store", "", "store URL (default: the one DIR/discovery.addr records, without a password: PGPASSWORD or PGPASSFILE gives it, as to muster discovery; else DIR/discovery.db)")
}

// open opens the data directory and its store; a migration of the
// store's schema is said on env's standard error.
func (f *discoveryStoreFlags) open(ctx context.Context, env *Env) (discoveryd.Dir, store.Store, error) {
	d, err := discoveryDir(f.dir)
	if err != nil {
		return "", nil, err
	}
	log, err := newLogger(env.Stderr, "", "info")
	if err != nil {
		return "", nil, err
	}
	_, st, err := openDiscoveryStore(ctx, d, f.storeURL, log)
	if err != nil {
		return "", nil, err
	}
	return d, st, nil
}

// openDiscoveryStore opens the store given names, by default the one
// discovery.addr records (discoveryd.Dir.StoreURL), else the SQLite file
// in the data directory; url is the one opened. Failing to connect to the
// recorded one, which has no password, names where the password comes
// from and the way out, since a URL the user gave nowhere is not what
// they would think of. A migration of the store's schema is said on log,
// as the authority's start says it.
func openDiscoveryStore(ctx context.Context, d discoveryd.Dir, given string, log *slog.Logger) (url string, st store.Store, err error) {
	url, recorded, err := d.StoreURL(given)
	if err != nil {
		return "", nil, err
	}
	ml := &migrationLog{log: log, then: "discovery's store opens once it is done"}
	st, err = openStoreWith(ctx, url, 0, ml.migrating)
	ml.done()
	if err != nil && recorded {
		return "", nil, discoveryStoreError(d, url, recorded, err)
	}
	return url, st, err
}

// discoveryStoreError is err, met opening (or taking the serving lock
// of) the store url, with the way out: for the one discovery.addr
// records, which has no password, where the password comes from, since a
// URL the user gave nowhere is not what they would think of.
func discoveryStoreError(d discoveryd.Dir, url string, recorded bool, err error) error {
	switch {
	case recorded && errors.Is(err, store.ErrUnavailable):
		// Not the password: the database did not answer (openStoreWith).
		return fmt.Errorf("the store %s records, %s, is unavailable: %w; start the database or make it reachable from here, "+
			"then run this again (--store URL names another)", d.AddressFile(), url, err)
	case recorded:
		return fmt.Errorf("the store %s records, %s: %w; its password comes from PGPASSWORD or PGPASSFILE, as for muster discovery: "+
			"set one, or give --store URL", d.AddressFile(), url, err)
	case errors.Is(err, store.ErrUnavailable):
		return fmt.Errorf("the store %s is unavailable: %w; start the database or make it reachable from here, then run this again",
			storeURLWithoutPassword(url), err)
	default:
		return fmt.Errorf("the store %s: %w", storeURLWithoutPassword(url), err)
	}
}

// discoveryStoreRecord is url as discovery.addr records it: "" for the
// data directory's own discovery.db; a SQLite file by its absolute path,
// so the commands find it from any directory; any other without its
// password, as authority.json records the authority's
// (storeURLWithoutPassword).
func discoveryStoreRecord(d discoveryd.Dir, url string) (string, error) {
	if url == d.DefaultStoreURL() {
		return "", nil
	}
	if path, ok := strings.CutPrefix(url, "sqlite://"); ok {
		abs, err := filepath.Abs(path)
		if err != nil {
			return "", err
		}
		if abs == d.DatabaseFile() {
			return "", nil
		}
		return "sqlite://" + abs, nil
	}
	return storeURLWithoutPassword(url), nil
}

// discoveryDir checks --data names an initialised discovery directory.
func discoveryDir(flag string) (discoveryd.Dir, error) {
	if flag == "" {
		return "", errors.New("--data DIR is required")
	}
	if _, err := discoveryd.ReadCA(flag); err != nil {
		return "", err
	}
	return discoveryd.Dir(flag), nil
}

type ticketKeyJSON struct {
	ID           string     `json:"id"`
	Status       string     `json:"status"`
	CreatedAt    time.Time  `json:"created_at"`
	PublishUntil *time.Time `json:"publish_until,omitempty"`
}

type discoveryShowJSON struct {
	Fingerprint string          `json:"fingerprint"`
	Issuer      string          `json:"issuer,omitempty"`
	TicketKeys  []ticketKeyJSON `json:"ticket_keys"`
	// AllowedAuthorities are those of DIR/discovery.yaml; --allow-authority
	// flags given at start are not known here.
	AllowedAuthorities []allowedJSON `json:"allowed_authorities"`
	ConfigFile         string        `json:"config_file"`
}

type allowedJSON struct {
	AuthorityID   string `json:"authority_id"`
	CAFingerprint string `json:"ca_fingerprint"`
}

func newDiscoveryShowCmd(env *Env) *cobra.Command {
	var (
		sf  discoveryStoreFlags
		out output
	)
	cmd := &cobra.Command{
		Use: "show --data DIR",
		Example: `  muster discovery show --data /var/lib/muster-discovery
  muster discovery show --data ./discovery-data -o json`,
		Short: "Print discovery's fingerprint, ticket issuer, ticket keys and allowed authorities",
		Long: `show prints what authorities and agents need to trust this discovery:
the fingerprint of its CA (--discovery-fingerprint), and the ticket issuer
once a discovery has started in DIR; then the ticket signing keys, and the
authorities DIR/discovery.yaml allows to register (--allow-authority flags
given at start add to these). It reads DIR and the store, whether or not
discovery is running.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			d, err := discoveryDir(sf.dir)
			if err != nil {
				return fmt.Errorf("discovery show: %w", err)
			}
			cert, err := discoveryd.ReadCA(string(d))
			if err != nil {
				return fmt.Errorf("discovery show: %w", err)
			}
			res := discoveryShowJSON{Fingerprint: ca.Fingerprint(cert), TicketKeys: []ticketKeyJSON{}}
			if a, err := d.ReadAddress(); err == nil {
				res.Issuer = a.Issuer
			} else if !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("discovery show: %w", err)
			}
			// The embedded store exists once discovery has started; show
			// does not create it.
			url, _, err := d.StoreURL(sf.storeURL)
			if err != nil {
				return fmt.Errorf("discovery show: %w", err)
			}
			if _, err := os.Stat(d.DatabaseFile()); url != d.DefaultStoreURL() || err == nil {
				keys, err := listTicketKeys(cmd.Context(), env, d, sf.storeURL)
				if err != nil {
					return fmt.Errorf("discovery show: %w", err)
				}
				res.TicketKeys = keys
			}
			cfg, err := loadDiscoveryConfig(d.ConfigFile())
			if err != nil {
				return fmt.Errorf("discovery show: %w", err)
			}
			res.ConfigFile, res.AllowedAuthorities = d.ConfigFile(), []allowedJSON{}
			for _, e := range cfg.AllowedAuthorities {
				res.AllowedAuthorities = append(res.AllowedAuthorities, allowedJSON{AuthorityID: e.AuthorityID, CAFingerprint: e.Fingerprint})
			}
			if out.json() {
				return out.write(env.Stdout, res)
			}
			printDiscoveryShow(env.Stdout, res)
			return nil
		},
	}
	sf.register(cmd)
	out.register(cmd)
	return cmd
}

func listTicketKeys(ctx context.Context, env *Env, d discoveryd.Dir, storeURL string) ([]ticketKeyJSON, error) {
	log, err := newLogger(env.Stderr, "", "info")
	if err != nil {
		return nil, err
	}
	_, st, err := openDiscoveryStore(ctx, d, storeURL, log)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	keys, err := st.ListTicketKeys(ctx)
	if err != nil {
		return nil, err
	}
	out := []ticketKeyJSON{}
	for _, k := range keys {
		j := ticketKeyJSON{ID: k.ID, Status: k.Status, CreatedAt: k.CreatedAt}
		if !k.PublishUntil.IsZero() {
			p := k.PublishUntil
			j.PublishUntil = &p
		}
		out = append(out, j)
	}
	return out, nil
}

func printDiscoveryShow(w io.Writer, res discoveryShowJSON) {
	fmt.Fprintf(w, "Fingerprint:  %s\n", res.Fingerprint)
	if res.Issuer != "" {
		fmt.Fprintf(w, "Issuer:       %s\n", res.Issuer)
	} else {
		fmt.Fprintln(w, "Issuer:       not known yet (start muster discovery on this directory)")
	}
	if len(res.TicketKeys) == 0 {
		fmt.Fprintln(w, "Ticket keys:  none yet (discovery makes the first one when it starts)")
	} else {
		fmt.Fprintln(w, "Ticket keys:")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  ID\tSTATUS\tCREATED\tPUBLISHED UNTIL")
		for _, k := range res.TicketKeys {
			until := "-"
			if k.PublishUntil != nil {
				until = pskTime(*k.PublishUntil)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", k.ID, k.Status, pskTime(k.CreatedAt), until)
		}
		tw.Flush()
	}
	if len(res.AllowedAuthorities) == 0 {
		// Only the file is known here: the running service's flags may
		// allow authorities (or everyone) that no file names.
		fmt.Fprintf(w, "Allowed:      no authority in %s; the running service's --allow-authority or --open-registration flags may allow more (this directory cannot tell)\n", res.ConfigFile)
	} else {
		fmt.Fprintf(w, "Allowed:      in %s (the running service's --allow-authority or --open-registration flags may allow more):\n", res.ConfigFile)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, a := range res.AllowedAuthorities {
			fmt.Fprintf(tw, "  %s\t%s\n", a.AuthorityID, a.CAFingerprint)
		}
		tw.Flush()
	}
	fmt.Fprintf(w, "\nAuthorities and agents pin this discovery with --discovery-fingerprint %s\n", res.Fingerprint)
}

type lookupJSON struct {
	AuthorityID   string   `json:"authority_id"`
	Endpoints     []string `json:"endpoints"`
	CAFingerprint string   `json:"ca_fingerprint"`
	// RootFingerprints are the roots agents may pin now, the signing one
	// first: after a root rotation, not the one the ID names
	// (ca_fingerprint).
	RootFingerprints []string        `json:"root_fingerprints"`
	CABundlePEM      string          `json:"ca_bundle_pem"`
	Version          int64           `json:"version"`
	Policy           json.RawMessage `json:"policy"`
	UpdatedAt        time.Time       `json:"updated_at"`
}

func newDiscoveryLookupCmd(env *Env) *cobra.Command {
	var (
		addr    string
		fp      string
		timeout time.Duration
		out     output
	)
	cmd := &cobra.Command{
		Use:     "lookup AUTHORITY_ID --discovery HOST:PORT [--discovery-fingerprint sha256:…]",
		Example: `  muster discovery lookup prod-a3f2e1 --discovery discovery.example.org:7450 --discovery-fingerprint sha256:…`,
		Short:   "Look an authority up at a discovery service",
		Long: `lookup asks a discovery service for an authority's registered entry: its
endpoints, the fingerprint of its root CA, the registration version and the
ticket policy it signed. Without --discovery-fingerprint the discovery's
certificate must chain to the system roots and name its host.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.check(); err != nil {
				return err
			}
			addr = firstOf(addr, env.Getenv("MUSTER_DISCOVERY"))
			fp = firstOf(fp, env.Getenv("MUSTER_DISCOVERY_FINGERPRINT"))
			if addr == "" {
				return errors.New("discovery lookup: --discovery HOST:PORT is required (or MUSTER_DISCOVERY)")
			}
			if fp != "" {
				canon, err := ca.ParseFingerprint(fp)
				if err != nil {
					return fmt.Errorf("discovery lookup: --discovery-fingerprint: %w", err)
				}
				fp = canon
			}
			conn, err := discoveryclient.Dial(addr, fp)
			if err != nil {
				return fmt.Errorf("discovery lookup: %w", err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			resp, err := musterv1.NewDiscoveryServiceClient(conn).LookupAuthority(ctx, &musterv1.LookupAuthorityRequest{AuthorityId: args[0]})
			if err != nil {
				return discoveryCallError(addr, err)
			}
			res, err := lookupOf(resp)
			if err != nil {
				return fmt.Errorf("discovery lookup: %w", err)
			}
			if out.json() {
				return out.write(env.Stdout, res)
			}
			printLookup(env.Stdout, res)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "discovery", "", "discovery service HOST:PORT (env MUSTER_DISCOVERY)")
	f.StringVar(&fp, "discovery-fingerprint", "", "pin of the discovery's CA, sha256:HEX (env MUSTER_DISCOVERY_FINGERPRINT; default: system roots)")
	f.DurationVar(&timeout, "timeout", 30*time.Second, "how long to wait for the discovery service")
	out.register(cmd)
	return cmd
}

// discoveryCallError names the gRPC code, as describe does, but says
// "discovery" where describe would say "authority".
func discoveryCallError(addr string, err error) error {
	if st, ok := status.FromError(err); ok && st.Code() == codes.Unavailable {
		return fmt.Errorf("UNAVAILABLE: cannot reach the discovery service at %s: %s", addr, oneLine(st.Message()))
	}
	return err
}

// lookupOf checks what discovery answered: the fingerprint it names must
// be that of the root it sends.
func lookupOf(resp *musterv1.LookupAuthorityResponse) (lookupJSON, error) {
	res := lookupJSON{AuthorityID: resp.GetAuthorityId(), Endpoints: resp.GetEndpoints(), CAFingerprint: resp.GetCaFingerprint(),
		CABundlePEM: resp.GetCaBundlePem(), Version: resp.GetVersion(), UpdatedAt: resp.GetUpdatedAt().AsTime()}
	roots, err := discovery.ParseRoots(res.CABundlePEM)
	if err != nil {
		return res, fmt.Errorf("the CA bundle discovery answered: %w", err)
	}
	res.RootFingerprints = roots.Fingerprints()
	if got := ca.Fingerprint(roots.Anchor); got != res.CAFingerprint {
		return res, fmt.Errorf("discovery names root %s but sends a root with fingerprint %s", res.CAFingerprint, got)
	}
	if !json.Valid([]byte(resp.GetPolicyJson())) {
		return res, errors.New("the policy discovery answered is not JSON")
	}
	res.Policy = json.RawMessage(resp.GetPolicyJson())
	return res, nil
}

func printLookup(w io.Writer, res lookupJSON) {
	fmt.Fprintf(w, "Authority:    %s\n", res.AuthorityID)
	fmt.Fprintf(w, "Endpoints:    %s\n", strings.Join(res.Endpoints, ", "))
	fmt.Fprintf(w, "CA:           %s\n", res.CAFingerprint)
	if len(res.RootFingerprints) != 1 || res.RootFingerprints[0] != res.CAFingerprint {
		// A root rotation: the ID names the first root; agents pin these.
		fmt.Fprintf(w, "Roots now:    %s\n", strings.Join(res.RootFingerprints, ", "))
	}
	fmt.Fprintf(w, "Version:      %d\n", res.Version)
	fmt.Fprintf(w, "Updated:      %s\n", pskTime(res.UpdatedAt))
	var policy bytes.Buffer
	if err := json.Indent(&policy, res.Policy, "  ", "  "); err != nil {
		policy.Reset()
		policy.Write(res.Policy)
	}
	fmt.Fprintf(w, "Policy:\n  %s\n", policy.String())
}

type rotateJSON struct {
	Previous             string     `json:"previous,omitempty"`
	Active               string     `json:"active"`
	PreviousPublishUntil *time.Time `json:"previous_publish_until,omitempty"`
}

func newDiscoveryRotateKeyCmd(env *Env) *cobra.Command {
	var (
		sf     discoveryStoreFlags
		revoke bool
		out    output
	)
	cmd := &cobra.Command{
		Use: "rotate-key --data DIR [--revoke-previous]",
		Example: `  muster discovery rotate-key --data /var/lib/muster-discovery
  muster discovery rotate-key --data /var/lib/muster-discovery --revoke-previous`,
		Short: "Make a new ticket signing key now",
		Long: fmt.Sprintf(`rotate-key makes a new active ticket signing key through the store, whether
or not discovery is running: running discovery servers publish it within
seconds and sign with it about fifteen seconds later. The previous key stays in
the JWKS for %s, so tickets it signed stay valid until they expire.

With --revoke-previous (the key may have leaked), the previous key leaves
the JWKS at once and the new one signs at once; authorities drop the old
key at their next JWKS refresh (every minute by default: each authority's
discovery.keys_refresh, at most 10m), and refuse its tickets from then on.`, discoveryd.KeyOverlap),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			d, st, err := sf.open(cmd.Context(), env)
			if err != nil {
				return fmt.Errorf("discovery rotate-key: %w", err)
			}
			defer st.Close()
			r, err := discoveryd.RotateKey(cmd.Context(), string(d), st, revoke)
			if err != nil {
				return fmt.Errorf("discovery rotate-key: %w", err)
			}
			res := rotateJSON{Previous: r.From, Active: r.To}
			if !r.PublishUntil.IsZero() {
				res.PreviousPublishUntil = &r.PublishUntil
			}
			if out.json() {
				return out.write(env.Stdout, res)
			}
			fmt.Fprintf(env.Stdout, "New ticket key:  %s\n", res.Active)
			if res.Previous == "" {
				fmt.Fprintln(env.Stdout, "It is the first ticket key.")
				return nil
			}
			if res.PreviousPublishUntil != nil {
				fmt.Fprintf(env.Stdout, "Previous key:    %s, published until %s\n", res.Previous, pskTime(*res.PreviousPublishUntil))
			} else {
				fmt.Fprintf(env.Stdout, "Previous key:    %s\n", res.Previous)
			}
			if revoke {
				// Nothing else signs meanwhile: the previous key is gone.
				fmt.Fprintln(env.Stdout, "\nWithin seconds running discovery servers stop publishing the previous key and sign with the new one at once;"+
					" authorities refuse the previous key's tickets from their next JWKS refresh"+
					" (every minute by default: each authority's discovery.keys_refresh, at most 10m).")
				return nil
			}
			fmt.Fprintln(env.Stdout, "\nRunning discovery servers publish the new key within seconds and sign with it about fifteen seconds later.")
			return nil
		},
	}
	sf.register(cmd)
	cmd.Flags().BoolVar(&revoke, "revoke-previous", false, "unpublish the current key at once (it may have leaked): tickets it signed are refused from the authorities' next JWKS refresh (every minute by default: each authority's discovery.keys_refresh, at most 10m)")
	out.register(cmd)
	return cmd
}

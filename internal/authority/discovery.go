package authority

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/discovery"
	"github.com/muster-dev/muster/internal/discoveryclient"
	"github.com/muster-dev/muster/internal/listener"
	"github.com/muster-dev/muster/internal/referral"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// DiscoveryConfig links the authority to a discovery service: it registers
// there, reports the joins tickets led to (from the store's outbox, so a
// crash loses no report), and requires a referral ticket with every PSK
// bootstrap.
type DiscoveryConfig struct {
	// Address is discovery's HOST:PORT; its tickets' issuer is
	// "https://"+Address.
	Address string
	// Fingerprint pins discovery's CA ("sha256:…"); empty trusts the
	// system roots.
	Fingerprint string
	// Policy is what the authority lets discovery hand tickets out for.
	Policy discovery.Policy
	// RegisterEvery is the period of re-registration (default 10 minutes).
	RegisterEvery time.Duration
	// KeysRefresh is the period of the scheduled fetch of discovery's
	// ticket keys (default referral.RefreshEvery, a minute): how long a
	// key discovery revoked may still be trusted.
	KeysRefresh time.Duration
	// Endpoints, if set, are the addresses registered, in order of
	// preference (the load balancer in front of several replicas, a
	// bootstrap listener); by default the advertised address. Only the
	// leader registers, so replicas must not each register their own.
	Endpoints []string
}

// Periods of the discovery link.
const (
	defaultRegisterEvery = 10 * time.Minute
	registerRetry        = 30 * time.Second
	// pinMismatchRetry is the wait after discovery's certificate did not
	// match the pin: that lasts until an operator corrects the pin (and
	// restarts the authority) or puts discovery's own CA back, so it is
	// tried again rarely, in case it was the latter.
	pinMismatchRetry     = time.Hour
	discoveryCallTimeout = 15 * time.Second
	// registrationCheck is how often the leader, between registrations,
	// asks discovery whether it still holds this authority: a discovery
	// whose store was lost or restored from before the first
	// registration answers agents "not registered" until the next one,
	// which register_every could put 10 minutes away.
	registrationCheck = 30 * time.Second
)

// discoveryLink is the authority's side of a discovery service.
type discoveryLink struct {
	s      *Server
	cfg    DiscoveryConfig
	conn   *grpc.ClientConn
	client musterv1.DiscoveryServiceClient
	keys   *referral.KeyCache
	policy []byte // canonical JSON
	// joined wakes the report delivery after a join on this replica; one
	// slot is enough, as a pass sends every pending report.
	joined chan struct{}
	// registered is rootsKey of the roots last registered.
	registered atomic.Value
	// keysPinSaid: keysRefreshed logged a pin mismatch, not since
	// followed by another answer.
	keysPinSaid atomic.Bool
}

func newDiscoveryLink(s *Server, cfg DiscoveryConfig) (*discoveryLink, error) {
	cfg.RegisterEvery = RegisterEvery(cfg.RegisterEvery)
	if err := cfg.Policy.Validate(); err != nil {
		return nil, err
	}
	policy, err := cfg.Policy.Canonical()
	if err != nil {
		return nil, err
	}
	if s.ca.Issuer(ca.RolePolicy) == nil {
		return nil, errors.New("authority: the CA directory has no policy signing certificate, which registration needs")
	}
	conn, err := discoveryclient.Dial(cfg.Address, cfg.Fingerprint)
	if err != nil {
		return nil, fmt.Errorf("authority: discovery %s: %w", cfg.Address, err)
	}
	d := &discoveryLink{s: s, cfg: cfg, conn: conn, client: musterv1.NewDiscoveryServiceClient(conn),
		policy: policy, joined: make(chan struct{}, 1)}
	d.keys = &referral.KeyCache{
		Fetch: func(ctx context.Context) ([]byte, error) {
			ctx, cancel := context.WithTimeout(ctx, discoveryCallTimeout)
			defer cancel()
			return discoveryclient.FetchJWKS(ctx, cfg.Address, cfg.Fingerprint)
		},
		OnRefresh: d.keysRefreshed,
		Every:     KeysRefresh(cfg.KeysRefresh),
	}
	if every := d.keys.Every; every > referral.RefreshEvery {
		s.log.Warn(fmt.Sprintf("discovery.keys_refresh %s is longer than the default %s: a ticket key discovery revokes (muster discovery rotate-key --revoke-previous) may be accepted for up to %s after, unless a ticket of an unknown key has the keys fetched sooner; set it to %s or less where that matters",
			every, referral.RefreshEvery, every, referral.RefreshEvery))
	}
	return d, nil
}

// keysRefreshed logs a failed fetch of discovery's ticket keys. A pin
// mismatch is said once until a fetch succeeds or fails otherwise: it
// lasts until an operator corrects the pin (the leader's registration
// names the way out), and every replica fetches every minute.
func (d *discoveryLink) keysRefreshed(err error) {
	_, pin := discoveryclient.PinMismatch(err)
	if err == nil || !pin {
		d.keysPinSaid.Store(false)
	}
	if err == nil || pin && d.keysPinSaid.Swap(true) {
		return
	}
	d.s.log.Warn("cannot fetch discovery's ticket keys", "discovery", d.cfg.Address, "err", err)
}

// verifier checks tickets against discovery's keys.
func (d *discoveryLink) verifier() *referral.Verifier {
	return &referral.Verifier{Keys: d.keys, Issuer: discoveryclient.Issuer(d.cfg.Address), AuthorityID: d.s.info.AuthorityID, Now: time.Now}
}

// run keeps the JWKS fresh, on every replica: each checks the tickets of
// its own joins. Registration and report delivery are leader jobs.
func (d *discoveryLink) run(ctx context.Context) error {
	defer d.conn.Close()
	return d.keys.Run(ctx)
}

// Join reports wait in the store's outbox (store.ReportOutbox), written in
// the transaction of the join they count, until discovery has answered
// them: a crash, a restart or an unreachable discovery delays a report but
// loses none. The leader sends them at start, every reportPoll (joins on
// other replicas), at once after a join on this replica, and after a
// failure once a backoff has passed that doubles from reportBackoff up to
// reportBackoffMax.
const (
	reportPoll       = 2 * time.Second
	reportBatch      = 100
	reportBackoff    = time.Second
	reportBackoffMax = time.Minute
)

// reportJoined wakes the report delivery after a join that used a ticket.
// It never blocks: on a replica that does not lead, nobody listens, and the
// leader's poll finds the report.
func (d *discoveryLink) reportJoined() {
	select {
	case d.joined <- struct{}{}:
	default:
	}
}

// reportLoop delivers the pending join reports. It runs on the leader
// replica only, so one replica sends each report; one sent twice (its
// answer lost, or the leader changed midway) is counted once by discovery,
// which keys reports by instance.
func (d *discoveryLink) reportLoop(ctx context.Context) error {
	defer d.s.metrics.reportsPending.Set(0) // the next leader counts them
	var backoff time.Duration
	for {
		more, err := d.deliverReports(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if n, err := d.s.store.CountPendingReports(ctx); err == nil {
			d.s.metrics.reportsPending.Set(float64(n))
		}
		wait, wake := reportPoll, d.joined
		switch {
		case err != nil:
			backoff = min(max(2*backoff, reportBackoff), reportBackoffMax)
			wait, wake = backoff, nil // a join does not cut a backoff short
			d.s.log.Warn("cannot deliver join reports to discovery; retrying", "discovery", d.cfg.Address, "in", wait, "err", err)
		case more:
			backoff = 0
			continue
		default:
			backoff = 0
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-time.After(wait):
		}
	}
}

// deliverReports sends up to reportBatch pending reports, oldest first,
// and deletes each that discovery answered (recorded or already counted)
// or refused for good. more says the batch was full. err is the first
// failure worth retrying (discovery or the store unavailable, a rate
// limit); it ends the pass, as the reports after it would fare alike, and
// leaves the report pending.
func (d *discoveryLink) deliverReports(ctx context.Context) (more bool, err error) {
	pending, err := d.s.store.ListPendingReports(ctx, reportBatch)
	if err != nil {
		return false, err
	}
	for _, p := range pending {
		err := d.sendReport(ctx, p)
		d.s.metrics.discoveryCall("report", err)
		switch c := status.Code(err); {
		case err == nil:
		case ctx.Err() != nil:
			return false, ctx.Err()
		case c == codes.PermissionDenied || c == codes.InvalidArgument:
			// Discovery will never accept this report: retrying would
			// only hold up the others.
			d.s.log.Error("discovery refused a join report, which it will never accept: dropped, so its daily quota does not count this join",
				"discovery", d.cfg.Address, "node", p.NodeID, "instance", p.InstanceID, "ticket", p.TicketID, "err", err)
		default:
			return false, fmt.Errorf("report of node %s, instance %s: %w", p.NodeID, p.InstanceID, err)
		}
		// ErrNotFound: another replica delivered it as leadership moved.
		if err := d.s.store.DeletePendingReport(ctx, p.InstanceID); err != nil && !errors.Is(err, store.ErrNotFound) {
			return false, err
		}
	}
	return len(pending) == reportBatch, nil
}

// sendReport signs a pending report with the policy key and sends it.
func (d *discoveryLink) sendReport(ctx context.Context, p store.PendingReport) error {
	r := discovery.JoinReport{AuthorityID: d.s.info.AuthorityID, NodeID: p.NodeID, InstanceID: p.InstanceID,
		TicketID: p.TicketID, JoinedAt: p.JoinedAt}
	sig, err := r.Sign(d.s.ca.Issuer(ca.RolePolicy).Key)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, discoveryCallTimeout)
	defer cancel()
	_, err = d.client.ReportJoin(ctx, &musterv1.ReportJoinRequest{AuthorityId: r.AuthorityID, NodeId: r.NodeID,
		InstanceId: r.InstanceID, TicketId: r.TicketID, JoinedAt: timestamppb.New(r.JoinedAt), Signature: sig})
	return err
}

// registerLoop registers now and every RegisterEvery, sooner after a
// failure. It runs on the leader replica only, so replicas never race each
// other's versions. A pin mismatch (discovery's certificate is not the
// pinned CA's) is not retried every registerRetry: it lasts until an
// operator acts, so it is logged and audited once, with the way out,
// shown by muster_discovery_pin_mismatch, and tried again every
// pinMismatchRetry.
func (d *discoveryLink) registerLoop(ctx context.Context) error {
	defer d.s.metrics.discoveryPinMismatch.Set(0) // the next leader says
	reported := false
	for {
		wait := d.cfg.RegisterEvery
		err := d.register(ctx)
		if err != nil && ctx.Err() != nil {
			return nil
		}
		mismatch, pin := discoveryclient.PinMismatch(err)
		switch {
		case err == nil:
			reported = false
		case pin:
			wait = pinMismatchRetry
			if !reported {
				reported = true
				d.reportPinMismatch(ctx, mismatch)
			}
		default:
			reported = false
			d.s.log.Error("cannot register with discovery; retrying", "discovery", d.cfg.Address, "in", registerRetry, "err", err)
			wait = registerRetry
		}
		if pin {
			d.s.metrics.discoveryPinMismatch.Set(1)
		} else {
			d.s.metrics.discoveryPinMismatch.Set(0)
		}
		if !d.waitOrRootsChange(ctx, wait) {
			return nil
		}
	}
}

// reportPinMismatch logs and audits, once per mismatch, that discovery's
// certificate does not match the pinned fingerprint, with the way out:
// mismatch (discoveryclient.PinMismatch) says where the pin to set comes
// from, this what to do with it.
func (d *discoveryLink) reportPinMismatch(ctx context.Context, mismatch string) {
	file := d.s.cfg.ConfigFile
	if file == "" {
		file = d.s.cfg.Dir.ConfigFile()
	}
	reason := fmt.Sprintf("not registered with discovery %s, so agents cannot look this authority up there: %s; "+
		"set it as discovery.fingerprint in %s (or --discovery-fingerprint, MUSTER_DISCOVERY_FINGERPRINT) and restart the authority; "+
		"until then registration is tried again every %s, not every %s (docs/discovery.md)",
		d.cfg.Address, mismatch, file, pinMismatchRetry, registerRetry)
	d.s.log.Error("cannot register with discovery: its certificate does not match the pinned fingerprint, which lasts until the pin is corrected; tried again every hour, not every 30 s",
		"discovery", d.cfg.Address, "in", pinMismatchRetry, "err", reason)
	d.s.refusals.Record(ctx, audit.Event{Actor: "authority", Action: "discovery.register", Target: d.cfg.Address,
		Result: audit.ResultError, Reason: reason})
}

// rootsPoll is how often the leader compares the trusted roots with the
// ones it registered: a root rotation's phase change reaches discovery
// within it, so agents that pin the new root can look the authority up.
const rootsPoll = 2 * time.Second

// waitOrRootsChange waits d, or less if the trusted roots change (a root
// rotation step, on any replica) or discovery no longer holds this
// authority (checked every registrationCheck); false once ctx ends.
func (d *discoveryLink) waitOrRootsChange(ctx context.Context, wait time.Duration) bool {
	deadline := time.Now().Add(wait)
	nextCheck := time.Now().Add(registrationCheck)
	for {
		step := min(rootsPoll, time.Until(deadline))
		if step <= 0 {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(step):
		}
		if k, _ := d.registered.Load().(string); k != rootsKey(d.s.ca.Roots()) {
			return true
		}
		if time.Now().After(nextCheck) {
			nextCheck = time.Now().Add(registrationCheck)
			if d.registrationLost(ctx) {
				return true
			}
		}
	}
}

// registrationLost reports whether discovery answers that it holds no
// registration of this authority: its store was lost, or restored from a
// backup older than the first registration. Any other answer (an error,
// a pin mismatch) is left to the next registration to report.
func (d *discoveryLink) registrationLost(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, discoveryCallTimeout)
	defer cancel()
	_, err := d.client.LookupAuthority(ctx, &musterv1.LookupAuthorityRequest{AuthorityId: d.s.info.AuthorityID})
	if status.Code(err) != codes.NotFound {
		return false
	}
	d.s.log.Warn("discovery no longer holds this authority's registration (its store lost, or restored from an older backup); registering again",
		"discovery", d.cfg.Address)
	return true
}

// register signs and sends the authority's registration. Its version is
// the registered one when nothing changed (discovery answers that nothing
// did) and one more when something did, so versions only go up and an old
// signed registration can never be replayed over a newer one.
func (d *discoveryLink) register(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, discoveryCallTimeout)
	defer cancel()
	roots := d.s.ca.Roots()
	// Noted before the attempt, so a failure waits registerRetry, not
	// rootsPoll, unless the roots change again.
	d.registered.Store(rootsKey(roots))
	reg := discovery.Registration{
		AuthorityID:          d.s.info.AuthorityID,
		Endpoints:            d.endpoints(),
		Policy:               d.policy,
		PolicyCertificatePEM: string(ca.EncodeCertPEM(d.s.ca.Issuer(ca.RolePolicy).Cert)),
	}
	if len(reg.Endpoints) == 0 {
		return errors.New("no address agents can reach: set --advertise")
	}
	cur, err := d.client.LookupAuthority(ctx, &musterv1.LookupAuthorityRequest{AuthorityId: reg.AuthorityID})
	if err != nil && status.Code(err) != codes.NotFound {
		d.s.metrics.discoveryCall("register", err)
		return err
	}
	if reg.CABundlePEM, err = registrationBundle(d.s.ca.Root, roots, cur.GetCaBundlePem(), time.Now()); err != nil {
		d.s.metrics.discoveryCall("register", err)
		d.s.refusals.Record(ctx, audit.Event{Actor: "authority", Action: "discovery.register", Target: d.cfg.Address,
			Result: audit.ResultError, Reason: err.Error()})
		return err
	}
	switch {
	case cur == nil:
		reg.Version = 1
	case sameRegistration(cur, reg):
		reg.Version = cur.GetVersion()
	default:
		reg.Version = cur.GetVersion() + 1
	}
	resp, err := d.send(ctx, reg)
	if status.Code(err) == codes.FailedPrecondition && reg.Version == cur.GetVersion() {
		// Same endpoints, bundle and policy, yet another document (a new
		// policy signing certificate): a new version.
		reg.Version++
		resp, err = d.send(ctx, reg)
	}
	d.s.metrics.discoveryCall("register", err)
	if err != nil {
		d.s.refusals.Record(ctx, audit.Event{Actor: "authority", Action: "discovery.register", Target: d.cfg.Address,
			Result: audit.ResultError, Reason: err.Error()})
		return err
	}
	if resp.GetChanged() {
		d.s.log.Info("registered with discovery", "discovery", d.cfg.Address, "version", resp.GetVersion(), "endpoints", reg.Endpoints,
			"roots", rootFingerprints(roots.Trusted))
		_ = d.s.recordAudit(ctx, audit.Event{Actor: "authority", Action: "discovery.register",
			Target: d.cfg.Address, Result: audit.ResultOK,
			Reason: fmt.Sprintf("version %d, endpoints %v, roots %v", resp.GetVersion(), reg.Endpoints, rootFingerprints(roots.Trusted))})
	}
	return nil
}

// registrationBundle is the CA bundle the authority registers
// (discovery/roots.go): the root its ID names (the data directory's,
// which issued the policy signing certificate) alone while it is the only
// trusted root; during and after a root rotation, that root, then the
// trusted roots (signing first), then the cross-certificates linking them
// to it. The links come from the rotation in progress and from the bundle
// discovery holds now (registered): a second rotation's record no longer
// has the first one's link from the ID's root, and discovery kept it.
// Only certificates that verify from the ID's root are kept, so nothing
// discovery answered widens what is registered.
func registrationBundle(anchor *x509.Certificate, roots *ca.RootSet, registered string, now time.Time) (string, error) {
	if len(roots.Trusted) == 1 && string(roots.Trusted[0].RawSubjectPublicKeyInfo) == string(anchor.RawSubjectPublicKeyInfo) {
		return string(ca.EncodeCertPEM(anchor)), nil
	}
	candidates := slices.Clone(roots.Cross)
	if prev, err := discovery.ParseRoots(registered); err == nil {
		candidates = append(candidates, prev.Links...)
	}
	links, err := discovery.LinkRoots(anchor, roots.Trusted, candidates, now)
	if err != nil {
		return "", fmt.Errorf("%w (discovery holds no link from an earlier rotation: was the registration forgotten after two root rotations?)", err)
	}
	out := ca.EncodeCertPEM(anchor)
	for _, c := range append(slices.Clone(roots.Trusted), links...) {
		out = append(out, ca.EncodeCertPEM(c)...)
	}
	return string(out), nil
}

// rootsKey identifies a root set: the registration follows it within
// rootsPoll of a change.
func rootsKey(r *ca.RootSet) string {
	return strings.Join(rootFingerprints(r.Trusted), ",")
}

func rootFingerprints(cs []*x509.Certificate) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = ca.Fingerprint(c)
	}
	return out
}

func (d *discoveryLink) send(ctx context.Context, reg discovery.Registration) (*musterv1.RegisterAuthorityResponse, error) {
	var key crypto.Signer = d.s.ca.Issuer(ca.RolePolicy).Key
	_, sig, err := reg.Sign(key)
	if err != nil {
		return nil, err
	}
	return d.client.RegisterAuthority(ctx, &musterv1.RegisterAuthorityRequest{AuthorityId: reg.AuthorityID, Endpoints: reg.Endpoints,
		CaBundlePem: reg.CABundlePEM, PolicyJson: string(reg.Policy), Version: reg.Version,
		PolicyCertificatePem: reg.PolicyCertificatePEM, Signature: sig})
}

// endpoints are the advertised addresses agents can reach; an unspecified
// host ("[::]:7443") names no machine and is left out.
func (d *discoveryLink) endpoints() []string {
	if len(d.cfg.Endpoints) > 0 {
		return d.cfg.Endpoints
	}
	a := d.s.advertise()
	if host, _, err := net.SplitHostPort(a); err != nil || listener.Unspecified(host) {
		return nil
	}
	return []string{a}
}

func sameRegistration(cur *musterv1.LookupAuthorityResponse, reg discovery.Registration) bool {
	return cur.GetCaBundlePem() == reg.CABundlePEM && cur.GetPolicyJson() == string(reg.Policy) &&
		slices.Equal(cur.GetEndpoints(), reg.Endpoints)
}

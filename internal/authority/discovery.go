package authority

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/discovery"
	"github.com/muster-dev/muster/internal/discoveryclient"
	"github.com/muster-dev/muster/internal/referral"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// DiscoveryConfig links the authority to a discovery service: it registers
// there, reports the joins tickets led to, and requires a referral ticket
// with every PSK bootstrap.
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
	reportQueue          = 10000
	reportRetryMax       = time.Minute
	discoveryCallTimeout = 15 * time.Second
)

// discoveryLink is the authority's side of a discovery service.
type discoveryLink struct {
	s       *Server
	cfg     DiscoveryConfig
	conn    *grpc.ClientConn
	client  musterv1.DiscoveryServiceClient
	keys    *referral.KeyCache
	reports chan discovery.JoinReport
	policy  []byte // canonical JSON
}

func newDiscoveryLink(s *Server, cfg DiscoveryConfig) (*discoveryLink, error) {
	if cfg.RegisterEvery <= 0 {
		cfg.RegisterEvery = defaultRegisterEvery
	}
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
		reports: make(chan discovery.JoinReport, reportQueue), policy: policy}
	d.keys = &referral.KeyCache{
		Fetch: func(ctx context.Context) ([]byte, error) {
			ctx, cancel := context.WithTimeout(ctx, discoveryCallTimeout)
			defer cancel()
			return discoveryclient.FetchJWKS(ctx, cfg.Address, cfg.Fingerprint)
		},
		OnRefresh: func(err error) {
			if err != nil {
				s.log.Warn("cannot fetch discovery's ticket keys", "discovery", cfg.Address, "err", err)
			}
		},
	}
	return d, nil
}

// verifier checks tickets against discovery's keys.
func (d *discoveryLink) verifier() *referral.Verifier {
	return &referral.Verifier{Keys: d.keys, Issuer: discoveryclient.Issuer(d.cfg.Address), AuthorityID: d.s.info.AuthorityID, Now: time.Now}
}

// run keeps the JWKS fresh and delivers join reports on every replica (each
// reports its own joins); registration is a leader job.
func (d *discoveryLink) run(ctx context.Context) error {
	defer d.conn.Close()
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return d.keys.Run(ctx) })
	g.Go(func() error { d.deliverReports(ctx); return nil })
	return g.Wait()
}

// report queues a join for discovery's quota. The queue is in memory: a
// report lost to a crash under-counts the quota, never over-counts it.
func (d *discoveryLink) report(r discovery.JoinReport) {
	select {
	case d.reports <- r:
	default:
		d.s.log.Error("join report queue full: discovery's quota will not count this join", "node", r.NodeID, "instance", r.InstanceID)
	}
}

func (d *discoveryLink) deliverReports(ctx context.Context) {
	for {
		var r discovery.JoinReport
		select {
		case <-ctx.Done():
			return
		case r = <-d.reports:
		}
		for wait := time.Second; ; wait = min(2*wait, reportRetryMax) {
			err := d.sendReport(ctx, r)
			d.s.metrics.discoveryCall("report", err)
			if err == nil || ctx.Err() != nil {
				break
			}
			if c := status.Code(err); c == codes.PermissionDenied || c == codes.InvalidArgument {
				d.s.log.Error("discovery refused a join report", "node", r.NodeID, "instance", r.InstanceID, "err", err)
				break
			}
			d.s.log.Warn("cannot report a join to discovery; retrying", "node", r.NodeID, "in", wait, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
	}
}

func (d *discoveryLink) sendReport(ctx context.Context, r discovery.JoinReport) error {
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
// other's versions.
func (d *discoveryLink) registerLoop(ctx context.Context) error {
	for {
		wait := d.cfg.RegisterEvery
		if err := d.register(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			d.s.log.Error("cannot register with discovery; retrying", "discovery", d.cfg.Address, "in", registerRetry, "err", err)
			wait = registerRetry
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// register signs and sends the authority's registration. Its version is
// the registered one when nothing changed (discovery answers that nothing
// did) and one more when something did, so versions only go up and an old
// signed registration can never be replayed over a newer one.
func (d *discoveryLink) register(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, discoveryCallTimeout)
	defer cancel()
	reg := discovery.Registration{
		AuthorityID:          d.s.info.AuthorityID,
		Endpoints:            d.endpoints(),
		CABundlePEM:          string(ca.EncodeCertPEM(d.s.ca.Root)),
		Policy:               d.policy,
		PolicyCertificatePEM: string(ca.EncodeCertPEM(d.s.ca.Issuer(ca.RolePolicy).Cert)),
	}
	if len(reg.Endpoints) == 0 {
		return errors.New("no address agents can reach: set --advertise")
	}
	cur, err := d.client.LookupAuthority(ctx, &musterv1.LookupAuthorityRequest{AuthorityId: reg.AuthorityID})
	switch {
	case status.Code(err) == codes.NotFound:
		reg.Version = 1
	case err != nil:
		d.s.metrics.discoveryCall("register", err)
		return err
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
		d.s.log.Info("registered with discovery", "discovery", d.cfg.Address, "version", resp.GetVersion(), "endpoints", reg.Endpoints)
		if _, err := d.s.audit.Record(context.WithoutCancel(ctx), audit.Event{Actor: "authority", Action: "discovery.register",
			Target: d.cfg.Address, Result: audit.ResultOK,
			Reason: fmt.Sprintf("version %d, endpoints %v", resp.GetVersion(), reg.Endpoints)}); err != nil {
			d.s.log.Error("audit write failed", "action", "discovery.register", "err", err)
		}
	}
	return nil
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
	var out []string
	for _, a := range []string{d.s.advertise()} {
		host, _, err := net.SplitHostPort(a)
		if ip := net.ParseIP(host); err != nil || host == "" || ip != nil && ip.IsUnspecified() {
			continue
		}
		out = append(out, a)
	}
	return out
}

func sameRegistration(cur *musterv1.LookupAuthorityResponse, reg discovery.Registration) bool {
	if cur.GetCaBundlePem() != reg.CABundlePEM || cur.GetPolicyJson() != string(reg.Policy) || len(cur.GetEndpoints()) != len(reg.Endpoints) {
		return false
	}
	for i, e := range cur.GetEndpoints() {
		if e != reg.Endpoints[i] {
			return false
		}
	}
	return true
}

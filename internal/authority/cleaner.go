package authority

import (
	"context"
	"fmt"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/store"
)

// Expired tokens are kept for a day so an operator can still see why a
// join failed, then deleted (as kubeadm's token cleaner does). Their audit
// trail stays.
const (
	tokenRetention     = 24 * time.Hour
	tokenCleanInterval = 10 * time.Minute
)

// leader is a store that elects one replica to run a background job
// (PostgreSQL, by advisory lock). A store without it belongs to one
// process, which runs every job.
type leader interface {
	RunAsLeader(ctx context.Context, job string, fn func(context.Context) error) error
}

// lead runs fn while this replica leads job.
func (s *Server) lead(ctx context.Context, job string, fn func(context.Context) error) error {
	l, ok := s.store.(leader)
	if !ok {
		return fn(ctx)
	}
	return l.RunAsLeader(ctx, job, func(ctx context.Context) error {
		s.log.Info("leading background jobs", "job", job)
		defer s.log.Info("no longer leading background jobs", "job", job)
		return fn(ctx)
	})
}

// backgroundJobs are the periodic jobs one replica runs for all: audit
// checkpoints, the token cleaner and, with a discovery service,
// registration and the delivery of join reports.
func (s *Server) backgroundJobs(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.audit.Run(gctx) })
	g.Go(func() error { return s.cleanTokens(gctx) })
	g.Go(func() error { return s.signerClock(gctx) })
	g.Go(func() error { return s.caClock(gctx) })
	if s.discovery != nil {
		g.Go(func() error { return s.discovery.registerLoop(gctx) })
		g.Go(func() error { return s.discovery.reportLoop(gctx) })
	}
	return g.Wait()
}

func (s *Server) cleanTokens(ctx context.Context) error {
	t := time.NewTicker(tokenCleanInterval)
	defer t.Stop()
	for {
		s.cleanTokensOnce(ctx)
		s.expireGracePSKs(ctx)
		s.cleanTicketUses(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// cleanTokensOnce deletes the tokens expired more than tokenRetention ago,
// with their token.cleanup record in the same transaction: tokens whose
// record cannot be written stay (expired, they admit no one) until the
// next pass.
func (s *Server) cleanTokensOnce(ctx context.Context) {
	var link *audit.Link
	ids, err := s.store.DeleteExpiredTokens(ctx, tokenRetention, func(ids []string) func(store.AuditHead) (store.AuditRecord, error) {
		link = newLink(s.audit, audit.Event{Actor: "authority", Action: "token.cleanup",
			Target: strings.Join(ids, ","), Result: audit.ResultOK,
			Reason: fmt.Sprintf("%d tokens expired more than %s ago", len(ids), tokenRetention)})
		return link.Build
	})
	if err != nil {
		if ctx.Err() == nil && !s.outage.fail(err) {
			s.log.Error("token cleaner failed: expired tokens are deleted with their token.cleanup record or not at all", "err", err)
		}
		return
	}
	if len(ids) == 0 {
		return
	}
	s.audit.Appended(link)
	s.log.Info("deleted expired tokens", "count", len(ids))
}

// cleanTicketUses drops the records of referral tickets past expiry and
// clock-skew allowance: a copy of one would be refused as expired anyway.
func (s *Server) cleanTicketUses(ctx context.Context) {
	if n, err := s.store.DeleteTicketUses(ctx); err != nil && ctx.Err() == nil {
		if !s.outage.fail(err) {
			s.log.Error("ticket use cleaner failed", "err", err)
		}
	} else if n > 0 {
		s.log.Debug("dropped expired referral ticket uses", "count", n)
	}
}

package authority

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/muster-dev/muster/internal/audit"
)

// Expired tokens are kept for a day so an operator can still see why a
// join failed, then deleted (as kubeadm's token cleaner does). Their audit
// trail stays.
const (
	tokenRetention     = 24 * time.Hour
	tokenCleanInterval = 10 * time.Minute
)

func (s *Server) cleanTokens(ctx context.Context) error {
	t := time.NewTicker(tokenCleanInterval)
	defer t.Stop()
	for {
		s.cleanTokensOnce(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (s *Server) cleanTokensOnce(ctx context.Context) {
	ids, err := s.store.DeleteExpiredTokens(ctx, tokenRetention)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("token cleaner failed", "err", err)
		}
		return
	}
	if len(ids) == 0 {
		return
	}
	s.log.Info("deleted expired tokens", "count", len(ids))
	if _, err := s.audit.Record(context.WithoutCancel(ctx), audit.Event{Actor: "authority", Action: "token.cleanup",
		Target: strings.Join(ids, ","), Result: audit.ResultOK,
		Reason: fmt.Sprintf("%d tokens expired more than %s ago", len(ids), tokenRetention)}); err != nil {
		s.log.Error("audit write failed", "action", "token.cleanup", "err", err)
	}
}

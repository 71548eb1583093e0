// Package metricsmux is the plain-HTTP handler the authority and discovery
// serve on their metrics listener: /metrics (Prometheus), /healthz (the
// process answers) and /readyz (its store answers).
package metricsmux

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Reason is a ready error whose text /readyz may show (others are
// answered "store unavailable", their text kept from the network).
type Reason string

func (r Reason) Error() string { return string(r) }

// readyTimeout bounds the store check of /readyz.
const readyTimeout = 2 * time.Second

// New returns the handler of reg's metrics, with /readyz answering 503
// while ready fails.
func New(reg *prometheus.Registry, ready func(ctx context.Context) error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		if err := ready(ctx); err != nil {
			msg := "store unavailable"
			var r Reason
			if errors.As(err, &r) {
				msg = string(r)
			}
			http.Error(w, msg, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

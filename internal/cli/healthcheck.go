package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/spf13/cobra"
)

// newHealthcheckCmd probes an HTTP health endpoint, for container images
// that ship no curl or wget: the exit code is the verdict.
func newHealthcheckCmd(env *Env) *cobra.Command {
	var (
		target  string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "healthcheck --url URL",
		Short: "Exit 0 if an HTTP health endpoint answers 2xx, 1 otherwise",
		Long: `healthcheck sends one GET to URL (a /healthz or /readyz of the authority,
discovery or agent metrics listener) and exits 0 on a 2xx answer. It is
for container health checks in images that have no curl.`,
		Example: `  muster healthcheck --url http://127.0.0.1:7444/readyz
  muster healthcheck --url http://127.0.0.1:9100/healthz --timeout 2s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if target == "" {
				target = env.Getenv("MUSTER_HEALTHCHECK_URL")
			}
			if target == "" {
				return fmt.Errorf("healthcheck: --url is required")
			}
			u, err := url.Parse(target)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return fmt.Errorf("healthcheck: --url %q: want http://HOST:PORT/PATH", target)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
			if err != nil {
				return fmt.Errorf("healthcheck: %w", err)
			}
			// No redirects: a probe answers for the address it was given.
			client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
			resp, err := client.Do(req)
			if err != nil {
				return fmt.Errorf("healthcheck: %s: %w", u.Redacted(), err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			if resp.StatusCode/100 != 2 {
				return fmt.Errorf("healthcheck: %s answered %s: %s", u.Redacted(), resp.Status, oneLine(string(body)))
			}
			fmt.Fprintf(env.Stdout, "%s: %s\n", u.Redacted(), oneLine(string(body)))
			return nil
		},
	}
	cmd.Flags().StringVar(&target, "url", "", "URL to GET, e.g. http://127.0.0.1:7444/readyz (env MUSTER_HEALTHCHECK_URL)")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "how long to wait for the answer")
	return cmd
}

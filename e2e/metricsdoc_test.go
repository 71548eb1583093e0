package e2e

import (
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// docMetric is a metric docs/operator-guide.md names in one of its
// tables, with the label names it gives.
type docMetric struct {
	labels []string
}

var (
	docCode      = regexp.MustCompile("`([^`]*)`")
	docMetricRef = regexp.MustCompile(`^(muster_[a-z0-9_]+)(?:\{([a-z_,]*)\})?$`)
	parenthesis  = regexp.MustCompile(`\([^)]*\)`)
	promSample   = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? `)
	promLabel    = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"`)
	promTypeLine = regexp.MustCompile(`^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) ([a-z]+)$`)
	promQLName   = regexp.MustCompile(`muster_[a-z0-9_]+(\{[^}]*\})?`)
)

// documentedMetrics reads the metric tables of the operator guide: a row
// whose first cell names metrics (`muster_x`, or `muster_x{label}`) and,
// in a table whose second column is "labels", the label names in
// backquotes outside parentheses ("—" for none).
func documentedMetrics(t *testing.T) map[string]docMetric {
	t.Helper()
	guide, err := os.ReadFile("../docs/operator-guide.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]docMetric{}
	labelsColumn := false
	for _, line := range strings.Split(string(guide), "\n") {
		if !strings.HasPrefix(line, "|") {
			labelsColumn = false
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if len(cells) >= 2 && cells[0] == "metric" {
			labelsColumn = cells[1] == "labels"
			continue
		}
		var names []string
		var inline []string
		for _, m := range docCode.FindAllStringSubmatch(cells[0], -1) {
			ref := docMetricRef.FindStringSubmatch(m[1])
			if ref == nil {
				continue
			}
			names = append(names, ref[1])
			if ref[2] != "" {
				inline = strings.Split(ref[2], ",")
			}
		}
		if len(names) == 0 {
			continue
		}
		labels := inline
		if labelsColumn && len(cells) >= 2 {
			labels = nil
			for _, m := range docCode.FindAllStringSubmatch(parenthesis.ReplaceAllString(cells[1], ""), -1) {
				labels = append(labels, m[1])
			}
		}
		sort.Strings(labels)
		for _, n := range names {
			if prev, ok := out[n]; ok && !slices.Equal(prev.labels, labels) {
				t.Errorf("docs/operator-guide.md gives %s the labels %v in one table and %v in another", n, prev.labels, labels)
			}
			out[n] = docMetric{labels: labels}
		}
	}
	if len(out) < 20 {
		t.Fatalf("read only %d metrics from docs/operator-guide.md's tables: %v", len(out), out)
	}
	return out
}

// scrapedMetrics is each muster_ metric family of a /metrics page with
// its label names (a histogram's by its family name, without "le").
func scrapedMetrics(page string) map[string][]string {
	histograms := map[string]bool{}
	out := map[string][]string{}
	for _, line := range strings.Split(page, "\n") {
		if m := promTypeLine.FindStringSubmatch(line); m != nil && m[2] == "histogram" {
			histograms[m[1]] = true
		}
		m := promSample.FindStringSubmatch(line)
		if m == nil || !strings.HasPrefix(m[1], "muster_") {
			continue
		}
		name := m[1]
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && histograms[base] {
				name = base
			}
		}
		var labels []string
		for _, l := range promLabel.FindAllStringSubmatch(m[2], -1) {
			if l[1] != "le" {
				labels = append(labels, l[1])
			}
		}
		sort.Strings(labels)
		out[name] = labels
	}
	return out
}

// TestDocumentedMetrics: every metric the operator guide's tables name is
// served by a running authority or agent with the labels the guide gives,
// every muster_ metric they serve is in those tables, and every PromQL
// expression the docs give to alert on names documented metrics and
// labels. Metrics that only a setting or an event this test does not
// make brings are listed in absent, with why.
func TestDocumentedMetrics(t *testing.T) {
	t.Parallel()
	docs := documentedMetrics(t)
	crl := freePort(t)
	dir, init := initDir(t)
	e := &agentEnv{dir: dir, auth: startAuthority(t, dir, "--crl-listen", crl, "--crl-url", "http://"+crl)}
	e.authorityID, _ = init["authority_id"].(string)
	e.fingerprint, _ = init["ca_fingerprint"].(string)

	// A token join by a running agent, whose metrics are read too; a PSK
	// join and a renewal, so that their counters have series.
	tok := e.createToken(t)
	agent, _ := startProcEnv(t, "agent", "agent started", []string{"MUSTER_JOIN_URI=" + tok.URI, "MUSTER_NODE_ID=metered"},
		"agent", "run", "--data", filepath.Join(t.TempDir(), "agent"), "--metrics-listen", "127.0.0.1:0", "--log-format", "json")
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + agent.metrics + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent was not ready within 60 s:\n%s", agent.Logs())
		}
		time.Sleep(200 * time.Millisecond)
	}
	pdir := filepath.Join(t.TempDir(), "psk")
	if r := pskJoin(t, e, pdir, "psk-node", init["bootstrap_psk"].(string), e.fingerprint); r.code != 0 {
		t.Fatalf("psk join: %s", r.stderr)
	}
	mustRun(t, "agent", "renew", "--data", pdir)

	served := scrapedMetrics(metricsOf(t, e.auth.metrics))
	for name, labels := range scrapedMetrics(metricsOf(t, agent.metrics)) {
		served[name] = labels
	}
	// Documented, and absent here for a reason.
	absent := map[string]string{
		"muster_ca_key_available":                   "keys in a PKCS#11 token only",
		"muster_bound_keypair_recoveries_remaining": "a standard-mode bound-keypair token only",
		"muster_referral_tickets_total":             "joins through discovery only",
		"muster_discovery_calls_total":              "an authority registered with discovery only",
		"muster_connections_refused_total":          "a refused connection only",
		"muster_task_verification_failures_total":   "a task an agent refused only",
		"muster_agent_task_refusals_total":          "a task the agent refused only",
		"muster_agent_verifier_set_refusals_total":  "a verifier set the agent refused only",
		"muster_agent_workload_api_streams":         "the agent's --workload-api only",
		"muster_agent_workload_api_refusals_total":  "a refused Workload API caller only",
		"muster_verifier_set_agent_ahead_version":   "an agent ahead of the store's verifier set only",
		"muster_agent_stream_reconnects_total":      "a stream that reconnected only",
		"muster_agent_renewals_total":               "a renewal by agent run only (this one was by agent renew)",
		"muster_discovery_reports_pending":          "served; listed in case a scrape races the leader's first poll",
		"muster_change_watch_lost_total":            "served; listed in case a scrape races the store's listener",
		"muster_verifier_set_agent_ahead_total":     "served; listed in case a scrape races the first verifier set",
		"muster_verifier_set_advance_limited_total": "served; listed in case a scrape races the first verifier set",
		"muster_agent_heartbeats_total":             "served; listed in case a scrape races the first heartbeat",
		"muster_agent_certificates":                 "served; listed in case a scrape races the replica's first count",
	}
	for name, d := range docs {
		got, ok := served[name]
		if !ok {
			if _, why := absent[name]; !why {
				t.Errorf("docs/operator-guide.md names %s, which neither the authority nor the agent serves", name)
			}
			continue
		}
		if !slices.Equal(got, d.labels) {
			t.Errorf("%s is served with the labels %v; docs/operator-guide.md says %v", name, got, d.labels)
		}
	}
	for name := range served {
		if _, ok := docs[name]; !ok {
			t.Errorf("%s is served but is in no metric table of docs/operator-guide.md", name)
		}
	}

	// Every expression the docs give to alert on (a backquoted span with a
	// muster_ metric and a comparison or a function of time) and every
	// expr: of a rules file in them.
	files, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	exprs := 0
	// An alert the docs give in two places is the same rule in both.
	type rule struct{ file, expr string }
	alerts := map[string]rule{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var candidates []string
		fenced := false
		alert := ""
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				fenced, alert = !fenced, ""
				continue
			}
			if !fenced {
				for _, m := range docCode.FindAllStringSubmatch(line, -1) {
					candidates = append(candidates, m[1])
				}
			} else if _, name, ok := strings.Cut(line, "- alert: "); ok {
				alert = strings.Fields(name)[0]
			} else if _, expr, ok := strings.Cut(line, "expr: "); ok {
				candidates = append(candidates, expr)
				if alert != "" {
					here := rule{filepath.Base(f), strings.TrimSpace(expr)}
					if other, ok := alerts[alert]; ok && other.expr != here.expr {
						t.Errorf("the alert %s is %q in %s and %q in %s: one rule, two meanings", alert, other.expr, other.file, here.expr, here.file)
					}
					alerts[alert] = here
				}
			}
		}
		for _, c := range candidates {
			if !strings.Contains(c, "muster_") || !strings.ContainsAny(c, "<>=(") {
				continue
			}
			exprs++
			for _, at := range promQLName.FindAllStringSubmatchIndex(c, -1) {
				if at[0] > 0 && c[at[0]-1] == '\'' {
					continue // a string, such as the channel of pg_notify('muster_changes', …)
				}
				ref := []string{c[at[0]:at[1]], ""}
				if at[2] >= 0 {
					ref[1] = c[at[2]:at[3]]
				}
				name := strings.TrimSuffix(ref[0], ref[1])
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if base, ok := strings.CutSuffix(name, suffix); ok {
						if _, hist := docs[base]; hist {
							name = base
						}
					}
				}
				d, ok := docs[name]
				if !ok {
					t.Errorf("%s: the alert expression %q names %s, which is in no metric table of docs/operator-guide.md", filepath.Base(f), c, name)
					continue
				}
				for _, l := range promLabel.FindAllStringSubmatch(strings.NewReplacer("!=", "=", "=~", "=", "!~", "=").Replace(ref[1]), -1) {
					if !slices.Contains(d.labels, l[1]) {
						t.Errorf("%s: the alert expression %q matches the label %s, which %s does not have (%v)", filepath.Base(f), c, l[1], name, d.labels)
					}
				}
			}
		}
	}
	if exprs < 5 {
		t.Fatalf("found only %d alert expressions in docs/", exprs)
	}
}

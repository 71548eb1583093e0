package discoveryd

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/store"
)

// Replicas sharing a store must share the ticket issuer
// ("https://ADVERTISE"): an authority accepts the tickets of the one its
// discovery.address names, and refuses every PSK join through a replica
// that signs under another. A replica cannot ask the others which issuer
// they run with, but each records it at start and stop (discovery.start
// and discovery.stop, the issuer as target), so at start it warns of any
// other issuer started and not stopped since. Only a warning: a replica
// that crashed records no stop, and an operator moving discovery to a new
// name starts the new replicas before stopping the old ones.
const (
	// issuerLookBack bounds the start records read.
	issuerLookBack = 30 * 24 * time.Hour
	// issuerRecordsMax bounds the records read (a start and a stop per
	// restart: years of daily restarts of several replicas).
	issuerRecordsMax = 10000
)

// runningIssuers returns the issuers other than issuer that replicas
// sharing st recorded starting under, within issuerLookBack, more often
// than stopping, sorted.
func runningIssuers(ctx context.Context, st store.Store, issuer string) ([]string, error) {
	now, err := st.Now(ctx)
	if err != nil {
		return nil, err
	}
	running := map[string]int{}
	f := store.AuditFilter{Since: now.Add(-issuerLookBack), Action: "discovery.*", Limit: 1000}
	for read := 0; read < issuerRecordsMax; {
		recs, err := st.ListAudit(ctx, f)
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			switch r.Action {
			case "discovery.start":
				running[r.Target]++
			case "discovery.stop":
				running[r.Target] = max(running[r.Target]-1, 0)
			}
		}
		if len(recs) < f.Limit {
			break
		}
		read += len(recs)
		f.AfterSeq = recs[len(recs)-1].Seq
	}
	var others []string
	for iss, n := range running {
		if n > 0 && iss != issuer {
			others = append(others, iss)
		}
	}
	slices.Sort(others)
	return others, nil
}

// otherIssuersWarning is the warning of a replica starting under issuer
// while others recorded starting under others; dir is its data directory.
func otherIssuersWarning(issuer string, others []string, dir Dir) string {
	return fmt.Sprintf("discovery replicas sharing this store started under the ticket issuer %s, not %s, and recorded no stop since: "+
		"an authority accepts the tickets of the issuer its discovery.address names only, and refuses every PSK join through replicas under another; "+
		"start every replica with the same --advertise (or advertise: in the shared discovery.yaml); "+
		"muster discovery audit list --data %s --action 'discovery.*' shows each start and stop with its issuer "+
		"(a replica that crashed recorded no stop: then nothing may run under that issuer, and this warning goes on for 30 days after that start)",
		strings.Join(others, ", "), issuer, shellword.Quote(string(dir)))
}

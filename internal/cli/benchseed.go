package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/loadgen"
	"github.com/muster-dev/muster/internal/seal"
)

func newBenchSeedCmd(env *Env) *cobra.Command {
	var out output
	var dir, storeURL string
	var tokens, nodes, batch int
	var certTTL, tokenTTL time.Duration
	var labels []string
	cmd := &cobra.Command{
		Use:   "seed --data DIR --tokens N --nodes N",
		Short: "Fill a stopped authority's store with tokens and joined nodes, fast, to measure it at scale",
		Long: `Fill the store of a stopped authority with join tokens and joined nodes, in
batched transactions (prepared statements on SQLite, COPY on PostgreSQL), so
that muster bench can measure joins, renewals and streams against a store of
a fleet's size.

The rows are those the authority writes: token secrets sealed with the
storage key, --nodes of the tokens spent by a join each, every node with its
current instance and a certificate signed by the authority's agent CA
(64 keys shared among the nodes). No audit record is written per row; two
bench.seed records, appended to the audit chain as every write's are, name
the run: one before the first row (what it is to write), one at the end
(how many tokens and nodes were written, and with which labels; result
error if it stopped part-way). "muster audit verify" still passes. Nodes are named seed-RUNID-NNNNNNN; the tokens are single-use, valid
for --token-ttl, described "muster bench seed", labelled with --label (a
fleet for "muster task send --label KEY=VALUE").

The authority must be stopped (the data directory's lock is taken). Seed a
test authority only: the nodes and tokens stay.`,
		Example: `  muster bench seed --data ./bench-data --tokens 1000000 --nodes 100000
  muster bench seed --data ./bench-data --tokens 5000 --nodes 5000 --label pool=gpu
  muster bench seed --data ./bench-data --store postgres://muster@db/muster --tokens 1000 --nodes 100 -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			switch {
			case dir == "":
				return errors.New("bench seed: give --data DIR")
			case tokens < 0 || nodes < 0 || batch < 1:
				return errors.New("bench seed: --tokens and --nodes must not be negative, --batch at least 1")
			case nodes > tokens:
				return fmt.Errorf("bench seed: %d nodes need as many tokens, not %d (each node is joined with its own)", nodes, tokens)
			}
			lm, err := parsePairs("label", labels)
			if err != nil {
				return fmt.Errorf("bench seed: %w", err)
			}
			ctx := cmd.Context()
			d := datadir.Dir(dir)
			dd, err := loadDataDir(d, storeURL)
			if err != nil {
				return fmt.Errorf("bench seed: %w", err)
			}
			info, h, url := dd.info, dd.ca, dd.url
			sealer, err := dd.sk.Sealer(seal.InfoToken)
			if err != nil {
				return fmt.Errorf("bench seed: %w", err)
			}
			log, err := newLogger(env.Stderr, "", "info")
			if err != nil {
				return fmt.Errorf("bench seed: %w", err)
			}
			ml := &migrationLog{log: log, then: "the seed begins once it is done"}
			dd.migrating = ml.migrating
			st, logger, closeStore, err := openAuthorityStore(ctx, d, "", dd, 0, nil, nil)
			ml.done()
			if errors.Is(err, datadir.ErrLocked) {
				return fmt.Errorf("bench seed: stop the authority first: %w", err)
			} else if err != nil {
				return fmt.Errorf("bench seed: %w", err)
			}
			defer closeStore()
			loader, ok := st.(loadgen.SeedLoader)
			if !ok {
				return fmt.Errorf("bench seed: the store at %s has no bulk loader", storeURLWithoutPassword(url))
			}
			const actor = "muster bench seed"
			// The seed is audited before its first row and after its
			// last: each batch commits on its own, so a seed stopped
			// part-way (an error, ^C, a kill) keeps what it wrote, and
			// the first record says a seed of this run began.
			started := false
			begin := func(run string) error {
				if _, err := logger.Record(ctx, audit.Event{Actor: actor, Action: "bench.seed", Target: run, Result: audit.ResultOK,
					Reason: "started, to write " + seedRows(tokens, nodes, lm) + "; a second bench.seed record says what was written"}); err != nil {
					return err
				}
				started = true
				return nil
			}
			res, err := loadgen.Seed(ctx, loader, loadgen.SeedConfig{Tokens: tokens, Nodes: nodes, Batch: batch, CA: h,
				TrustDomain: info.TrustDomain, Sealer: sealer, CertTTL: certTTL, TokenTTL: tokenTTL, Labels: lm, Actor: actor, Progress: env.Stderr,
				Started: begin})
			if err != nil {
				// Rows written before the failure stay, and the chain
				// says so.
				if started {
					if _, aerr := logger.Record(context.WithoutCancel(ctx), audit.Event{Actor: actor, Action: "bench.seed", Target: res.Run,
						Result: audit.ResultError, Reason: fmt.Sprintf("stopped after %s: %v", seedRows(res.Tokens, res.Nodes, lm), err)}); aerr != nil {
						err = errors.Join(err, aerr)
					}
				}
				return fmt.Errorf("bench seed: %w", err)
			}
			if _, err := logger.Record(ctx, audit.Event{Actor: actor, Action: "bench.seed", Target: res.Run, Result: audit.ResultOK,
				Reason: seedRows(res.Tokens, res.Nodes, lm)}); err != nil {
				return fmt.Errorf("bench seed: %w", err)
			}
			if out.structured() {
				return out.write(env.Stdout, res)
			}
			fmt.Fprintf(env.Stdout, "Seeded %d tokens and %d nodes (%s-*) in %s (%.0f tokens/s).\n", res.Tokens, res.Nodes, res.Run,
				res.Elapsed.Round(100*time.Millisecond), float64(res.Tokens)/res.Elapsed.Seconds())
			return nil
		},
	}
	out.register(cmd)
	f := cmd.Flags()
	f.StringVar(&dir, "data", "", "the authority's data directory (the authority stopped)")
	f.StringVar(&storeURL, "store", "", "the store, when the data directory's authority uses PostgreSQL (as authority --store)")
	f.IntVar(&tokens, "tokens", 0, "join tokens to create in all")
	f.IntVar(&nodes, "nodes", 0, "nodes to join, each with one of the tokens")
	f.IntVar(&batch, "batch", 10000, "tokens (and nodes) written per transaction")
	f.DurationVar(&certTTL, "agent-cert-ttl", defaultAgentCertTTL, "lifetime of the seeded nodes' certificates")
	f.DurationVar(&tokenTTL, "token-ttl", 30*24*time.Hour, "lifetime of the seeded tokens")
	f.StringArrayVar(&labels, "label", nil, "a label k=v every seeded token carries, for task send --label (repeatable)")
	return cmd
}

// seedRows says, for a bench.seed audit record, what a seed writes or
// wrote: how many tokens and joined nodes, and the labels every token
// carries, which is how a seeded fleet is selected (task send --label).
func seedRows(tokens, nodes int, labels map[string]string) string {
	s := fmt.Sprintf("%d tokens, %d nodes joined with %d of them (fixture rows, no record each)", tokens, nodes, nodes)
	if len(labels) == 0 {
		return s
	}
	pairs := make([]string, 0, len(labels))
	for k, v := range labels {
		pairs = append(pairs, k+"="+v)
	}
	slices.Sort(pairs)
	return s + ", every token labelled " + strings.Join(pairs, ",")
}

package authority

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

type discardSignerAudit struct{}

func (discardSignerAudit) Record(context.Context, audit.Event) (store.AuditRecord, error) {
	return store.AuditRecord{}, nil
}

func (discardSignerAudit) Builder(e audit.Event) (*audit.Link, error) { return testLink(e), nil }

func (discardSignerAudit) Appended(*audit.Link) {}

// TestEnsureSignerWarnsOfAnotherLeadTime checks that a replica starting
// with a signer.min_lead_time other than the one the current verifier set
// carries (signed by a replica running with it) says so at start, naming
// both values and the docs section: agents would refuse rotate tasks
// staged through one of the two.
func TestEnsureSignerWarnsOfAnotherLeadTime(t *testing.T) {
	for name, tc := range map[string]struct {
		lead time.Duration
		warn bool
	}{
		"same":                {30 * time.Minute, false},
		"other":               {10 * time.Minute, true},
		"default, set at 30m": {0, true},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			custody, _ := signer.NewSealed(seal.StorageKey{9})
			// Another replica, running with 30m, made and signed the set.
			other := signer.NewKeeper(st, custody, discardSignerAudit{}, "prod-a3f2e1", 30*time.Minute)
			if _, err := other.EnsureFirst(ctx, signer.Actor{Name: "other"}); err != nil {
				t.Fatal(err)
			}
			if _, err := other.VerifierSet(ctx); err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			s := &Server{signers: signer.NewKeeper(st, custody, discardSignerAudit{}, "prod-a3f2e1", tc.lead), log: slog.New(slog.NewTextHandler(&buf, nil))}
			if err := s.ensureSigner(ctx); err != nil {
				t.Fatal(err)
			}
			warned := strings.Contains(buf.String(), "level=WARN")
			if warned != tc.warn {
				t.Fatalf("warned %v, want %v:\n%s", warned, tc.warn, buf.String())
			}
			if tc.warn {
				for _, want := range []string{"verifier_set_min_lead_time=30m0s", "signer_min_lead_time=" + signer.MinLeadTimeFor(tc.lead).String(), "Settings kept in the store"} {
					if !strings.Contains(buf.String(), want) {
						t.Errorf("the warning does not say %s:\n%s", want, buf.String())
					}
				}
			}
		})
	}
}

// TestFirstSetCarriesTheAuthorityLeadTime: the first signer, made by
// muster init (which reads no authority.yaml: the default lead time), has
// its verifier set signed at the authority's first start with the
// authority's signer.min_lead_time, so agents get that from their first
// join and the start does not warn. Init used to sign it with 10m: every
// authority configured otherwise warned at its first start, and agents
// applied 10m until the first signer step.
func TestFirstSetCarriesTheAuthorityLeadTime(t *testing.T) {
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	custody, _ := signer.NewSealed(seal.StorageKey{9})
	// What muster init does (datadir.Init).
	if _, err := signer.NewKeeper(st, custody, discardSignerAudit{}, "prod-a3f2e1", 0).EnsureFirst(ctx, signer.Actor{Name: "muster init"}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	s := &Server{signers: signer.NewKeeper(st, custody, discardSignerAudit{}, "prod-a3f2e1", 2*time.Minute), log: slog.New(slog.NewTextHandler(&buf, nil))}
	if err := s.ensureSigner(ctx); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "level=WARN") {
		t.Errorf("the first start after init warned:\n%s", buf.String())
	}
	raw, err := s.signers.VerifierSet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	set, err := signer.ParseVerifierSet(raw)
	if err != nil || set.Version != 1 || set.MinLeadTime() != 2*time.Minute {
		t.Fatalf("first verifier set: version %d, lead time %s (%v); want version 1 with the authority's 2m", set.Version, set.MinLeadTime(), err)
	}
}

package authority

import (
	"crypto/x509"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// TestCALifecycleModel: intermediate rotation driven by a stepped clock
// (the leader's caStepAt at a virtual now, seconds to minutes apart with a
// 3-minute ca.intermediate_ttl, so prepare, activate and retire all
// happen) interleaved with root rotate, next-phase and rollback, random
// with a fixed seed (MUSTER_MODEL_SEED tries another). After every step:
// each role has exactly one active intermediate, signed by a root the
// bundle trusts; every non-retired intermediate is in the published
// bundle; an intermediate prepared during the run was published the
// publish window before it was activated; the bundle trusts at least one
// root. On failure the step sequence is printed for replay.
//
// Not yet covered (see the report of branch camodel): simulated agents
// renewing through the renewal path, offline agents, restarts.
func TestCALifecycleModel(t *testing.T) {
	t.Parallel()
	seed := uint64(21)
	if v := os.Getenv("MUSTER_MODEL_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seed = n
	}
	a := startReplicas(t, nil, 1, func(c *Config) { c.CAIntermediateTTL = 3 * time.Minute })
	s := a.srvs[0]
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(seed, 7))
	var skew time.Duration
	var steps []string
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d, steps:\n  %s\n%s", seed, strings.Join(steps, "\n  "), fmt.Sprintf(format, args...))
	}
	rotations := 0
	// seen is the virtual time each intermediate was first in the store
	// (prepared); the store's own dates are the real clock's.
	seen := map[string]time.Time{}
	wasActive := map[string]bool{}
	for step := range 30 {
		var op string
		switch k := rng.IntN(10); {
		case k < 6:
			d := time.Duration(1+rng.IntN(90)) * time.Second
			skew += d
			op = "advance " + d.String()
		case k < 7:
			op = "root rotate"
			_, _ = s.rotateRoot(ctx, "test", nil)
		case k < 9:
			op = "root next-phase"
			_, _, _ = s.stepRoot(ctx, "test", false)
		default:
			op = "root rollback"
			_, _, _ = s.stepRoot(ctx, "test", true)
		}
		steps = append(steps, fmt.Sprintf("%d %s", step, op))
		now, err := a.store.Now(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if err := s.caStepAt(ctx, now.Add(skew)); err != nil {
				fail("step %d: caStep: %v", step, err)
			}
		}
		// The rows first, then the load: the running leader may step
		// between the two, and the bundle loaded after must hold every
		// row read before it.
		rows, err := a.store.ListCACerts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.inter.load(ctx); err != nil {
			fail("step %d: load: %v", step, err)
		}
		b := s.trustBundle()
		if len(b.set.Roots) == 0 {
			fail("step %d: the bundle trusts no root", step)
		}
		pool := x509.NewCertPool()
		for _, r := range b.set.Roots {
			pool.AddCert(r)
		}
		published := map[string]bool{}
		for _, c := range b.set.Intermediates {
			published[string(c.Raw)] = true
		}
		active := map[string]int{}
		vnow := now.Add(skew)
		for _, r := range rows {
			if _, ok := seen[r.Serial]; !ok {
				seen[r.Serial] = vnow
				if step == 0 {
					seen[r.Serial] = time.Time{}
				}
			}
			if r.State == store.CARetired {
				continue
			}
			if !published[string(r.CertDER)] {
				c, _ := x509.ParseCertificate(r.CertDER)
				var roots []string
				for _, rt := range b.set.Roots {
					roots = append(roots, rt.Subject.String())
				}
				st, _ := s.rootStatus(ctx)
				fail("step %d: %s intermediate %s (%s, issued by %s) is not in the bundle (phase %s, roots %v)", step, r.Role, r.Serial, r.State, c.Issuer, st.Phase, roots)
			}
			if r.State != store.CAActive {
				continue
			}
			active[r.Role]++
			if !wasActive[r.Serial] && !seen[r.Serial].IsZero() {
				wasActive[r.Serial] = true
				rotations++
				// The store dates the preparation by its own clock, which
				// the model's virtual now runs ahead of by skew.
				if d := vnow.Sub(r.CreatedAt); d < s.caPublishWindow() {
					fail("step %d: %s intermediate %s activated %s after it was prepared, less than the publish window", step, r.Role, r.Serial, d)
				}
			}
			c, _ := x509.ParseCertificate(r.CertDER)
			if _, err := c.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: c.NotBefore.Add(time.Second), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
				fail("step %d: the active %s intermediate %s does not chain to a trusted root: %v", step, r.Role, r.Serial, err)
			}
		}
		for _, role := range caRoles {
			if active[string(role)] != 1 {
				fail("step %d: role %s has %d active intermediates", step, role, active[string(role)])
			}
		}
	}
	if rotations == 0 {
		t.Errorf("seed %d: no intermediate was rotated during the run; lengthen it", seed)
	}
}

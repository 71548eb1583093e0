package task

import (
	"crypto/ed25519"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
)

// BenchmarkVerify measures an agent's task verification (decode, structural
// check, canonical form, Ed25519, times, target, replay window) against a
// bare ed25519.Verify of the same canonical bytes, in the same run, and
// reports their ratio: the envelope handling should cost little beside the
// signature (aim: ratio >= 0.8).
func BenchmarkVerify(b *testing.B) {
	f := newFixture(b)
	const n = 4096
	tasks := make([][]byte, n)
	for i := range tasks {
		e := envelope(TypeRenewNow)
		e.TaskID = uuid.NewString()
		e.Params = map[string]string{"reason": fmt.Sprintf("bench %d", i)}
		tasks[i] = f.sign(b, e)
	}
	doc, _ := envelope(TypeRenewNow).Canonical()
	sig := ed25519.Sign(f.privs["v2"], doc)
	pub := f.ring.keys["v2"]

	var bare, full float64
	b.Run("ed25519", func(b *testing.B) {
		for b.Loop() {
			if !ed25519.Verify(pub, doc, sig) {
				b.Fatal("verify")
			}
		}
		bare = float64(b.N) / b.Elapsed().Seconds()
		b.ReportMetric(bare, "verifications/s")
	})
	b.Run("task", func(b *testing.B) {
		v := f.verifier(t0.Add(time.Minute))
		i := 0
		for b.Loop() {
			if i%n == 0 {
				v.Window = NewWindow(nil)
			}
			if _, err := v.Verify(tasks[i%n]); err != nil {
				b.Fatal(err)
			}
			i++
		}
		full = float64(b.N) / b.Elapsed().Seconds()
		b.ReportMetric(full, "verifications/s")
	})
	if bare > 0 && full > 0 {
		b.ReportMetric(full/bare, "ratio")
		fmt.Printf("task verification / bare ed25519.Verify = %.2f (%.0f vs %.0f per second)\n", full/bare, full, bare)
	}
}

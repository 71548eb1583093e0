package agent

import (
	"fmt"
	"testing"
)

// The JWT-SVID cache holds at most jwtCacheSize audience sets, and a
// workload asking for ever new ones makes room by pushing out the set
// asked for least recently, not every token: emptied whole, as it was
// when full, a workload that asks for the same audience all along (kept
// in use between the others) had its token dropped and its next call
// minted again.
func TestJWTSVIDCacheDropsTheLeastRecentlyUsed(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, _ := joined(t, f)
	ask := func(aud string) {
		t.Helper()
		if _, _, err := a.JWTSVID(t.Context(), []string{aud}); err != nil {
			t.Fatalf("audience %s: %v", aud, err)
		}
	}
	ask("db")
	const others = 3 * jwtCacheSize
	for i := range others {
		ask(fmt.Sprint("churn-", i))
		ask("db")
	}
	// One mint for db, one for each other audience set.
	if got, want := f.mints.Load(), int64(1+others); got != want {
		t.Errorf("%d mints, want %d: the token of an audience asked for between each other was dropped %d times", got, want, got-want)
	}
	a.jwts.mu.Lock()
	n := len(a.jwts.toks)
	_, kept := a.jwts.toks["churn-0"]
	a.jwts.mu.Unlock()
	if n > jwtCacheSize {
		t.Errorf("%d tokens kept, want at most %d", n, jwtCacheSize)
	}
	if kept {
		t.Error("the audience set asked for least recently is still kept in a full cache")
	}
}

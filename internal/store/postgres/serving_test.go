package postgres

import (
	"errors"
	"strings"
	"testing"
)

// An offline command that needs every authority stopped is refused while
// one serves, naming its session, and takes the database once none
// does; an authority starting while the command works is refused.
// Several authorities serve at once (the lock is shared).
func TestServingLockKeepsOfflineCommandsOut(t *testing.T) {
	ctx := t.Context()
	s, url := openFresh(t)
	other := openURL(t, url)
	release, err := s.HoldServing(ctx, nil)
	if err != nil {
		t.Fatalf("HoldServing: %v", err)
	}
	release2, err := other.HoldServing(ctx, nil)
	if err != nil {
		t.Fatalf("HoldServing by a second replica: %v", err)
	}
	_, err = ExcludeServing(ctx, url)
	if !errors.Is(err, ErrServing) || strings.Count(err.Error(), "("+servingApp+")") != 2 {
		t.Fatalf("ExcludeServing with two replicas serving: %v, want ErrServing naming both sessions", err)
	}
	release()
	if _, err := ExcludeServing(ctx, url); !errors.Is(err, ErrServing) {
		t.Fatalf("ExcludeServing with one replica serving: %v, want ErrServing", err)
	}
	release2()
	unlock, err := ExcludeServing(ctx, url)
	if err != nil {
		t.Fatalf("ExcludeServing with none serving: %v", err)
	}
	if _, err := s.HoldServing(ctx, nil); !errors.Is(err, ErrExcluded) {
		t.Errorf("HoldServing while an offline command works: %v, want ErrExcluded", err)
	}
	unlock()
	release, err = s.HoldServing(ctx, nil)
	if err != nil {
		t.Fatalf("HoldServing once the command is done: %v", err)
	}
	release()
}

// The single-bigint advisory lock keys are distinct: the serving lock
// first took pskLockKey's, and every PSK rotation then waited for the
// replicas to stop.
func TestAdvisoryLockKeysDistinct(t *testing.T) {
	keys := map[int64]string{}
	for name, k := range map[string]int64{"migrate": migrateLockKey, "audit": auditLockKey, "psk": pskLockKey, "serving": servingLockKey} {
		if other, ok := keys[k]; ok {
			t.Errorf("advisory lock key %#x is both %s's and %s's", k, name, other)
		}
		keys[k] = name
	}
}

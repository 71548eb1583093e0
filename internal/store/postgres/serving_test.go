package postgres

import (
	"context"
	"errors"
	"net"
	neturl "net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
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

// killServing ends the sessions that hold the serving lock, as a database
// restart or a network cut would.
func killServing(t *testing.T, s *Store) {
	t.Helper()
	if _, err := s.pool.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, servingApp); err != nil {
		t.Fatalf("pg_terminate_backend: %v", err)
	}
}

// hear waits for the next report of onLost.
func hear(t *testing.T, lost <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-lost:
		return err
	case <-time.After(time.Minute):
		t.Fatalf("onLost did not hear of %s within a minute", what)
		return nil
	}
}

// A lock whose connection fails is taken again on a new one, and keeps
// offline commands out again; onLost hears of the loss and of the lock
// held again, and of a second loss too.
func TestServingLockHeldAgainAfterItsConnectionFails(t *testing.T) {
	ctx := t.Context()
	s, url := openFresh(t)
	lost := make(chan error, 16)
	release, err := s.HoldServing(ctx, func(err error) { lost <- err })
	if err != nil {
		t.Fatalf("HoldServing: %v", err)
	}
	defer release()
	for round := range 2 {
		killServing(t, s)
		if err := hear(t, lost, "the loss"); err == nil || errors.Is(err, ErrExcluded) {
			t.Fatalf("round %d: onLost(%v), want the connection's failure", round, err)
		}
		if err := hear(t, lost, "the lock held again"); err != nil {
			t.Fatalf("round %d: onLost(%v), want nil (held again)", round, err)
		}
		if _, err := ExcludeServing(ctx, url); !errors.Is(err, ErrServing) {
			t.Fatalf("round %d: ExcludeServing once the lock is held again: %v, want ErrServing", round, err)
		}
	}
}

// An offline command that takes the lock while a replica had lost it is
// reported to that replica as ErrExcluded (it must stop serving), every
// time it happens.
func TestServingLockReportsAnExclusionInTheGap(t *testing.T) {
	ctx := t.Context()
	s, url := openFresh(t)
	lost := make(chan error, 16)
	release, err := s.HoldServing(ctx, func(err error) { lost <- err })
	if err != nil {
		t.Fatalf("HoldServing: %v", err)
	}
	defer release()
	for round := range 2 {
		killServing(t, s)
		var unlock func()
		deadline := time.Now().Add(time.Minute)
		for {
			// The terminated session lets go of the lock once it has
			// exited, which pg_terminate_backend does not wait for.
			if unlock, err = ExcludeServing(ctx, url); err == nil {
				break
			}
			if !errors.Is(err, ErrServing) || time.Now().After(deadline) {
				t.Fatalf("round %d: ExcludeServing after the replica's connection failed: %v", round, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := hear(t, lost, "the loss"); err == nil || errors.Is(err, ErrExcluded) {
			t.Fatalf("round %d: onLost(%v), want the connection's failure", round, err)
		}
		if err := hear(t, lost, "the exclusion"); !errors.Is(err, ErrExcluded) {
			t.Fatalf("round %d: onLost(%v), want ErrExcluded", round, err)
		}
		unlock()
		if err := hear(t, lost, "the lock held again"); err != nil {
			t.Fatalf("round %d: onLost(%v), want nil (held again)", round, err)
		}
	}
}

// The command holding the lock exclusively hears, through the context
// ExcludeServingWatched returns, that its connection failed (the database
// then let go of the lock, and a replica may serve): it once went on
// writing, unaware, under a replica that started meanwhile.
func TestExclusiveServingLockLossIsNoticed(t *testing.T) {
	ctx := t.Context()
	s, url := openFresh(t)
	watched, release, err := ExcludeServingWatched(ctx, url)
	if err != nil {
		t.Fatalf("ExcludeServingWatched: %v", err)
	}
	defer release()
	if _, err := s.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`, excludingApp); err != nil {
		t.Fatalf("pg_terminate_backend: %v", err)
	}
	select {
	case <-watched.Done():
	case <-time.After(time.Minute):
		t.Fatal("the exclusive lock's failed connection went unnoticed for a minute")
	}
	if err := context.Cause(watched); !errors.Is(err, ErrExclusionLost) || !strings.Contains(err.Error(), "run it again") {
		t.Errorf("cause %v, want ErrExclusionLost with its way out", err)
	}
}

// The check ExcludeServingChecked returns pings the lock's connection
// there and then: a lost lock refuses the next write at once, not at the
// watch's next periodic check (up to excludedCheck+excludedCheckTimeout
// later, during which store reapply once went on writing).
func TestExclusiveServingLockCheckedBeforeAWrite(t *testing.T) {
	ctx := t.Context()
	s, url := openFresh(t)
	watched, check, release, err := ExcludeServingChecked(ctx, url)
	if err != nil {
		t.Fatalf("ExcludeServingChecked: %v", err)
	}
	defer release()
	if err := check(ctx); err != nil {
		t.Fatalf("check with the lock held: %v", err)
	}
	if _, err := s.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`, excludingApp); err != nil {
		t.Fatalf("pg_terminate_backend: %v", err)
	}
	if err := check(ctx); !errors.Is(err, ErrExclusionLost) {
		t.Fatalf("check right after the lock's session ended: %v, want ErrExclusionLost", err)
	}
	if watched.Err() == nil {
		t.Error("the watched context is not cancelled after check found the lock lost")
	}
}

// The sessions holding the serving lock ask the database for keepalives,
// so that it ends the session of a holder cut off, and lets go of the
// lock, in seconds rather than the server host's TCP default (hours).
func TestServingLockSessionsAskForKeepalives(t *testing.T) {
	ctx := t.Context()
	_, url := openFresh(t)
	conn, got, err := trySessionLock(ctx, url, excludingApp, `SELECT pg_try_advisory_lock($1)`)
	if err != nil || !got {
		t.Fatalf("trySessionLock: %v, %v", got, err)
	}
	defer conn.Close(context.Background())
	for param, want := range map[string]string{"tcp_keepalives_idle": "10", "tcp_keepalives_interval": "5", "tcp_keepalives_count": "3"} {
		var v string
		if err := conn.QueryRow(ctx, "SHOW "+param).Scan(&v); err != nil {
			t.Fatal(err)
		}
		if v != want {
			t.Errorf("%s = %s on the lock's session, want %s", param, v, want)
		}
	}
}

// A discovery replica holding the serving lock is named as one in the
// refusal of an offline command.
func TestServingLockNamesDiscoveryReplicas(t *testing.T) {
	ctx := t.Context()
	s, url := openFresh(t)
	release, err := s.HoldServingAs(ctx, ServingDiscovery, nil)
	if err != nil {
		t.Fatalf("HoldServingAs: %v", err)
	}
	defer release()
	if _, err := ExcludeServing(ctx, url); !errors.Is(err, ErrServing) || !strings.Contains(err.Error(), discoveryServingApp) {
		t.Fatalf("ExcludeServing with a discovery replica serving: %v, want ErrServing naming it", err)
	}
}

// freezingProxy forwards TCP connections to backend until freeze, after
// which it passes nothing on either way and closes nothing: a database
// host gone silent (powered off, cut off), as TCP sees it.
func freezingProxy(t *testing.T, backend string) (addr string, freeze func()) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	frozen := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { l.Close(); once.Do(func() { close(frozen) }) })
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			select {
			case <-frozen:
				<-t.Context().Done()
				return
			default:
			}
			if n > 0 {
				if _, err := dst.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", backend)
			if err != nil {
				c.Close()
				continue
			}
			go pipe(s, c)
			go pipe(c, s)
		}
	}()
	return l.Addr().String(), func() { once.Do(func() { close(frozen) }) }
}

// The command holding the lock exclusively notices, within its checks'
// bound, a connection whose database went silent, which no error
// reports: the database lets go of the lock once its keepalives find the
// session dead, and the command must not write on past that.
func TestExclusiveServingLockNoticesASilentDatabase(t *testing.T) {
	check, timeout := excludedCheck, excludedCheckTimeout
	excludedCheck, excludedCheckTimeout = 50*time.Millisecond, 500*time.Millisecond
	defer func() { excludedCheck, excludedCheckTimeout = check, timeout }()
	_, url := openFresh(t)
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	addr, freeze := freezingProxy(t, u.Host)
	u.Host = addr
	watched, release, err := ExcludeServingWatched(t.Context(), u.String())
	if err != nil {
		t.Fatalf("ExcludeServingWatched: %v", err)
	}
	defer release()
	freeze()
	select {
	case <-watched.Done():
	case <-time.After(time.Minute):
		t.Fatal("a silent database went unnoticed for a minute")
	}
	if err := context.Cause(watched); !errors.Is(err, ErrExclusionLost) {
		t.Errorf("cause %v, want ErrExclusionLost", err)
	}
}

// The lock's sessions ask for keepalives on the session, not in the
// startup packet: PgBouncer refuses a startup parameter it does not know
// (unless told to ignore it), and a replica refused its lock would not
// start. A listener that reads the startup packet, as PgBouncer does,
// sees only parameters every pooler knows.
func TestServingLockStartupCarriesNoKeepalives(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan map[string]string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Minute))
		be := pgproto3.NewBackend(c, c)
		for {
			msg, err := be.ReceiveStartupMessage()
			if err != nil {
				got <- nil
				return
			}
			switch m := msg.(type) {
			case *pgproto3.SSLRequest, *pgproto3.GSSEncRequest:
				c.Write([]byte("N"))
				continue
			case *pgproto3.StartupMessage:
				got <- m.Parameters
				be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "08P01", Message: "test: startup seen"})
				be.Flush()
				return
			}
		}
	}()
	url := "postgres://muster@" + ln.Addr().String() + "/muster?sslmode=disable&connect_timeout=5"
	if _, _, err := trySessionLock(t.Context(), url, excludingApp, `SELECT pg_try_advisory_lock($1)`); err == nil {
		t.Fatal("trySessionLock against a listener that refuses every startup: no error")
	}
	params := <-got
	if params == nil {
		t.Fatal("no startup packet read")
	}
	for name := range params {
		if strings.HasPrefix(name, "tcp_keepalives") {
			t.Errorf("startup parameter %s=%s: PgBouncer refuses it; set it on the session", name, params[name])
		}
	}
}

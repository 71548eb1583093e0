package postgres

import (
	"context"
	"errors"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/pgtest"
)

// TestUnreachableIsUnavailable: a connection the server ended (57P01,
// pg_terminate_backend or a shutdown) and a server that is down (connection
// refused) are store.ErrUnavailable from every method, which the authority
// answers with UNAVAILABLE and agents retry; once the server is back the
// same store works again. Its own cluster: the test stops it.
func TestUnreachableIsUnavailable(t *testing.T) {
	own, err := pgtest.Start()
	pgtest.FailOrSkip(t, err)
	t.Cleanup(func() { own.Resume(); own.Stop() })
	url := own.NewDatabase(t)
	s := openURL(t, url)
	ctx := t.Context()
	if _, err := s.Now(ctx); err != nil {
		t.Fatal(err)
	}

	// 57P01 on a pooled connection.
	admin, err := pgx.Connect(ctx, own.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'`); err != nil {
		t.Fatal(err)
	}
	admin.Close(ctx)
	if _, err := s.GetAgentStream(ctx, "n1"); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("after the server ended the connection: %v, want ErrUnavailable", err)
	}

	if err := own.Halt(); err != nil {
		t.Fatal(err)
	}
	// Every method that reaches the database: called with zero arguments,
	// its error is ErrUnavailable unless the method refused its arguments
	// first (an error of the caller, not of the database).
	v := reflect.ValueOf(s)
	for i := range v.NumMethod() {
		m := v.Type().Method(i)
		if m.Name == "Close" {
			continue
		}
		ft := m.Type
		args := []reflect.Value{}
		for j := 1; j < ft.NumIn(); j++ {
			in := ft.In(j)
			if in == reflect.TypeFor[context.Context]() {
				c, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				args = append(args, reflect.ValueOf(c))
				continue
			}
			args = append(args, reflect.Zero(in))
		}
		if ft.NumOut() == 0 || ft.Out(ft.NumOut()-1) != reflect.TypeFor[error]() {
			continue
		}
		var err error
		ok := true
		func() {
			defer func() {
				if r := recover(); r != nil {
					err = nil
					t.Logf("%s: panics on zero arguments (%v); not checked", m.Name, r)
					ok = false
				}
			}()
			var out []reflect.Value
			if ft.IsVariadic() {
				out = v.Method(i).CallSlice(args)
			} else {
				out = v.Method(i).Call(args)
			}
			if e := out[len(out)-1].Interface(); e != nil {
				err = e.(error)
			}
		}()
		if !ok {
			continue
		}
		switch {
		case err == nil:
			t.Logf("%s: no error on zero arguments; not checked", m.Name)
		case errors.Is(err, store.ErrUnavailable):
		case strings.Contains(err.Error(), "connect") || strings.Contains(err.Error(), "conn"):
			t.Errorf("%s with the server down: %v, want ErrUnavailable", m.Name, err)
		default:
			t.Logf("%s: %v; not checked", m.Name, err)
		}
	}

	if err := own.Resume(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Now(ctx); err != nil {
		t.Errorf("Now after the server came back: %v", err)
	}
}

// TestHungIsUnavailable: a database that hangs rather than refusing (every
// process of its cluster stopped: connections are accepted and data
// acknowledged, nothing answered) is store.ErrUnavailable from every
// method once the store's request timeout has passed, well before the
// caller's own deadline, so the authority answers UNAVAILABLE and logs
// the outage; a caller whose own deadline comes first gets its deadline,
// not ErrUnavailable; and once the database answers again the same store
// works. Before the store had a deadline of its own, every method waited
// for the caller's.
func TestHungIsUnavailable(t *testing.T) {
	own, err := pgtest.Start()
	pgtest.FailOrSkip(t, err)
	t.Cleanup(func() { own.Thaw(); own.Stop() })
	url := own.NewDatabase(t)
	s, err := Open(t.Context(), url, WithRequestTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	patient, err := Open(t.Context(), url, WithRequestTimeout(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { patient.Close() })
	ctx := t.Context()
	// Connections in both pools, idle: the requests below go out on
	// connections the database holds, not only on new ones.
	for _, st := range []*Store{s, patient} {
		if _, err := st.ListNodes(ctx); err != nil {
			t.Fatal(err)
		}
	}

	if err := own.Freeze(); err != nil {
		t.Fatal(err)
	}
	// Far longer than the store's 2 s (and pgx's 5 s after it to give a
	// cancelled statement up) on a loaded machine.
	const callerWait = 90 * time.Second
	for name, err := range everyMethod(t, s, func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(ctx, callerWait)
	}) {
		switch {
		case err == nil:
			t.Logf("%s: no error on zero arguments; not checked", name)
		case errors.Is(err, store.ErrUnavailable):
			if errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s: %v also wraps context.DeadlineExceeded, which callers read as their own deadline", name, err)
			}
		case errors.Is(err, context.DeadlineExceeded), strings.Contains(err.Error(), "deadline"),
			strings.Contains(err.Error(), "timeout"), strings.Contains(err.Error(), "conn"):
			t.Errorf("%s with the database hung: %v, want ErrUnavailable", name, err)
		default:
			t.Logf("%s: %v; not checked", name, err)
		}
	}

	// The caller's own deadline, sooner than the store's, says nothing
	// of the database.
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if _, err := patient.Now(short); err == nil || errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Now past the caller's deadline: %v, want the caller's deadline, not ErrUnavailable", err)
	}

	if err := own.Thaw(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Now(ctx); err != nil {
		t.Errorf("Now after the database answered again: %v", err)
	}
}

// everyMethod calls every method of s that returns an error, at once, each
// with zero arguments but a context of newCtx, and returns what each
// returned; a method that panics on zero arguments is left out, and so is
// RunAsLeader, which tries again until its context ends.
func everyMethod(t *testing.T, s *Store, newCtx func() (context.Context, context.CancelFunc)) map[string]error {
	v := reflect.ValueOf(s)
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		out = map[string]error{}
	)
	for i := range v.NumMethod() {
		m := v.Type().Method(i)
		ft := m.Type
		if m.Name == "Close" || m.Name == "RunAsLeader" || ft.NumOut() == 0 || ft.Out(ft.NumOut()-1) != reflect.TypeFor[error]() {
			continue
		}
		ctx, cancel := newCtx()
		defer cancel()
		args := []reflect.Value{}
		for j := 1; j < ft.NumIn(); j++ {
			switch in := ft.In(j); {
			case in == reflect.TypeFor[context.Context]():
				args = append(args, reflect.ValueOf(ctx))
			case in.Kind() == reflect.Func:
				// An audit record's builder: a nil one is refused before
				// the database is asked, which would leave the method
				// unchecked.
				args = append(args, standIn(in))
			default:
				args = append(args, reflect.Zero(in))
			}
		}
		wg.Go(func() {
			defer func() {
				if r := recover(); r != nil {
					t.Logf("%s: panics on zero arguments (%v); not checked", m.Name, r)
				}
			}()
			var res []reflect.Value
			if ft.IsVariadic() {
				res = v.Method(i).CallSlice(args)
			} else {
				res = v.Method(i).Call(args)
			}
			err, _ := res[len(res)-1].Interface().(error)
			mu.Lock()
			out[m.Name] = err
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// standIn is a function of type ft for everyMethod's calls: it returns
// an error where ft returns one, a stand-in where ft returns a function,
// and zero values otherwise. With the database hung it is never reached.
func standIn(ft reflect.Type) reflect.Value {
	return reflect.MakeFunc(ft, func([]reflect.Value) []reflect.Value {
		out := make([]reflect.Value, ft.NumOut())
		for i := range out {
			switch o := ft.Out(i); {
			case o == reflect.TypeFor[error]():
				out[i] = reflect.ValueOf(errors.New("a stand-in builder, not reached with the database hung"))
			case o.Kind() == reflect.Func:
				out[i] = standIn(o)
			default:
				out[i] = reflect.Zero(o)
			}
		}
		return out
	})
}

// TestHungLongRequestIsUnavailable: a long request (a cleaner, a bulk
// load: bounded by longRequestTimeout, not the store's timeout) handed a
// connection its pool already holds to a database that then hangs is
// store.ErrUnavailable within the store's timeout, as one that has to
// open a connection is. It used to wait on the held connection for its
// caller's deadline ("timeout: context deadline exceeded"): in
// TestHungIsUnavailable whichever long method drew the pool's idle
// connection failed so, now and then. A pool of one connection, warm
// before the freeze, forces that connection on each.
func TestHungLongRequestIsUnavailable(t *testing.T) {
	own, err := pgtest.Start()
	pgtest.FailOrSkip(t, err)
	t.Cleanup(func() { own.Thaw(); own.Stop() })
	url := own.NewDatabase(t) + "&pool_max_conns=1"
	ctx := t.Context()
	long := map[string]func(context.Context, *Store) error{
		"DeleteTicketUses": func(ctx context.Context, s *Store) error {
			_, err := s.DeleteTicketUses(ctx)
			return err
		},
		"DeleteExpiredTokens": func(ctx context.Context, s *Store) error {
			_, err := s.DeleteExpiredTokens(ctx, 0, func([]string) func(store.AuditHead) (store.AuditRecord, error) { return benchLink })
			return err
		},
		"DeleteJoinReports": func(ctx context.Context, s *Store) error {
			_, err := s.DeleteJoinReports(ctx, 0)
			return err
		},
		"LoadSeed": func(ctx context.Context, s *Store) error {
			_, err := s.LoadSeed(ctx, store.Seed{})
			return err
		},
		"RevokeExpiredGracePSKs": func(ctx context.Context, s *Store) error {
			_, err := s.RevokeExpiredGracePSKs(ctx, func([]string) func(store.AuditHead) (store.AuditRecord, error) {
				return func(store.AuditHead) (store.AuditRecord, error) {
					return store.AuditRecord{}, errors.New("a stand-in builder, not reached with the database hung")
				}
			})
			return err
		},
	}
	// A store each, so each long request has the one held connection.
	stores := map[string]*Store{}
	for name := range long {
		s, err := Open(ctx, url, WithRequestTimeout(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if n, _ := s.PoolMaxConns(); n != 1 {
			t.Fatalf("pool of %d connections, want 1", n)
		}
		if _, err := s.Now(ctx); err != nil {
			t.Fatal(err)
		}
		stores[name] = s
	}

	if err := own.Freeze(); err != nil {
		t.Fatal(err)
	}
	// As in TestHungIsUnavailable: far longer than the store's 2 s, the
	// 5 s pgx gives a cancelled statement after it, and a connect's 2 s.
	const callerWait = 90 * time.Second
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs = map[string]error{}
	)
	for name, call := range long {
		wg.Go(func() {
			c, cancel := context.WithTimeout(ctx, callerWait)
			defer cancel()
			err := call(c, stores[name])
			mu.Lock()
			errs[name] = err
			mu.Unlock()
		})
	}
	wg.Wait()
	for name, err := range errs {
		switch {
		case !errors.Is(err, store.ErrUnavailable):
			t.Errorf("%s on a held connection to a hung database: %v, want ErrUnavailable", name, err)
		case errors.Is(err, context.DeadlineExceeded):
			t.Errorf("%s: %v also wraps context.DeadlineExceeded, which callers read as their own deadline", name, err)
		case !strings.HasPrefix(err.Error(), "postgres: "):
			// RevokeExpiredGracePSKs's read "error preprocessing batch
			// (prepare): ...", the operation unnamed.
			t.Errorf("%s: %q does not name the operation", name, err)
		}
	}

	if err := own.Thaw(); err != nil {
		t.Fatal(err)
	}
	for name, call := range long {
		if err := call(ctx, stores[name]); err != nil && name != "RevokeExpiredGracePSKs" {
			t.Errorf("%s after the database answered again: %v", name, err)
		}
	}
}

// TestMisconfiguredIsNotUnavailable: a store URL the database refuses (a
// user it does not know, a database that does not exist) or whose TLS
// settings it cannot meet (sslmode=require on a server without TLS) is the
// operator's to fix, not an outage: Open's error is not
// store.ErrUnavailable, which the authority waits out as a database that is
// down, and it names the setting to fix. Before, a TLS failure was
// ErrUnavailable and none of them named the setting.
func TestMisconfiguredIsNotUnavailable(t *testing.T) {
	t.Parallel()
	good := srv.NewDatabase(t)
	u, err := url.Parse(good)
	if err != nil {
		t.Fatal(err)
	}
	with := func(change func(u *url.URL)) string {
		c := *u
		change(&c)
		return c.String()
	}
	for _, tc := range []struct {
		name string
		url  string
		want []string
	}{
		{"sslmode=require without TLS", with(func(u *url.URL) { u.RawQuery = "sslmode=require" }),
			[]string{"does not accept TLS", "sslmode", "ssl = on", "MUSTER_STORE"}},
		{"unknown user", with(func(u *url.URL) { u.User = url.UserPassword("nosuchuser", "secret") }),
			[]string{"refused the user", "MUSTER_STORE"}},
		{"unknown database", with(func(u *url.URL) { u.Path = "/nosuchdb" }),
			[]string{"does not exist", "database name", "MUSTER_STORE"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			s, err := Open(ctx, tc.url)
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded")
			}
			if errors.Is(err, store.ErrUnavailable) {
				t.Errorf("Open: %v: is ErrUnavailable, an outage to wait out", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Open: %v: does not say %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("Open: %v: quotes the password", err)
			}
		})
	}
}

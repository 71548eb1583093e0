package postgres

import (
	"context"
	"errors"
	"reflect"
	"strings"
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
	if err != nil {
		t.Fatal(err)
	}
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

// Package pgtest runs a real, throwaway PostgreSQL server for the tests of
// the PostgreSQL store: one cluster per test package, started from TestMain
// with the programs BinDir finds (on PATH, through pg_config, or in Debian's
// /usr/lib/postgresql/*/bin), and a fresh database per test. It follows the
// recipe in STACK.md: initdb refuses to run as root, so as root the cluster
// belongs to the postgres user and every server command goes through
// runuser. The cluster's directory is on /dev/shm where that is a tmpfs
// with room: on ext4 the files of the databases created and dropped cost
// several times more CPU than the tests (clusterParent).
//
// The server runs with fsync=off and synchronous_commit=off: it is for
// correctness tests, and its timings say nothing about a durable setup.
//
// A server that is installed but cannot start is a test failure, never a
// skip: a test package that silently stops testing its backend is worse than
// a red build. Where PostgreSQL is not installed at all, the tests that need
// it skip with one line saying how to install it, so that `go test ./...`
// works on any machine; MUSTER_REQUIRE_POSTGRES=1 (set by .ci/run) makes
// that a failure too, so CI never skips them.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server is one running PostgreSQL cluster in a temporary directory.
type Server struct {
	dir  string // holds data/, log and the Unix socket
	bin  string // the PostgreSQL bin directory
	port int
	// version is the major version initdb wrote to data/PG_VERSION.
	version int
	// missing, set by Main where PostgreSQL is not installed, makes
	// NewDatabase skip (or fail: FailOrSkip) the test that calls it.
	missing error
	// asPostgres: the process is root, so server commands run as postgres.
	asPostgres bool
	dbs        atomic.Int64
}

// Main is the body of a TestMain that needs a server: it starts one, stores
// it in *srv, runs the tests, stops it and exits. If the server cannot
// start, it prints why, with the server log, and exits with status 1. If
// PostgreSQL is not installed (and not required), the tests still run and
// each NewDatabase skips its test.
func Main(m *testing.M, srv **Server) {
	s, err := Start()
	if errors.Is(err, ErrNotInstalled) && !required() {
		*srv = &Server{missing: err}
		os.Exit(m.Run())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, failure(err))
		os.Exit(1)
	}
	*srv = s
	code := m.Run()
	if err := s.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// Start creates a cluster in a new temporary directory and starts it on a
// free loopback port. The error of a failed start includes the server log;
// where PostgreSQL is not installed, it wraps ErrNotInstalled (FailOrSkip
// turns that into a skip).
func Start() (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	// Not t.TempDir: its 0700 parent would keep the postgres user out.
	// On a tmpfs where there is one (clusterParent says why).
	dir, err := os.MkdirTemp(clusterParent(), "pgtest-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, bin: bin, asPostgres: os.Geteuid() == 0}
	if s.asPostgres {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root needs the postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if out, err := s.run("initdb", "-D", s.data(), "-U", "postgres", "-A", "trust",
		"--no-sync", "-E", "UTF8", "--locale=C"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	pgVersion, err := os.ReadFile(filepath.Join(s.data(), "PG_VERSION"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s.version, _ = strconv.Atoi(strings.TrimSpace(string(pgVersion)))
	// A port taken by another package's server between the probe and the
	// start makes pg_ctl fail; try a few.
	for attempt := 0; ; attempt++ {
		s.port, err = freePort()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		out, err := s.run("pg_ctl", "-D", s.data(), "-l", s.logPath(), "-w", "-t", "30", "start",
			"-o", fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off "+
				"-c synchronous_commit=off -c full_page_writes=off -c max_connections=200", s.port, dir))
		if err == nil {
			break
		}
		if attempt == 2 {
			log, _ := os.ReadFile(s.logPath())
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pg_ctl start: %v\n%s\nserver log:\n%s", err, out, log)
		}
	}
	return s, nil
}

// Stop stops the server at once and removes its directory.
func (s *Server) Stop() error {
	if s.missing != nil {
		return nil
	}
	out, err := s.run("pg_ctl", "-D", s.data(), "-m", "immediate", "-w", "stop")
	if err != nil {
		return fmt.Errorf("pg_ctl stop: %v\n%s", err, out)
	}
	return os.RemoveAll(s.dir)
}

// URL returns the connection URL of database db as the superuser.
func (s *Server) URL(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User("postgres"),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Log returns the server log so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.logPath())
	return string(b)
}

// NewDatabase creates an empty database, dropped when the test ends, and
// returns its URL. Whatever the test opens on it must be closed by
// cleanups registered after this call. On the Server Main stores where
// PostgreSQL is not installed, it skips the test (FailOrSkip).
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	return s.newDatabase(t, "")
}

// NewDatabaseFrom creates a database that is a copy of the database at
// templateURL (a URL NewDatabase returned), dropped when the test ends, and
// returns its URL: cheaper than migrating a new database for every test
// when the tests need the same migrated schema. Nothing may be connected to
// the template while it is copied.
func (s *Server) NewDatabaseFrom(t testing.TB, templateURL string) string {
	t.Helper()
	u, err := url.Parse(templateURL)
	if err != nil {
		t.Fatalf("pgtest: template URL: %v", err)
	}
	template := strings.TrimPrefix(u.Path, "/")
	if !validName.MatchString(template) {
		t.Fatalf("pgtest: template %q is no database NewDatabase created", template)
	}
	return s.newDatabase(t, template)
}

// validName matches the names NewDatabase gives its databases.
var validName = regexp.MustCompile(`^t[0-9]+$`)

func (s *Server) newDatabase(t testing.TB, template string) string {
	t.Helper()
	if s.missing != nil {
		FailOrSkip(t, s.missing)
		return "" // only a fake testing.TB returns from FailOrSkip
	}
	name := fmt.Sprintf("t%d", s.dbs.Add(1))
	// FILE_COPY (PostgreSQL 15+) copies template1's few files, several
	// times faster here than logging every page of it.
	create := `CREATE DATABASE ` + name
	if template != "" {
		create += ` TEMPLATE ` + template
	}
	if s.version >= 15 {
		create += ` STRATEGY FILE_COPY`
	}
	if err := s.admin(context.Background(), create); err != nil {
		t.Fatalf("pgtest: create database: %v\nserver log:\n%s", err, s.Log())
	}
	t.Cleanup(func() {
		if err := s.admin(context.Background(), `DROP DATABASE `+name+` WITH (FORCE)`); err != nil {
			t.Errorf("pgtest: drop database: %v", err)
		}
	})
	return s.URL(name)
}

// admin runs one statement on the postgres database.
func (s *Server) admin(ctx context.Context, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	_, err = c.Exec(ctx, sql)
	return err
}

func (s *Server) data() string    { return filepath.Join(s.dir, "data") }
func (s *Server) logPath() string { return filepath.Join(s.dir, "log") }

// run runs a PostgreSQL program, as the postgres user when root.
func (s *Server) run(prog string, args ...string) ([]byte, error) {
	path := filepath.Join(s.bin, prog)
	var cmd *exec.Cmd
	if s.asPostgres {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	cmd.Dir = s.dir
	return cmd.CombinedOutput()
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

package pgtest

import (
	"fmt"
	"os"
)

// Halt stops the server as an operator's restart does (fast mode: every
// session is ended with 57P01, admin shutdown) and keeps its directory, so
// Resume can start it again: for tests of what clients do while the
// database is unreachable. Not immediate mode, a crash: with this
// package's synchronous_commit=off a crash loses the last commits, which
// a production server (synchronous_commit=on) never does. Not safe to
// call concurrently with Resume.
func (s *Server) Halt() error {
	out, err := s.run("pg_ctl", "-D", s.data(), "-m", "fast", "-w", "stop")
	if err != nil {
		return fmt.Errorf("pg_ctl stop: %v\n%s", err, out)
	}
	return nil
}

// Resume starts a halted server again on the same port, with the same
// settings, and waits until it accepts connections.
func (s *Server) Resume() error {
	out, err := s.run("pg_ctl", "-D", s.data(), "-l", s.logPath(), "-w", "-t", "30", "start",
		"-o", fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off "+
			"-c synchronous_commit=off -c full_page_writes=off -c max_connections=200", s.port, s.dir))
	if err != nil {
		log, _ := os.ReadFile(s.logPath())
		return fmt.Errorf("pg_ctl start: %v\n%s\nserver log:\n%s", err, out, log)
	}
	return nil
}

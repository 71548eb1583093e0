package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/errinfo"
)

// A join through discovery whose ticket the authority refuses for its key
// (discovery revoked the key seconds after signing with it, or the
// authority has not fetched the new one) asks for a fresh ticket, a
// bounded number of times with a growing wait, then stops with the way
// out; any other refusal (a used ticket, an expired one, whose message
// says the clocks are apart, a wrong PSK) is not retried.
func TestFreshTicketsAfterAKeyRefusal(t *testing.T) {
	old := ticketWait
	ticketWait = time.Millisecond
	t.Cleanup(func() { ticketWait = old })
	keyUnknown := errinfo.Error(codes.PermissionDenied, "referral ticket is signed by a key the discovery service no longer publishes", "ticket_key_unknown")
	notFetched := errinfo.Error(codes.Unavailable, "cannot check the referral ticket now", "ticket_key_not_fetched")
	r := JoinRequest{Node: "n1", Discovery: "discovery.test:7450"}
	const rejoin = "muster agent join --data ./a --node n1 --discovery discovery.test:7450 --authority-id prod-a3f2e1 --ca-fingerprint sha256:ab --psk-file F"
	tests := []struct {
		name      string
		answers   []error // one per attempt; past the end, success
		wantCalls int
		wantCode  codes.Code // OK: joined
		wantWord  string
		wantHint  bool
	}{
		{"joins at once", nil, 1, codes.OK, "", false},
		{"a revoked key, then the new one", []error{keyUnknown}, 2, codes.OK, "", false},
		{"revoked, then not fetched yet, then fetched", []error{keyUnknown, notFetched, keyUnknown}, 4, codes.OK, "", false},
		{"refused for its key every time", []error{keyUnknown, keyUnknown, keyUnknown, keyUnknown, keyUnknown}, ticketAttempts, codes.PermissionDenied, "ticket_key_unknown", true},
		{"a used ticket is not retried", []error{errinfo.Error(codes.PermissionDenied, "referral ticket was already used", "ticket_used")}, 1, codes.PermissionDenied, "ticket_used", false},
		{"an expired one neither (clocks apart)", []error{errinfo.Error(codes.PermissionDenied, "referral ticket has expired: … set both right (NTP)", "permission_denied")}, 1, codes.PermissionDenied, "permission_denied", false},
		{"nor a wrong PSK", []error{errinfo.Error(codes.PermissionDenied, "bootstrap PSK does not match", "psk_mismatch")}, 1, codes.PermissionDenied, "psk_mismatch", false},
		{"nor a plain outage, which agent run retries", []error{errinfo.Error(codes.Unavailable, "store down", "store_unavailable")}, 1, codes.Unavailable, "store_unavailable", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			j, err := freshTickets(t.Context(), log, r, rejoin, func() (*joinResult, error) {
				calls++
				if calls <= len(tt.answers) {
					return nil, tt.answers[calls-1]
				}
				return &joinResult{instanceID: "instance-1"}, nil
			})
			if calls != tt.wantCalls {
				t.Errorf("%d attempts, want %d", calls, tt.wantCalls)
			}
			// Each retry logged once, with the refusal's reason.
			lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
			if logs.Len() == 0 {
				lines = nil
			}
			retries := min(calls-1, len(tt.answers))
			if len(lines) != retries {
				t.Errorf("%d retries logged, want %d:\n%s", len(lines), retries, logs.String())
			}
			for i, l := range lines {
				if want := "reason=" + errinfo.Reason(tt.answers[i]); !strings.Contains(l, want) || !strings.Contains(l, "level=WARN") || strings.Count(l, errinfo.Reason(tt.answers[i])) != 1 {
					t.Errorf("retry %d logged %q; want one warning naming %s once", i+1, l, want)
				}
			}
			if tt.wantCode == codes.OK {
				if err != nil || j == nil {
					t.Fatalf("freshTickets = %v, %v; want the join", j, err)
				}
				return
			}
			if codeOf(err) != tt.wantCode || errinfo.Reason(err) != tt.wantWord {
				t.Fatalf("freshTickets = %v (%s, %q), want %s with reason %q", err, codeOf(err), errinfo.Reason(err), tt.wantCode, tt.wantWord)
			}
			msg := status.Convert(err).Message()
			got := strings.Contains(msg, "in a row were refused for their key") && strings.Contains(msg, "discovery "+r.Discovery) &&
				strings.Contains(msg, "https://"+r.Discovery+"/.well-known/jwks.json") && strings.HasSuffix(msg, "then join again, with a fresh ticket: "+rejoin)
			if got != tt.wantHint {
				t.Errorf("error %q names the way out: %v, want %v", msg, got, tt.wantHint)
			}
		})
	}
}

// An agent stopped while it waits to ask for a fresh ticket stops at once,
// and one whose deadline passes there ends when it passes: the error says
// which ended the wait, and keeps the refusal it waited after as its
// cause (its code and reason, so agent run classes it as before).
func TestFreshTicketsStopWithTheAgent(t *testing.T) {
	old := ticketWait
	ticketWait = time.Hour
	t.Cleanup(func() { ticketWait = old })
	refusal := errinfo.Error(codes.PermissionDenied, "referral ticket is signed by a key the discovery service no longer publishes", "ticket_key_unknown")
	for _, tt := range []struct {
		name    string
		ctx     func() (context.Context, context.CancelFunc)
		end     error
		wantSay string
	}{
		{"stopped", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			return ctx, cancel
		}, context.Canceled, "the join was stopped while it waited to ask discovery d:1 for a fresh referral ticket"},
		{"its deadline passed", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(t.Context(), 50*time.Millisecond)
		}, context.DeadlineExceeded, "the join's deadline passed while it waited to ask discovery d:1 for a fresh referral ticket"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := tt.ctx()
			defer cancel()
			done := make(chan error, 1)
			calls := 0
			go func() {
				_, err := freshTickets(ctx, nil, JoinRequest{Discovery: "d:1"}, "", func() (*joinResult, error) {
					calls++
					return nil, refusal
				})
				done <- err
			}()
			select {
			case err := <-done:
				if calls != 1 {
					t.Errorf("%d attempts, want 1", calls)
				}
				if !errors.Is(err, tt.end) || errinfo.Reason(err) != "ticket_key_unknown" || codeOf(err) != codes.PermissionDenied {
					t.Errorf("freshTickets = %v (%s, %q); want it to wrap %v and the refusal", err, codeOf(err), errinfo.Reason(err), tt.end)
				}
				if !strings.Contains(fmt.Sprint(err), tt.wantSay) || !strings.Contains(fmt.Sprint(err), "no longer publishes") {
					t.Errorf("freshTickets = %q; want it to say %q and the last refusal", err, tt.wantSay)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("freshTickets still waits 30 s after its context ended")
			}
		})
	}
}

// The command a join refused for its tickets' keys names is the join
// through discovery it was, pasteable: the data directory quoted, the
// pins and --force kept, and the PSK named by a file, never printed.
func TestRejoinCommand(t *testing.T) {
	base := JoinRequest{Node: "web-1", Discovery: "discovery.example.org:7450", AuthorityID: "prod-a3f2e1", CAFingerprint: "sha256:ab12"}
	pinned := base
	pinned.DiscoveryFingerprint = "sha256:cd34"
	forced := base
	forced.Force = true
	const tail = " --psk-file F (F holding the PSK; leave --psk-file out when MUSTER_BOOTSTRAP_PSK or the agent.yaml of --data gives it)"
	for _, tt := range []struct {
		name string
		dir  Dir
		r    JoinRequest
		want string
	}{
		{"plain", "/var/lib/muster-agent", base,
			"muster agent join --data /var/lib/muster-agent --node web-1 --discovery discovery.example.org:7450 --authority-id prod-a3f2e1 --ca-fingerprint sha256:ab12" + tail},
		{"discovery pinned", "./a", pinned,
			"muster agent join --data ./a --node web-1 --discovery discovery.example.org:7450 --authority-id prod-a3f2e1 --ca-fingerprint sha256:ab12 --discovery-fingerprint sha256:cd34" + tail},
		{"over an identity, in a directory with a space", "/srv/agent data", forced,
			"muster agent join --data '/srv/agent data' --node web-1 --discovery discovery.example.org:7450 --authority-id prod-a3f2e1 --ca-fingerprint sha256:ab12 --force" + tail},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := New(Options{Dir: tt.dir}).rejoinCommand(tt.r); got != tt.want {
				t.Errorf("rejoinCommand =\n  %s\nwant\n  %s", got, tt.want)
			}
		})
	}
}

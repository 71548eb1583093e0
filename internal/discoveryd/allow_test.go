package discoveryd

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/discovery"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// lookAlike is a root fingerprint that gives a's authority ID without
// being a's: what an attacker's ground key would have.
func lookAlike(a *authority) string {
	fp := a.h.Fingerprint()
	repl := "0"
	if fp[len(fp)-1] == '0' {
		repl = "1"
	}
	return fp[:len("sha256:")+6] + strings.Repeat(repl, 58)
}

func TestRegisterAuthorityAllowlist(t *testing.T) {
	a, b := newAuthority(t, "prod"), newAuthority(t, "other")
	own := discovery.AllowEntry{AuthorityID: a.id, Fingerprint: a.h.Fingerprint()}
	impostor := discovery.AllowEntry{AuthorityID: a.id, Fingerprint: lookAlike(a)}
	broken := a.registration(t, 1, openPolicy())
	broken.Signature = []byte("not a signature")
	tests := []struct {
		name   string
		open   bool
		allow  []discovery.AllowEntry
		req    *musterv1.RegisterAuthorityRequest
		code   codes.Code
		msg    string
		result string
	}{
		{name: "nothing allowed", req: a.registration(t, 1, openPolicy()), code: codes.PermissionDenied, result: resultNotAllowed,
			msg: "authority ID " + a.id + " is not allowed at this discovery: start it with --allow-authority " + a.id + "=sha256:… (see muster discovery show)"},
		{name: "another authority allowed", allow: []discovery.AllowEntry{own}, req: b.registration(t, 1, openPolicy()),
			code: codes.PermissionDenied, result: resultNotAllowed, msg: "authority ID " + b.id + " is not allowed"},
		{name: "not allowed, refused before the signature is checked", req: broken, code: codes.PermissionDenied, result: resultNotAllowed,
			msg: "is not allowed at this discovery"},
		{name: "allowed with its root", allow: []discovery.AllowEntry{own}, req: a.registration(t, 1, openPolicy()), result: resultCreated},
		{name: "allowed, still verified", allow: []discovery.AllowEntry{own}, req: broken, code: codes.PermissionDenied, result: "denied",
			msg: "signature does not verify"},
		{name: "allowed ID, another root", allow: []discovery.AllowEntry{impostor}, req: a.registration(t, 1, openPolicy()),
			code: codes.PermissionDenied, result: resultRootNotAllowed,
			msg: "authority ID " + a.id + " is allowed at this discovery with root fingerprint " + impostor.Fingerprint + " only; this registration is signed under " + a.h.Fingerprint()},
		{name: "open registration", open: true, req: b.registration(t, 1, openPolicy()), result: resultCreated},
		{name: "open registration, listed with its root", open: true, allow: []discovery.AllowEntry{own}, req: a.registration(t, 1, openPolicy()), result: resultCreated},
		{name: "open registration, listed ID with another root", open: true, allow: []discovery.AllowEntry{impostor}, req: a.registration(t, 1, openPolicy()),
			code: codes.PermissionDenied, result: resultRootNotAllowed, msg: "with root fingerprint " + impostor.Fingerprint + " only"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := start(t, allowing(tt.open, tt.allow...))
			resp, err := e.client.RegisterAuthority(ctxT(t), tt.req)
			if got := counter(e.srv.metrics.registrations.WithLabelValues(tt.result)); got != 1 {
				t.Errorf("registrations_total{result=%q} = %v, want 1", tt.result, got)
			}
			_, gerr := e.st.GetRegistration(ctxT(t), tt.req.GetAuthorityId())
			if tt.code != codes.OK {
				wantCode(t, err, tt.code, tt.msg)
				if !errors.Is(gerr, store.ErrNotFound) {
					t.Errorf("a refused registration was stored: %v", gerr)
				}
				return
			}
			if err != nil {
				t.Fatalf("RegisterAuthority: %v", err)
			}
			if !resp.GetChanged() || gerr != nil {
				t.Errorf("response %+v, stored: %v", resp, gerr)
			}
			if _, err := e.client.LookupAuthority(ctxT(t), &musterv1.LookupAuthorityRequest{AuthorityId: tt.req.GetAuthorityId()}); err != nil {
				t.Errorf("lookup after the registration: %v", err)
			}
		})
	}
}

func TestNotAllowedIsAudited(t *testing.T) {
	e := start(t, allowing(false))
	a := newAuthority(t, "prod")
	_, err := e.client.RegisterAuthority(ctxT(t), a.registration(t, 1, openPolicy()))
	wantCode(t, err, codes.PermissionDenied, "not allowed")
	e.stop()
	recs, err := e.st.ListAudit(context.Background(), store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, r := range recs {
		if r.Action == "authority.register" && r.Result == "denied" && r.Target == a.id && strings.Contains(r.Reason, "is not allowed at this discovery") &&
			r.Source == "127.0.0.1" {
			found = true
		}
	}
	if !found {
		t.Errorf("no audit record of the refused registration in %+v", recs)
	}
}

// TestServedRegistrationsFollowTheAllowlist: a registration stored under
// open registration (a squatter's, say) is not served once the allow-list
// names its ID with another root or no longer admits it.
func TestServedRegistrationsFollowTheAllowlist(t *testing.T) {
	a := newAuthority(t, "prod")
	e := start(t, generous)
	e.register(a, 1, openPolicy())
	lookup := func() error {
		_, err := e.client.LookupAuthority(ctxT(t), &musterv1.LookupAuthorityRequest{AuthorityId: a.id})
		return err
	}
	ticket := func() error {
		_, err := e.client.RequestReferralTicket(ctxT(t), &musterv1.RequestReferralTicketRequest{AuthorityId: a.id, NodeId: "web-1"})
		return err
	}
	report := func() error {
		_, err := e.client.ReportJoin(ctxT(t), a.report(t, "web-1", "i-1"))
		return err
	}
	// The answer for an ID never registered, with a.id for its ID.
	never := newAuthority(t, "never")
	_, err := e.client.LookupAuthority(ctxT(t), &musterv1.LookupAuthorityRequest{AuthorityId: never.id})
	wantCode(t, err, codes.NotFound, "unknown_authority: authority "+never.id+" is not registered with this discovery")
	unregistered := strings.ReplaceAll(status.Convert(err).Message(), never.id, a.id)
	for _, tt := range []struct {
		name   string
		opts   []option
		served bool
		// audited is what the audit record of each refusal says, for
		// discovery's operator, and the caller is not told.
		audited string
	}{
		{name: "open", served: true},
		{name: "allowed with its root", opts: []option{allowing(false, discovery.AllowEntry{AuthorityID: a.id, Fingerprint: a.h.Fingerprint()})}, served: true},
		{name: "not allowed", opts: []option{allowing(false)},
			audited: "authority " + a.id + " is registered here but this discovery's allow-list does not admit it, so it is not served: start discovery with --allow-authority " + a.id + "=sha256:"},
		{name: "open, listed with another root", opts: []option{allowing(true, discovery.AllowEntry{AuthorityID: a.id, Fingerprint: lookAlike(a)})},
			audited: "allow-list names it with " + lookAlike(a) + ", so it is not served: if " + lookAlike(a) + " is the authority's root (ask its operator), muster discovery forget " + a.id + " --data DIR"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e.stop()
			e.run(append([]option{generous}, tt.opts...)...)
			for name, call := range map[string]func() error{"lookup": lookup, "ticket": ticket, "report": report} {
				err := call()
				if tt.served {
					if err != nil {
						t.Errorf("%s: %v", name, err)
					}
					continue
				}
				// Anyone may ask: the answer is the one for an ID never
				// registered, which names the allow-list among the ways
				// out, so it does not tell which IDs discovery holds.
				if status.Code(err) != codes.NotFound || status.Convert(err).Message() != unregistered {
					t.Errorf("%s: %v; want NOT_FOUND %q, the answer for an ID never registered", name, err, unregistered)
				}
				if !strings.Contains(status.Convert(err).Message(), "--allow-authority "+a.id+"=sha256:") {
					t.Errorf("%s: the refusal names no way out: %v", name, err)
				}
			}
			if tt.served {
				return
			}
			recs, err := e.st.ListAudit(context.Background(), store.AuditFilter{})
			if err != nil {
				t.Fatal(err)
			}
			for _, action := range []string{"authority.lookup", "referral_ticket.issue", "join.report"} {
				if !slices.ContainsFunc(recs, func(r store.AuditRecord) bool {
					return r.Action == action && r.Result == "denied" && strings.Contains(r.Reason, tt.audited)
				}) {
					t.Errorf("no %s audit record saying %q in %+v", action, tt.audited, recs)
				}
			}
		})
	}
}

func TestForget(t *testing.T) {
	a, b := newAuthority(t, "prod"), newAuthority(t, "other")
	e := start(t, generous)
	p := openPolicy()
	e.register(a, 1, p)
	e.register(b, 1, p)
	ticket := func() error {
		_, err := e.client.RequestReferralTicket(ctxT(t), &musterv1.RequestReferralTicketRequest{AuthorityId: a.id, NodeId: "web-1"})
		return err
	}
	if err := ticket(); err != nil {
		t.Fatal(err)
	}

	// While discovery runs.
	reg, err := Forget(ctxT(t), e.dir, e.st, a.id)
	if err != nil {
		t.Fatal(err)
	}
	if reg.AuthorityID != a.id || reg.Version != 1 || reg.RootFingerprint != a.h.Fingerprint() {
		t.Errorf("Forget returned %+v", reg)
	}
	wantCode(t, ticket(), codes.NotFound, "unknown_authority")
	if _, err := e.client.LookupAuthority(ctxT(t), &musterv1.LookupAuthorityRequest{AuthorityId: b.id}); err != nil {
		t.Errorf("the other authority after the forget: %v", err)
	}
	if _, err := Forget(ctxT(t), e.dir, e.st, a.id); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Forget again: %v, want ErrNotFound", err)
	}
	if _, err := Forget(ctxT(t), e.dir, e.st, "Not An ID"); err == nil || !strings.Contains(err.Error(), "NAME-HEX6") {
		t.Errorf("Forget of a malformed ID: %v", err)
	}

	// The ID registers anew from version 1, here with a narrower policy
	// under the version the forgotten registration was served (and
	// cached) at: the new policy is the one enforced.
	p.AllowedCIDRs = []string{"10.0.0.0/8"}
	resp, err := e.client.RegisterAuthority(ctxT(t), a.registration(t, 1, p))
	if err != nil || !resp.GetChanged() || resp.GetVersion() != 1 {
		t.Fatalf("registration after the forget: %+v, %v", resp, err)
	}
	if got := counter(e.srv.metrics.registrations.WithLabelValues(resultCreated)); got != 3 {
		t.Errorf("registrations_total{created} = %v, want 3", got)
	}
	wantCode(t, ticket(), codes.PermissionDenied, discovery.DenySource)
	e.register(a, 2, openPolicy())
	if err := ticket(); err != nil {
		t.Errorf("ticket under version 2 of the new registration: %v", err)
	}

	e.stop()
	recs, err := e.st.ListAudit(context.Background(), store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var forgets int
	for _, r := range recs {
		if r.Action == "authority.forget" {
			forgets++
			if r.Actor != "muster discovery forget" || r.Target != a.id || r.Result != "ok" ||
				!strings.Contains(r.Reason, "version 1, root "+a.h.Fingerprint()) {
				t.Errorf("forget record %+v", r)
			}
		}
	}
	if forgets != 1 {
		t.Errorf("%d forget records, want 1", forgets)
	}
}

func TestNewRefusesAnIssuerNamingNoMachine(t *testing.T) {
	e := start(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tt := range []struct {
		listen, advertise string
		ok                bool
	}{
		{listen: "0.0.0.0:0"},
		{listen: "[::]:7450"},
		{listen: ":7450"},
		{listen: "[::ffff:0.0.0.0]:7450"},
		{listen: "127.0.0.1:0", advertise: "0.0.0.0:7450"},
		{listen: "127.0.0.1:0", advertise: "[::]:7450"},
		{listen: "0.0.0.0:7450", advertise: "discovery.example:7450", ok: true},
		{listen: "[::]:7450", advertise: "192.0.2.1:7450", ok: true},
		{listen: "localhost:0", ok: true},
	} {
		_, err := New(Config{Dir: e.dir, Store: e.st, Listen: tt.listen, Advertise: tt.advertise, Log: log})
		if tt.ok {
			if err != nil {
				t.Errorf("listen %q, advertise %q: %v", tt.listen, tt.advertise, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "would name no machine") || !strings.Contains(err.Error(), "set --advertise") {
			t.Errorf("listen %q, advertise %q: %v, want a refusal telling to set --advertise", tt.listen, tt.advertise, err)
		}
	}
}

func TestNewChecksTheAllowlist(t *testing.T) {
	e := start(t)
	a := newAuthority(t, "prod")
	for name, entries := range map[string][]discovery.AllowEntry{
		"one ID, two roots":     {{AuthorityID: a.id, Fingerprint: a.h.Fingerprint()}, {AuthorityID: a.id, Fingerprint: lookAlike(a)}},
		"ID of another root":    {{AuthorityID: "prod-000000", Fingerprint: a.h.Fingerprint()}},
		"malformed fingerprint": {{AuthorityID: a.id, Fingerprint: "sha256:abc"}},
	} {
		if _, err := New(Config{Dir: e.dir, Store: e.st, AllowedAuthorities: entries}); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
}

package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

func retryCases() []testCase {
	// Each case joins node-1 with token t1 (or without a token), certifying
	// key-1, created by the store clock firstAge ago; runs between; then
	// repeats the join as an authority would after a lost reply (a fresh
	// instance ID and serial, RetryWindow a minute) changed by mod. A
	// token t2, unlimited, is there to change to.
	retries := []struct {
		name     string
		uses     int64 // of t1; 0 is unlimited
		noToken  bool
		firstAge time.Duration
		between  func(t *testing.T, ctx context.Context, s store.Store, first store.Instance)
		mod      func(j *store.Join)
		// retry: the repeat returns the first instance and writes nothing.
		// Otherwise it fails with want and writes nothing, or with a nil
		// want is an ordinary join that supersedes superseded.
		retry      bool
		want       error
		superseded string
		// credential: both joins use no token but this credential (a
		// bootstrap PSK's ID).
		credential string
	}{
		{name: "same token, node and key", retry: true},
		{name: "single-use token already spent by the first", uses: 1, retry: true},
		{name: "retry that may supersede is still a retry", mod: func(j *store.Join) { j.MaySupersede = true }, retry: true},
		{
			name: "different key is not a retry",
			mod:  func(j *store.Join) { rekey(j, "key-2") },
			want: store.ErrNodeTaken,
		},
		{
			name:       "different key supersedes when allowed",
			mod:        func(j *store.Join) { rekey(j, "key-2"); j.MaySupersede = true },
			superseded: "i1",
		},
		{
			name: "different token is not a retry",
			mod: func(j *store.Join) {
				j.TokenID, j.Instance.TokenID, j.Certificate.TokenID = "t2", "t2", "t2"
			},
			want: store.ErrNodeTaken,
		},
		{name: "first created before the window", firstAge: time.Hour, want: store.ErrNodeTaken},
		{
			name: "window elapsed",
			between: func(t *testing.T, ctx context.Context, s store.Store, first store.Instance) {
				time.Sleep(20 * time.Millisecond)
			},
			mod:  func(j *store.Join) { j.RetryWindow = 5 * time.Millisecond },
			want: store.ErrNodeTaken,
		},
		{name: "no window", mod: func(j *store.Join) { j.RetryWindow = 0 }, want: store.ErrNodeTaken},
		{
			name: "after a renewal",
			between: func(t *testing.T, ctx context.Context, s store.Store, first store.Instance) {
				_, err := s.CommitRenewal(ctx, renewalOf(first, "key-1", first.CreatedAt))
				mustNil(t, "CommitRenewal", err)
			},
			want: store.ErrNodeTaken,
		},
		{
			name: "after the node was deleted",
			between: func(t *testing.T, ctx context.Context, s store.Store, first store.Instance) {
				mustNil(t, "DeleteNode", s.DeleteNode(ctx, "node-1", link(record("agent.delete"))))
			},
		},
		{name: "join without a token is never a retry", noToken: true, want: store.ErrNodeTaken},
		{name: "same credential, node and key", credential: "psk-1", retry: true},
		{
			name:       "different credential is not a retry",
			credential: "psk-1",
			mod: func(j *store.Join) {
				j.Credential, j.Instance.TokenID, j.Certificate.TokenID = "psk-2", "psk-2", "psk-2"
			},
			want: store.ErrNodeTaken,
		},
		{
			name:       "different key with the same credential is not a retry",
			credential: "psk-1",
			mod:        func(j *store.Join) { rekey(j, "key-2") },
			want:       store.ErrNodeTaken,
		},
	}

	var cases []testCase
	// Each repeat is made twice: as after a read that found the node
	// held, and as after one that found it free before the first join
	// committed (store.Join.NodeFreeAtRead: a stale guess, but where the
	// node is deleted between). The outcome must be the same: a store that
	// trusts the guess misses the retry or the supersession.
	for _, rc := range retries {
		for _, readFree := range []bool{false, true} {
			name := rc.name
			if readFree {
				name += ", the node read free before the first join"
			}
			cases = append(cases, testCase{name, func(t *testing.T, ctx context.Context, s store.Store) {
				now := storeNow(t, ctx, s)
				insertTokens(t, ctx, s, token("t1", rc.uses, time.Time{}, time.Hour), token("t2", 0, time.Time{}, time.Hour))
				tokenID := "t1"
				if rc.noToken {
					tokenID = ""
				}
				j1 := withCredential(newJoin(tokenID, "node-1", "i1", "key-1", now.Add(-rc.firstAge)), rc.credential)
				first := mustJoin(t, ctx, s, j1).Instance
				if rc.between != nil {
					rc.between(t, ctx, s, first)
				}

				j2 := withCredential(newJoin(tokenID, "node-1", "i2", "key-1", now), rc.credential)
				j2.RetryWindow = time.Minute
				j2.NodeFreeAtRead = readFree
				if rc.mod != nil {
					rc.mod(&j2)
				}
				before := snapshot(t, ctx, s, "node-1")
				res, err := s.CommitJoin(ctx, j2)
				switch {
				case rc.retry:
					mustNil(t, "CommitJoin retry", err)
					wantEqual(t, "JoinResult", res, store.JoinResult{Instance: first, Retry: true})
				case rc.want != nil:
					wantErr(t, "CommitJoin", err, rc.want)
				default:
					mustNil(t, "CommitJoin", err)
					wantEqual(t, "JoinResult", res, store.JoinResult{
						Instance: wantInstance(j2, rc.superseded), Superseded: rc.superseded,
					})
					return
				}
				wantEqual(t, "state after the repeated join", snapshot(t, ctx, s, "node-1"), before)
			}})
		}
	}
	cases = append(cases,
		testCase{"credential is recorded and uses no token", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, token("t1", 1, time.Time{}, time.Hour))
			before, err := s.ListTokens(ctx)
			mustNil(t, "ListTokens", err)
			j := newJoin("", "node-1", "i1", "key-1", now)
			j.Credential = "psk-1"
			res := mustJoin(t, ctx, s, j)
			if res.Instance.TokenID != "psk-1" {
				t.Fatalf("instance TokenID %q, want the credential psk-1", res.Instance.TokenID)
			}
			certs, err := s.ListCertificates(ctx, "node-1")
			mustNil(t, "ListCertificates", err)
			if len(certs) != 1 || certs[0].TokenID != "psk-1" {
				t.Fatalf("certificates %+v, want one naming psk-1", certs)
			}
			after, err := s.ListTokens(ctx)
			mustNil(t, "ListTokens", err)
			wantEqual(t, "tokens", after, before)
		}},
		testCase{"token and credential together are refused", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, token("t1", 1, time.Time{}, time.Hour))
			j := newJoin("t1", "node-1", "i1", "key-1", now)
			j.Credential = "psk-1"
			if _, err := s.CommitJoin(ctx, j); err == nil {
				t.Fatal("CommitJoin with both a token and a credential succeeded")
			}
			if nodes := snapshot(t, ctx, s).Nodes; len(nodes) != 0 {
				t.Fatalf("nodes written: %+v", nodes)
			}
		}},
	)
	return cases
}

// withCredential makes j a join without a token, proved by credential;
// "" leaves j as it is.
func withCredential(j store.Join, credential string) store.Join {
	if credential != "" {
		j.TokenID, j.Credential = "", credential
		j.Instance.TokenID, j.Certificate.TokenID = credential, credential
		j.Instance.JoinMethod, j.Certificate.JoinMethod = store.JoinMethodPSK, store.JoinMethodPSK
	}
	return j
}

// rekey makes j certify pubKey(name) instead.
func rekey(j *store.Join, name string) {
	j.Instance.LastPublicKey = pubKey(name)
	j.Certificate.PublicKey = pubKey(name)
}

package enroll

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/ca"
)

// TestRefusalBeforeStoreLabelledByVerifiedCert: a refusal before the
// store is read (here, a token that does not exist) is audited as a
// refresh's (agent.refresh) only when the caller's certificate is one this
// authority issued for the node it names; a certificate signed elsewhere
// naming the node, or this authority's for another node, proves nothing,
// and the refusal is a join's (agent.join). The reason names the token
// either way.
func TestRefusalBeforeStoreLabelledByVerifiedCert(t *testing.T) {
	b := newBKEnv(t, 2, boundkeypair.ModeStandard)
	first, _ := b.register(t)
	chain, err := ca.ParseCertsPEM(first.ChainPEM)
	if err != nil {
		t.Fatal(err)
	}
	own := chain[0]
	forged := selfSignedAgentCert(t, "spiffe://test-abcdef/agent/node-1", "node-1")
	for _, tc := range []struct {
		name   string
		cert   *x509.Certificate
		node   string
		action string
	}{
		{"this authority's certificate of the node", own, "node-1", "agent.refresh"},
		{"a self-signed certificate naming the node", forged, "node-1", "agent.join"},
		{"this authority's certificate of another node", own, "node-2", "agent.join"},
		{"no certificate", nil, "node-1", "agent.join"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, der := csr(t)
			if _, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, BoundKeypairPayload{Token: "bot-gone", NodeID: tc.node,
				CSR: der, JoinState: first.JoinState, Cert: tc.cert}, answerWith(b.priv)); err == nil {
				t.Fatal("a join with an unknown token was not refused")
			}
			last := b.audit.lastRefused(t)
			if last.Action != tc.action {
				t.Errorf("action %q, want %s", last.Action, tc.action)
			}
			if !strings.Contains(last.Reason, "no token bot-gone") {
				t.Errorf("reason %q does not name the unknown token", last.Reason)
			}
		})
	}
}

func selfSignedAgentCert(t *testing.T, uri, cn string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: cn}, URIs: []*url.URL{u},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestDeletedTokenWayOutPasteable: the refusal of a refresh whose token
// was deleted names the muster bot add command with the deleted token's
// settings, read from the join state the agent presented, and the join
// the machine makes then, as commands to paste; without a join state it
// says the settings are not known.
func TestDeletedTokenWayOutPasteable(t *testing.T) {
	b := newBKEnv(t, 3, boundkeypair.ModeRelaxed)
	first, _ := b.register(t)
	if err := b.st.DeleteToken(t.Context(), "bot-1", setupLink); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, joinState, want string
	}{
		{"with its join state", first.JoinState, "if it was deleted (which ends refreshes): muster bot add node-1 --recovery-limit 3 --recovery-mode relaxed (the new token is named after its node: the agent joins with --bound-keypair node-1, not bot-1), then on the machine muster agent join --force --data ADIR --bound-keypair node-1 --registration-secret-file FILE"},
		{"without", "", "muster bot add node-1 (the new token is named after its node: the agent joins with --bound-keypair node-1, not bot-1) (the deleted token's settings are not known here"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, der := csr(t)
			if _, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1",
				CSR: der, JoinState: tc.joinState}, answerWith(b.priv)); err == nil {
				t.Fatal("a join with a deleted token was not refused")
			}
			last := b.audit.lastRefused(t)
			if !strings.Contains(last.Reason, tc.want) {
				t.Errorf("reason %q\nwant it to contain %q", last.Reason, tc.want)
			}
		})
	}
}

package agent

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"os"
	"reflect"
	"testing"
	"time"

	pkcs12 "software.sslmate.com/src/go-pkcs12"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/spiffeid"
)

// FuzzReadConfig: agent.yaml as anyone who can write it might leave it.
// What ReadConfig accepts writes back to the same settings; what it
// refuses is refused without quoting the file (it may hold a token).
func FuzzReadConfig(f *testing.F) {
	f.Add([]byte("authority: auth.example.com:7443\nnode: web-1\njoin_method: token\ntoken: abcdef.0123456789abcdef\n"))
	f.Add([]byte("ca_fingerprint: sha256:00\npsk: muster-psk:zz\ndiscovery: d:1\n"))
	f.Add([]byte("token: [1, 2\n"))
	f.Add([]byte("&a [*a, *a]"))
	f.Add([]byte("tokn: secretsecretsecret\n"))
	dir := Dir(f.TempDir())
	if err := dir.ensure(); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(dir.ConfigFile(), data, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := dir.ReadConfig()
		if err != nil {
			return
		}
		if err := dir.WriteConfig(c); err != nil {
			t.Fatalf("an accepted config does not write: %v", err)
		}
		back, err := dir.ReadConfig()
		if err != nil || !reflect.DeepEqual(back, c) {
			t.Fatalf("config changed in a round trip: %+v, then %+v (%v)", c, back, err)
		}
	})
}

// FuzzReadState: state.json, damaged or edited.
func FuzzReadState(f *testing.F) {
	f.Add([]byte(`{"node_id":"web-1","instance_id":"i","authority_id":"a","trust_domain":"td","authority":"h:1","generation":3,"join_method":"token","joined_at":"2026-01-02T03:04:05Z","last_renewal":null,"not_after":"2026-01-03T03:04:05Z","serial":"0a"}`))
	f.Add([]byte(`{"generation":1e400}`))
	f.Add([]byte(`{"joined_at":"yesterday"}`))
	f.Add([]byte(`[]`))
	dir := Dir(f.TempDir())
	if err := dir.ensure(); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(dir.StateFile(), data, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := dir.ReadState()
		if err != nil {
			return
		}
		if err := dir.writeState(s); err != nil {
			return // a time outside what JSON can hold is refused on write
		}
		back, err := dir.ReadState()
		if err != nil {
			t.Fatalf("a state written from an accepted one does not read: %v", err)
		}
		if back.NodeID != s.NodeID || back.Generation != s.Generation || !back.NotAfter.Equal(s.NotAfter) {
			t.Fatalf("state changed in a round trip: %+v, then %+v", s, back)
		}
	})
}

// FuzzDecodeChain: the PKCS#12 keystore the agent reads back (keystoreHolds)
// to see whether it holds the current certificate.
func FuzzDecodeChain(f *testing.F) {
	h, err := ca.Create("fuzz", time.Now())
	if err != nil {
		f.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	id, _ := spiffeid.New("fuzz", spiffeid.RoleAgent, "n1")
	leaf, err := h.Issuer(ca.RoleAgent).Issue(ca.LeafRequest{PublicKey: key.Public(), SPIFFEID: id.URL(), ClientAuth: true,
		NotBefore: time.Now(), TTL: time.Hour})
	if err != nil {
		f.Fatal(err)
	}
	p12, err := pkcs12.Modern.Encode(key, leaf, nil, "pass-word-0123456789")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(p12, "pass-word-0123456789")
	f.Add(p12, "wrong")
	f.Add([]byte{0x30, 0x80}, "")
	dir := Dir(f.TempDir())
	if err := dir.ensure(); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte, pass string) {
		os.WriteFile(dir.PKCS12File(), data, 0o600)
		os.WriteFile(dir.PKCS12PasswordFile(), []byte(pass), 0o600)
		if dir.keystoreHolds(leaf) {
			_, c, _, err := pkcs12.DecodeChain(data, pass)
			if err != nil || !c.Equal(leaf) {
				t.Fatal("keystoreHolds said yes to a keystore without the certificate")
			}
		}
	})
}

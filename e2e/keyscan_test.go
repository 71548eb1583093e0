package e2e

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"database/sql"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// keyFinding is a private key where custody says none may be: where it
// is and what it is.
type keyFinding struct{ where, what string }

// keyScan looks for private keys in an authority's data directory and in
// every row and column of its SQLite store.
//
//   - held are the public keys of the keys in custody: a PEM or DER
//     (PKCS#8, SEC1) private key anywhere under the directory whose public
//     key is one of them is a finding. (The directory legitimately holds
//     other private keys: the root's, the policy key, operator.pem.)
//   - known are private keys the test knows (an agent's, or in the scan's
//     own test those of a sealed build): their raw private scalar (ECDSA
//     D, 32 bytes) or seed (Ed25519, 32 bytes) found anywhere — a file's
//     bytes, a store value, or a value read as base64 — is a finding.
//   - in the store, any private key at all, PEM or DER, parsed or base64,
//     is a finding: the store keeps keys only sealed or as token objects.
type keyScan struct {
	held  map[string]crypto.PublicKey
	known map[string]crypto.Signer
	// filesKeys counts the private keys parsed from files, so that a scan
	// that looked in the wrong place (and found nothing) can be told.
	filesKeys int
	found     []keyFinding
}

func (s *keyScan) add(where, format string, a ...any) {
	s.found = append(s.found, keyFinding{where, fmt.Sprintf(format, a...)})
}

// scanAuthority scans every file under dir and, if dir holds muster.db,
// every value of every table in it.
func (s *keyScan) scanAuthority(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		s.scanBytes(path, data, false)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s.scanStore(t, filepath.Join(dir, "muster.db"))
}

// scanBytes looks in data for the known keys' secrets, PEM private keys
// and DER private keys; inStore makes any private key a finding, not only
// a held one's.
func (s *keyScan) scanBytes(where string, data []byte, inStore bool) {
	for what, k := range s.known {
		if sec := rawSecret(k); sec != nil && bytes.Contains(data, sec) {
			s.add(where, "the raw private key of %s", what)
		}
	}
	judge := func(kind string, k crypto.Signer) {
		if !inStore {
			s.filesKeys++
		}
		for what, pub := range s.held {
			if k.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(pub) {
				s.add(where, "the %s private key of the %s", kind, what)
				return
			}
		}
		if inStore {
			s.add(where, "a %s private key", kind)
		}
	}
	for rest := data; ; {
		i := bytes.Index(rest, []byte("-----BEGIN"))
		if i < 0 {
			break
		}
		b, r := pem.Decode(rest[i:])
		if b == nil {
			rest = rest[i+len("-----BEGIN"):]
			continue
		}
		rest = r
		if !strings.Contains(b.Type, "PRIVATE KEY") {
			continue
		}
		if k, err := parseAnyKey(b.Bytes); err == nil {
			judge("PEM", k)
		} else {
			s.add(where, "a PEM %s muster cannot parse: %v", b.Type, err)
		}
	}
	for _, der := range derSequences(data) {
		if k, err := parseAnyKey(der); err == nil {
			judge("DER", k)
		}
	}
}

// scanStore reads every value of every table of the SQLite store at path,
// as bytes and, for text that is base64, decoded.
func (s *keyScan) scanStore(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("no store to scan: %v", err)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var tables []string
	rows, err := db.Query(`SELECT name FROM sqlite_master WHERE type = 'table'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, n)
	}
	rows.Close()
	if len(tables) == 0 {
		t.Fatal("the store has no tables: the scan looked in the wrong place")
	}
	for _, table := range tables {
		rows, err := db.Query(`SELECT * FROM "` + table + `"`)
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		for n := 0; rows.Next(); n++ {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			for i, v := range vals {
				var b []byte
				switch v := v.(type) {
				case []byte:
					b = v
				case string:
					b = []byte(v)
				default:
					continue
				}
				where := fmt.Sprintf("store %s row %d column %s", table, n, cols[i])
				s.scanBytes(where, b, true)
				for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
					if d, err := enc.DecodeString(strings.TrimSpace(string(b))); err == nil && len(d) >= 32 {
						s.scanBytes(where+" (base64)", d, true)
						break
					}
				}
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
	}
}

// rawSecret is a key's private scalar or seed as it would sit in memory
// or in a careless encoding.
func rawSecret(k crypto.Signer) []byte {
	switch k := k.(type) {
	case *ecdsa.PrivateKey:
		b, err := k.Bytes()
		if err != nil {
			return nil
		}
		return b
	case ed25519.PrivateKey:
		return k.Seed()
	}
	return nil
}

// derSequences is every DER SEQUENCE in data of a private key's size (a
// header and length that fit in data), wherever it starts.
func derSequences(data []byte) [][]byte {
	var out [][]byte
	for i := 0; i+2 < len(data); i++ {
		if data[i] != 0x30 {
			continue
		}
		n, hdr := int(data[i+1]), 2
		switch {
		case n == 0x81 && i+2 < len(data):
			n, hdr = int(data[i+2]), 3
		case n == 0x82 && i+3 < len(data):
			n, hdr = int(data[i+2])<<8|int(data[i+3]), 4
		case n >= 0x80:
			continue
		}
		if n < 40 || n > 4096 || i+hdr+n > len(data) {
			continue
		}
		out = append(out, data[i:i+hdr+n])
	}
	return out
}

// privateKeysIn is every PEM private key in the files under dir, by file.
func privateKeysIn(t *testing.T, dir string) map[string]crypto.Signer {
	t.Helper()
	keys := map[string]crypto.Signer{}
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, _ := os.ReadFile(path)
		for rest := data; ; {
			var b *pem.Block
			if b, rest = pem.Decode(rest); b == nil {
				break
			}
			if k, err := parseAnyKey(b.Bytes); err == nil && strings.Contains(b.Type, "PRIVATE KEY") {
				keys[path] = k
			}
		}
		return nil
	})
	return keys
}

func parseAnyKey(der []byte) (crypto.Signer, error) {
	if k, err := x509.ParsePKCS8PrivateKey(der); err == nil {
		if s, ok := k.(crypto.Signer); ok {
			return s, nil
		}
	}
	return x509.ParseECPrivateKey(der)
}

// TestKeyScanFindsKeys: the scan the PKCS#11 tests rely on fails where
// keys are. On the sealed build the intermediates' keys are files in the
// data directory, which it reports; a raw scalar and a base64 PKCS#8 key
// written into a store row are reported too; and before that the store
// alone (every key in it sealed) has nothing to report.
func TestKeyScanFindsKeys(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	// A sealed init keeps the intermediates as files: ca/ROLE.crt, .key.
	held := map[string]crypto.PublicKey{}
	for _, role := range []string{"bootstrap", "server", "agent", "admin"} {
		data, err := os.ReadFile(filepath.Join(dir, "ca", role+".crt"))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := pem.Decode(data)
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		held["intermediate "+role] = cert.PublicKey
	}
	if len(held) != 4 {
		t.Fatalf("%d intermediates in the store, want 4", len(held))
	}
	agentKey := filepath.Join(dir, "ca", "agent.key")
	known := map[string]crypto.Signer{}
	for path, k := range privateKeysIn(t, filepath.Join(dir, "ca")) {
		known[path] = k
	}
	if known[agentKey] == nil {
		t.Fatalf("the sealed build has no %s", agentKey)
	}

	s := &keyScan{held: held, known: known}
	s.scanAuthority(t, dir)
	inFiles := map[string]bool{}
	for _, f := range s.found {
		if strings.HasPrefix(f.where, "store ") {
			t.Errorf("the sealed store: %s: %s", f.where, f.what)
			continue
		}
		if strings.Contains(f.what, "PEM private key of the intermediate") {
			inFiles[filepath.Base(f.where)] = true
		}
	}
	for _, role := range []string{"bootstrap", "server", "agent", "admin"} {
		if !inFiles[role+".key"] {
			t.Errorf("the scan did not report ca/%s.key on the sealed build: %+v", role, s.found)
		}
	}

	// Plant a raw scalar and a base64 PKCS#8 key in the store.
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalPKCS8PrivateKey(other)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "muster.db"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.Exec(`CREATE TABLE scan_probe (raw BLOB, text TEXT)`)
	if err == nil {
		_, err = db.Exec(`INSERT INTO scan_probe VALUES (?, ?)`, rawSecret(known[agentKey]), base64.StdEncoding.EncodeToString(der))
	}
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	s = &keyScan{held: held, known: known}
	s.scanAuthority(t, dir)
	var raw, pkcs8 bool
	for _, f := range s.found {
		raw = raw || f.where == "store scan_probe row 0 column raw" && f.what == "the raw private key of "+agentKey
		pkcs8 = pkcs8 || f.where == "store scan_probe row 0 column text (base64)" && f.what == "a DER private key"
	}
	if !raw || !pkcs8 {
		t.Errorf("planted in the store: raw scalar found %v, PKCS#8 found %v: %+v", raw, pkcs8, s.found)
	}
}

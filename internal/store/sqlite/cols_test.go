package sqlite

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/muster-dev/muster/internal/store"
)

// TestDecode: each table's decode function takes its columns in the
// table's order, a NULL as the zero value, and fails on a value of the
// wrong type or a row of the wrong width, naming the column.
func TestDecode(t *testing.T) {
	at := time.UnixMicro(1_700_000_000_123_456).UTC()
	us := at.UnixMicro()
	decode := map[string]func(cols) (any, error){
		"node":        func(c cols) (any, error) { return nodeFrom(c) },
		"instance":    func(c cols) (any, error) { return instanceFrom(c) },
		"certificate": func(c cols) (any, error) { return certificateFrom(c) },
		"lock":        func(c cols) (any, error) { return lockFrom(c) },
		"token":       func(c cols) (any, error) { return tokenFrom(c) },
	}
	tests := []struct {
		name, table string
		row         []any
		want        any
		wantErr     string
	}{
		{name: "node", table: "node", row: []any{"n1", "token", "t1", "i1", us, nil},
			want: store.Node{ID: "n1", JoinMethod: "token", TokenID: "t1", InstanceID: "i1", CreatedAt: at}},
		{name: "instance", table: "instance",
			row: []any{"i1", "n1", "psk", "", "i0", "current", int64(7), us, "s1", []byte{1}, []byte("pem"), us},
			want: store.Instance{ID: "i1", NodeID: "n1", JoinMethod: "psk", PreviousID: "i0", State: "current",
				Generation: 7, CreatedAt: at, LastSerial: "s1", LastPublicKey: []byte{1}, LastChainPEM: []byte("pem"),
				LastIssuedAt: at}},
		{name: "certificate", table: "certificate",
			row: []any{"s1", "n1", "i1", int64(2), "token", "t1", []byte{9}, us, us + 1, nil},
			want: store.Certificate{Serial: "s1", NodeID: "n1", InstanceID: "i1", Generation: 2, JoinMethod: "token",
				TokenID: "t1", PublicKey: []byte{9}, NotBefore: at, NotAfter: at.Add(time.Microsecond)}},
		{name: "lock", table: "lock", row: []any{"l1", "node", "n1", "why", "op", us, nil},
			want: store.Lock{ID: "l1", Kind: "node", Target: "n1", Reason: "why", CreatedBy: "op", CreatedAt: at}},
		{name: "token with labels", table: "token",
			row: []any{"t1", "token", []byte("c"), []byte("n"), int64(3), int64(1), us, "n1", "d", `{"a":"b"}`, "op", us, nil, "client"},
			want: store.Token{ID: "t1", JoinMethod: "token", Ciphertext: []byte("c"), Nonce: []byte("n"), UsesAllowed: 3,
				UsesCount: 1, ExpiresAt: at, NodeID: "n1", Description: "d", Labels: map[string]string{"a": "b"},
				CreatedBy: "op", CreatedAt: at}},
		{name: "token without labels", table: "token",
			row: []any{"t1", "token", []byte("c"), []byte("n"), int64(0), int64(0), nil, "", "", "{}", "op", us, us, "server"},
			want: store.Token{ID: "t1", JoinMethod: "token", Ciphertext: []byte("c"), Nonce: []byte("n"),
				CreatedBy: "op", CreatedAt: at, LastUsedAt: at, SVIDUsage: "server"}},
		{name: "text in an integer column", table: "certificate",
			row:     []any{"s1", "n1", "i1", "2", "token", "t1", []byte{9}, us, us, us},
			wantErr: "column 3: cannot store string in int64"},
		{name: "text in a time column", table: "node", row: []any{"n1", "token", "t1", "i1", us, "now"},
			wantErr: "column 5: cannot store string in time"},
		{name: "an integer in a text column", table: "lock", row: []any{"l1", int64(1), "n1", "why", "op", us, nil},
			wantErr: "column 1: cannot store int64 in string"},
		{name: "a row too short", table: "node", row: []any{"n1", "token", "t1", "i1", us},
			wantErr: "5 columns read, more taken"},
		{name: "a row too long", table: "lock", row: []any{"l1", "node", "n1", "why", "op", us, nil, "extra"},
			wantErr: "8 columns read, 7 taken"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decode[tt.table](cols{v: tt.row})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("decoded (-want +got):\n%s", d)
			}
		})
	}
}

// TestDecodeAllocations: decoding a row allocates nothing: the strings
// and byte slices are the row's, and the struct is returned by value (a
// Scan(&field, …) through the scanner interface moved the struct and each
// time column's holder to the heap).
func TestDecodeAllocations(t *testing.T) {
	us := time.Now().UnixMicro()
	node := []any{"n1", "token", "t1", "i1", us, us}
	inst := []any{"i1", "n1", "psk", "", "", "current", int64(7), us, "s1", []byte{1}, []byte("pem"), us}
	cert := []any{"s1", "n1", "i1", int64(2), "token", "t1", []byte{9}, us, us, us}
	lock := []any{"l1", "node", "n1", "why", "op", us, nil}
	tok := []any{"t1", "token", []byte("c"), []byte("n"), int64(3), int64(1), us, "n1", "d", "{}", "op", us, nil, "client"}
	for name, f := range map[string]func() error{
		"node":        func() error { _, err := nodeFrom(cols{v: node}); return err },
		"instance":    func() error { _, err := instanceFrom(cols{v: inst}); return err },
		"certificate": func() error { _, err := certificateFrom(cols{v: cert}); return err },
		"lock":        func() error { _, err := lockFrom(cols{v: lock}); return err },
		"token":       func() error { _, err := tokenFrom(cols{v: tok}); return err },
	} {
		if err := f(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n := testing.AllocsPerRun(100, func() { _ = f() }); n != 0 {
			t.Errorf("decoding a %s: %v allocations, want 0", name, n)
		}
	}
}

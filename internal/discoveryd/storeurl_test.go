package discoveryd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// StoreURL: --store wins; else the URL discovery.addr records; else
// DIR/discovery.db. One recorded without its user is refused, asking for
// --store.
func TestStoreURL(t *testing.T) {
	const pg = "postgres://muster@db/discovery"
	for _, tt := range []struct {
		name, addr, given string
		want              string // "" : the default
		fromRecord        bool
		wantErr           string
	}{
		{name: "no discovery.addr", want: ""},
		{name: "given", addr: `{"issuer":"https://d:7450","store":"` + pg + `"}`, given: "postgres://other@db/x", want: "postgres://other@db/x"},
		{name: "recorded", addr: `{"issuer":"https://d:7450","store":"` + pg + `"}`, want: pg, fromRecord: true},
		{name: "none recorded", addr: `{"issuer":"https://d:7450"}`, want: ""},
		{name: "recorded without its user", addr: `{"issuer":"https://d:7450","store":"postgres://…@"}`, wantErr: "--store URL"},
		{name: "corrupt", addr: `{`, wantErr: "corrupt"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := Dir(t.TempDir())
			if tt.addr != "" {
				if err := os.WriteFile(filepath.Join(string(d), "discovery.addr"), []byte(tt.addr), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got, fromRecord, err := d.StoreURL(tt.given)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("StoreURL: %q, %v; want an error saying %q", got, err, tt.wantErr)
				}
				return
			}
			want := tt.want
			if want == "" {
				want = d.DefaultStoreURL()
			}
			if err != nil || got != want || fromRecord != tt.fromRecord {
				t.Errorf("StoreURL(%q) = %q, %v, %v; want %q, %v", tt.given, got, fromRecord, err, want, tt.fromRecord)
			}
		})
	}
}

package joinuri

import (
	"errors"
	"strings"
	"testing"
)

const fp = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestParse(t *testing.T) {
	hex64 := strings.Repeat("ab", 32)
	tests := []struct {
		name string
		in   string
		want func(URI) bool
	}{
		{"token", "muster+token://abcdef.0123456789abcdef@auth.example:7443?fingerprint=" + fp + "&node=n1",
			func(u URI) bool {
				return u.Method == MethodToken && u.Token.ID == "abcdef" && u.Address == "auth.example:7443" && u.Fingerprint == fp && u.Node == "n1"
			}},
		{"token without fingerprint", "muster+token://abcdef.0123456789abcdef@127.0.0.1:7443",
			func(u URI) bool { return u.Fingerprint == "" }},
		{"token on IPv6", "muster+token://abcdef.0123456789abcdef@[::1]:7443",
			func(u URI) bool { return u.Address == "[::1]:7443" }},
		{"psk", "muster+psk://" + hex64 + "@h:1?fingerprint=" + fp,
			func(u URI) bool { return u.Method == MethodPSK && u.PSK.Reveal() == "muster-psk:"+hex64 }},
		{"psk with discovery", "muster+psk://" + hex64 + "@disc:7450?fingerprint=" + fp + "&authority_id=prod-a3f2e1",
			func(u URI) bool { return u.AuthorityID == "prod-a3f2e1" }},
		{"psk with pinned discovery", "muster+psk://" + hex64 + "@disc:7450?fingerprint=" + fp + "&authority_id=prod-a3f2e1&discovery_fingerprint=" + fp,
			func(u URI) bool { return u.AuthorityID == "prod-a3f2e1" && u.DiscoveryFingerprint == fp }},
		{"bound keypair", "muster+bound-keypair://bot-1@h:1?fingerprint=" + fp,
			func(u URI) bool { return u.KeypairName == "bot-1" && u.KeypairSecret == "" }},
		{"bound keypair with secret", "muster+bound-keypair://bot-1:s%40cret@h:1?fingerprint=" + fp,
			func(u URI) bool { return u.KeypairSecret == "s@cret" }},
		{"upper-case fingerprint", "muster+token://abcdef.0123456789abcdef@h:1?fingerprint=sha256:" + strings.ToUpper(fp[7:]),
			func(u URI) bool { return u.Fingerprint == fp }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, err := Parse(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.want(u) {
				t.Fatalf("Parse = %+v", u)
			}
			again, err := Parse(u.Reveal())
			if err != nil || again.Reveal() != u.Reveal() {
				t.Fatalf("round trip: %q, %v", u.Reveal(), err)
			}
			if u.Fingerprint != "" && !strings.Contains(u.Reveal(), "fingerprint="+u.Fingerprint) {
				t.Fatalf("fingerprint not written as is: %s", u.Reveal())
			}
			if strings.Contains(u.String(), "0123456789abcdef@") || strings.Contains(u.String(), hex64) {
				t.Fatalf("String leaks the secret: %s", u)
			}
		})
	}
}

func TestParseRefusals(t *testing.T) {
	tok := "abcdef.0123456789abcdef"
	for _, in := range []string{
		"", "https://" + tok + "@h:1", "muster+token:" + tok, "muster+token://h:1",
		"muster+token://" + tok + "@h", "muster+token://" + tok + "@h:0", "muster+token://" + tok + "@:1",
		"muster+token://" + tok + "@h:1/path", "muster+token://" + tok + "@h:1#frag",
		"muster+token://" + tok + ":x@h:1", "muster+token://abc.def@h:1",
		"muster+token://" + tok + "@h:1?fingerprint=sha1:00", "muster+token://" + tok + "@h:1?node=Bad_Node",
		"muster+token://" + tok + "@h:1?color=red", "muster+token://" + tok + "@h:1?node=a&node=b",
		"muster+psk://" + strings.Repeat("ab", 32) + "@h:1", // no fingerprint
		"muster+psk://nothex@h:1?fingerprint=" + fp,
		"muster+psk://" + strings.Repeat("ab", 32) + "@h:1?fingerprint=" + fp + "&discovery_fingerprint=" + fp, // no authority_id
		"muster+psk://" + strings.Repeat("ab", 32) + "@h:1?fingerprint=" + fp + "&authority_id=a-b&discovery_fingerprint=x",
		"muster+bound-keypair://Bad@h:1?fingerprint=" + fp,
		"muster+bound-keypair://bot:@h:1?fingerprint=" + fp,
	} {
		u, err := Parse(in)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("Parse(%q) = %+v, %v; want ErrInvalid", in, u, err)
			continue
		}
		if strings.Contains(err.Error(), "0123456789abcdef") {
			t.Errorf("error leaks the secret: %v", err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add("muster+token://abcdef.0123456789abcdef@h:1?fingerprint=" + fp + "&node=n")
	f.Add("muster+psk://" + strings.Repeat("0", 64) + "@h:1?fingerprint=" + fp)
	f.Add("muster+bound-keypair://b:s@h:1?fingerprint=" + fp + "&authority_id=a")
	f.Fuzz(func(t *testing.T, s string) {
		u, err := Parse(s)
		if err != nil {
			return
		}
		again, err := Parse(u.Reveal())
		if err != nil {
			t.Fatalf("Reveal of a parsed URI does not parse: %v", err)
		}
		if again.Reveal() != u.Reveal() {
			t.Fatalf("not stable: %q vs %q", again.Reveal(), u.Reveal())
		}
	})
}

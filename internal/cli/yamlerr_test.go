package cli

import (
	"bytes"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// FuzzExplainYAML: whatever a settings file holds, the error names no Go
// type and explaining it never panics.
func FuzzExplainYAML(f *testing.F) {
	for _, s := range []string{"listen: a:1\n", "bogus: 1\n", "bootstrap: {psk_required: x}\n",
		"discovery:\n  endpoints: [a, {b: c}]\n", "trusted_proxies: 1\n", "- a\n- b\n", "log: [1]\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var c authorityConfig
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		err := dec.Decode(&c)
		if err == nil {
			return
		}
		msg := explainYAML(data, err).Error()
		for _, leak := range []string{"cli.", "discovery.Policy", "discovery.Rate"} {
			if strings.Contains(msg, leak) && strings.Contains(err.Error(), "into") {
				t.Errorf("explainYAML(%q) = %q, names a Go type", data, msg)
			}
		}
	})
}

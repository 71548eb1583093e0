package cli

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// yaml.v3 reports a wrong key or value with the Go type it decodes into
// ("field foo not found in type cli.authorityConfig", "cannot unmarshal
// !!str `x` into bool"): words for the programmer. explainYAML rewrites
// them to name the setting, by its dotted path in the file, and what it
// takes.
var (
	yamlLine      = regexp.MustCompile(`(?s)^line (\d+): (.*)$`)
	yamlUnknown   = regexp.MustCompile(`^field (\S+) not found in type `)
	yamlWrongKind = regexp.MustCompile("(?s)^cannot unmarshal !!\\w+ `(.*)` into (.+)$")
)

func explainYAML(data []byte, err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil {
		return err
	}
	msgs := make([]string, 0, len(te.Errors))
	for _, e := range te.Errors {
		m := yamlLine.FindStringSubmatch(e)
		if m == nil {
			msgs = append(msgs, e)
			continue
		}
		line, _ := strconv.Atoi(m[1])
		path := settingAt(&root, "", line, "")
		if path == "" {
			path = "the file"
		}
		switch {
		case yamlUnknown.MatchString(m[2]):
			key := yamlUnknown.FindStringSubmatch(m[2])[1]
			msgs = append(msgs, fmt.Sprintf("line %d: unknown setting %q", line, settingAt(&root, "", line, key)))
		case yamlWrongKind.MatchString(m[2]):
			w := yamlWrongKind.FindStringSubmatch(m[2])
			msgs = append(msgs, fmt.Sprintf("line %d: %s: want %s, not %q", line, path, kindOf(w[2]), w[1]))
		default:
			msgs = append(msgs, fmt.Sprintf("line %d: %s: invalid value", line, path))
		}
	}
	return errors.New(strings.Join(msgs, "; "))
}

// settingAt is the dotted path (discovery.policy.max_ttl, endpoints[1]) of
// the deepest key or list item on line; with key set, of the key of that
// name (a flow mapping holds several keys on one line).
func settingAt(n *yaml.Node, prefix string, line int, key string) string {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if p := settingAt(c, prefix, line, key); p != "" {
				return p
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if prefix != "" {
				p = prefix + "." + k.Value
			}
			if deeper := settingAt(v, p, line, key); deeper != "" {
				return deeper
			}
			if k.Line == line && (key == "" || k.Value == key) {
				return p
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", prefix, i)
			if deeper := settingAt(c, p, line, key); deeper != "" {
				return deeper
			}
			if c.Line == line && c.Kind == yaml.ScalarNode && key == "" {
				return p
			}
		}
	}
	return ""
}

// kindOf names in words the Go type yaml.v3 reported.
func kindOf(goType string) string {
	switch {
	case goType == "bool":
		return "true or false"
	case goType == "time.Duration":
		return "a duration such as 30s, 15m or 24h"
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"), strings.HasPrefix(goType, "float"):
		return "a number"
	case goType == "string":
		return "a single value"
	case strings.HasPrefix(goType, "[]"):
		return "a list"
	}
	return "a mapping of settings"
}

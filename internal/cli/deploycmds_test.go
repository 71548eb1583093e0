package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// The Helm chart's containers (deploy/helm/muster/templates) are checked
// without helm: a template is not YAML until rendered, so each container's
// keys are read line by line, where they are written.
//
//   - A template action becomes its value where it is a plain reference to
//     values.yaml ({{ .Values.authority.initImage }} is busybox:1.36, also
//     piped to quote) or
//     the image helper ({{ include "muster.image" . }} is image.repository
//     and a tag), else the placeholder TEMPLATE…, which is not parsed. A
//     line of only actions ({{- if … }}, {{- end }}) is skipped: every
//     branch is read, each being a possible render.
//   - A container is the keys at one indentation of a list item (from its
//     "- " on). It runs muster when its image is named muster (and it has
//     no command) or its command's first word is muster; its args follow.
//     Each of its env entries named MUSTER_* is the flag whose variable it
//     is (envNameOf: withEnv reads it as that flag), checked with its
//     value as "--flag VALUE" (valueFrom: a placeholder); a variable no
//     flag has must be one the command's help names (MUSTER_JOIN_URI), or
//     it is reported.
//   - args:/command:/env: may be flow ([…], {…}) or block lists; their text
//     is the rest of the key's line and the lines indented deeper, parsed
//     as YAML once the actions are replaced.
//
// The packaged units' ExecStart lines are checked with the docs
// (TestDocCommandsExist); here each is checked again with the variables its
// EnvironmentFile (packaging/deb/X.env, installed as /etc/muster/X.env)
// sets or shows commented out, read the same way as a container's env. The
// Dockerfile's exec-form ENTRYPOINT/CMD/HEALTHCHECK CMD lines that run
// muster (commented ones too: suggestions to paste) are checked as well.
//
// Not covered: what an include other than the image helper expands to (the
// chart's pod spec is in _helpers.tpl's "muster.authorityPod", read there
// directly) and values that a template computes (printf, default): those are
// placeholders. scripts/check-helm renders the chart with helm in CI.

// TestDeployCommandsExist checks the muster commands of the Helm chart's
// containers, the variables the packaged units' EnvironmentFile gives their
// ExecStart command, and the Dockerfile's.
func TestDeployCommandsExist(t *testing.T) {
	root := newRoot(&Env{})
	values, err := os.ReadFile("../../deploy/helm/muster/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	templates, err := filepath.Glob("../../deploy/helm/muster/templates/*")
	if err != nil || len(templates) == 0 {
		t.Fatalf("no chart templates: %v", err)
	}
	perFile := map[string]int{}
	for _, f := range templates {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(f, "../../")
		cmds, problems := chartCommands(root, name, string(data), values)
		for _, p := range problems {
			t.Error(p)
		}
		for _, c := range cmds {
			perFile[filepath.Base(f)]++
			t.Logf("%s:%d: %s", c.file, c.line, c.text)
			if p := checkDocCommand(root, c); p != "" {
				t.Errorf("%s:%d: %s: %s", c.file, c.line, c.text, p)
			}
		}
	}
	// The authority's pod (in _helpers.tpl) and the agent's DaemonSet each
	// run muster once; none found means the reading broke.
	if perFile["_helpers.tpl"] != 1 || perFile["agent.yaml"] != 1 {
		t.Errorf("muster containers found per template %v, want one in _helpers.tpl and one in agent.yaml", perFile)
	}

	units, err := filepath.Glob("../../packaging/systemd/*.service")
	if err != nil || len(units) == 0 {
		t.Fatalf("no packaged systemd units: %v", err)
	}
	envFiles := 0
	for _, f := range units {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(f, "../../")
		lines := strings.Split(string(data), "\n")
		cmds := unitCommands(name, 1, lines)
		if len(cmds) != 1 {
			t.Fatalf("%s: %d muster commands in ExecStart, want 1", name, len(cmds))
		}
		for _, l := range lines {
			ef, ok := strings.CutPrefix(strings.TrimSpace(l), "EnvironmentFile=")
			if !ok {
				continue
			}
			// The package installs packaging/deb/X.env as /etc/muster/X.env
			// (packaging/nfpm.yaml).
			src := filepath.Join("../../packaging/deb", filepath.Base(strings.TrimPrefix(ef, "-")))
			env, err := os.ReadFile(src)
			if err != nil {
				t.Fatalf("%s: EnvironmentFile %s: %v", name, ef, err)
			}
			envFiles++
			c, problems := withEnvFile(root, cmds[0], strings.TrimPrefix(src, "../../"), string(env))
			for _, p := range problems {
				t.Error(p)
			}
			t.Logf("%s with %s: %s", name, strings.TrimPrefix(src, "../../"), c.text)
			if p := checkDocCommand(root, c); p != "" {
				t.Errorf("%s with %s: %s: %s", name, strings.TrimPrefix(src, "../../"), c.text, p)
			}
		}
	}
	if envFiles != len(units) {
		t.Errorf("%d EnvironmentFile= lines in %d units, want one each", envFiles, len(units))
	}

	df, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	cmds := dockerfileCommands("Dockerfile", string(df))
	for _, c := range cmds {
		t.Logf("%s:%d: %s", c.file, c.line, c.text)
		if p := checkDocCommand(root, c); p != "" {
			t.Errorf("%s:%d: %s: %s", c.file, c.line, c.text, p)
		}
	}
	// Each image's ENTRYPOINT muster with its CMD, and the HEALTHCHECK
	// suggested in a comment.
	if len(cmds) < 3 {
		t.Errorf("%d muster commands in the Dockerfile, want at least 3", len(cmds))
	}
}

var dockerExec = regexp.MustCompile(`^#?\s*(ENTRYPOINT|CMD|HEALTHCHECK(?:\s+--\S+)*\s+CMD)\s+(\[.*\])\s*$`)

// dockerfileCommands returns the muster commands of a Dockerfile's exec-form
// ENTRYPOINT, CMD and HEALTHCHECK CMD lines (commented ones too: they are
// suggestions to paste): a CMD after a muster ENTRYPOINT gives its
// arguments.
func dockerfileCommands(file, df string) []docCommand {
	var cmds []docCommand
	entry := false
	for i, l := range strings.Split(df, "\n") {
		if strings.HasPrefix(l, "FROM ") {
			entry = false
		}
		m := dockerExec.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		var argv []string
		if err := yaml.Unmarshal([]byte(m[2]), &argv); err != nil || len(argv) == 0 {
			continue
		}
		words := func(ss []string) []docWord {
			var ws []docWord
			for _, s := range ss {
				ws = append(ws, docWord{s: s, literal: !strings.ContainsAny(s, "$…")})
			}
			return ws
		}
		switch {
		case m[1] == "ENTRYPOINT":
			entry = isMuster(argv[0])
			if entry && len(argv) > 1 {
				cmds = append(cmds, docCommand{file: file, line: i + 1, text: strings.Join(argv, " "), words: words(argv[1:])})
			}
		case m[1] == "CMD" && entry:
			cmds = append(cmds, docCommand{file: file, line: i + 1, text: "muster " + strings.Join(argv, " "), words: words(argv)})
		case isMuster(argv[0]):
			cmds = append(cmds, docCommand{file: file, line: i + 1, text: strings.Join(argv, " "), words: words(argv[1:])})
		}
	}
	return cmds
}

var (
	templateAction = regexp.MustCompile(`\{\{-?\s*(.*?)\s*-?\}\}`)
	valuesRef      = regexp.MustCompile(`^\.Values((?:\.[A-Za-z0-9_]+)+)(\s*\|\s*quote)?$`)
	chartKey       = regexp.MustCompile(`^(\s*)(- )?([A-Za-z_][A-Za-z0-9_]*):(.*)$`)
)

// renderActions replaces a template line's actions (see the comment at the
// top of this file).
func renderActions(line string, values *yaml.Node) string {
	return templateAction.ReplaceAllStringFunc(line, func(a string) string {
		expr := templateAction.FindStringSubmatch(a)[1]
		if expr == `include "muster.image" .` {
			if repo := valueAt(values, ".image.repository"); repo != "" {
				return repo + ":TAG…"
			}
		}
		if m := valuesRef.FindStringSubmatch(expr); m != nil {
			if v := valueAt(values, m[1]); v != "" {
				return v
			}
		}
		return "TEMPLATE…"
	})
}

// valueAt returns the scalar at path (.a.b) in values.yaml, or "".
func valueAt(values *yaml.Node, path string) string {
	n := values
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	for _, k := range strings.Split(strings.TrimPrefix(path, "."), ".") {
		var next *yaml.Node
		for i := 0; n.Kind == yaml.MappingNode && i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == k {
				next = n.Content[i+1]
			}
		}
		if next == nil {
			return ""
		}
		n = next
	}
	if n.Kind != yaml.ScalarNode {
		return ""
	}
	return n.Value
}

// chartLine is one line of a template, its actions rendered.
type chartLine struct {
	n      int // 1-based
	text   string
	indent int // column of its key (after a "- ")
	item   bool
	key    string
}

// chartCommands returns the muster commands of one template's containers,
// and the problems of their environments.
func chartCommands(root *cobra.Command, file, tpl string, valuesYAML []byte) ([]docCommand, []string) {
	var values yaml.Node
	if err := yaml.Unmarshal(valuesYAML, &values); err != nil {
		return nil, []string{fmt.Sprintf("values.yaml: %v", err)}
	}
	var lines []chartLine
	for i, raw := range strings.Split(tpl, "\n") {
		if strings.TrimSpace(templateAction.ReplaceAllString(raw, "")) == "" && strings.TrimSpace(raw) != "" {
			continue // only actions: if, else, end, define, include … | nindent
		}
		l := chartLine{n: i + 1, text: renderActions(raw, &values), indent: -1}
		if m := chartKey.FindStringSubmatch(l.text); m != nil && !strings.HasPrefix(strings.TrimSpace(l.text), "#") {
			l.indent, l.item, l.key = len(m[1])+len(m[2]), m[2] != "", m[3]
		}
		lines = append(lines, l)
	}
	var cmds []docCommand
	var problems []string
	for i, l := range lines {
		if l.key != "image" && l.key != "command" {
			continue
		}
		keys := containerKeys(lines, i)
		if keys["command"] >= 0 && l.key == "image" {
			continue // read at its command
		}
		var words []docWord
		runs := false
		at := l.n
		if c := keys["command"]; c >= 0 {
			seq := keyValue(lines, c)
			if len(seq) == 0 || !isMuster(seq[0].s) {
				continue
			}
			words, runs = seq[1:], true
		} else {
			v := strings.TrimSpace(strings.SplitN(l.text, "image:", 2)[1])
			v = strings.Trim(v, `"'`)
			ref, _, _ := strings.Cut(v[strings.LastIndex(v, "/")+1:], ":")
			runs = ref == "muster"
		}
		if !runs {
			continue
		}
		if a := keys["args"]; a >= 0 {
			words = append(words, keyValue(lines, a)...)
			at = lines[a].n
		}
		c := docCommand{file: file, line: at, words: words}
		if e := keys["env"]; e >= 0 {
			var ps []string
			c, ps = withEnvEntries(root, c, file, envEntries(lines, e))
			problems = append(problems, ps...)
		}
		c.text = "muster " + joinWords(c.words)
		cmds = append(cmds, c)
	}
	return cmds, problems
}

// containerKeys returns the line index of each key of the list item (or
// mapping) the key on line i belongs to, -1 for those it has not.
func containerKeys(lines []chartLine, i int) map[string]int {
	keys := map[string]int{"image": -1, "command": -1, "args": -1, "env": -1}
	ind := lines[i].indent
	for j := i; j >= 0; j-- { // up to the item's "- "
		if lines[j].indent >= 0 && lines[j].indent < ind {
			break
		}
		if lines[j].indent == ind {
			if _, ok := keys[lines[j].key]; ok {
				keys[lines[j].key] = j
			}
			if lines[j].item {
				break
			}
		}
	}
	for j := i + 1; j < len(lines); j++ {
		if lines[j].indent >= 0 && (lines[j].indent < ind || lines[j].indent == ind && lines[j].item) {
			break
		}
		if lines[j].indent == ind {
			if _, ok := keys[lines[j].key]; ok {
				keys[lines[j].key] = j
			}
		}
	}
	return keys
}

// keyYAML returns the YAML value of the key on line i: the rest of its line
// and the lines indented deeper, as a document "key: value".
// The second result maps the value's lines (from 1) to the template's.
func keyYAML(lines []chartLine, i int) (*yaml.Node, []int, error) {
	l := lines[i]
	_, rest, _ := strings.Cut(l.text, l.key+":")
	body, at := []string{"v:" + rest}, []int{0, l.n}
	for j := i + 1; j < len(lines); j++ {
		if lines[j].indent >= 0 && lines[j].indent <= l.indent {
			break
		}
		body, at = append(body, lines[j].text), append(at, lines[j].n)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(strings.Join(body, "\n")), &doc); err != nil {
		return nil, nil, err
	}
	if len(doc.Content) == 0 || len(doc.Content[0].Content) < 2 {
		return nil, nil, fmt.Errorf("no value")
	}
	return doc.Content[0].Content[1], at, nil
}

// keyValue returns a args:/command: list's words (none if it is no list).
func keyValue(lines []chartLine, i int) []docWord {
	v, _, err := keyYAML(lines, i)
	if err != nil || v.Kind != yaml.SequenceNode {
		return []docWord{{s: fmt.Sprintf("(%s: not a list of strings: %v)", lines[i].key, err), literal: true}}
	}
	var words []docWord
	for _, w := range v.Content {
		words = append(words, docWord{s: w.Value, literal: !strings.ContainsAny(w.Value, "$…")})
	}
	return words
}

type envEntry struct {
	line        int
	name, value string
	literal     bool
}

// envEntries returns an env: list's entries.
func envEntries(lines []chartLine, i int) []envEntry {
	v, at, err := keyYAML(lines, i)
	if err != nil || v.Kind != yaml.SequenceNode {
		return []envEntry{{line: lines[i].n, name: fmt.Sprintf("(env: not a list: %v)", err)}}
	}
	var es []envEntry
	for _, item := range v.Content {
		e := envEntry{line: at[min(item.Line, len(at)-1)], value: "VALUE…"}
		for k := 0; item.Kind == yaml.MappingNode && k+1 < len(item.Content); k += 2 {
			switch item.Content[k].Value {
			case "name":
				e.name = item.Content[k+1].Value
			case "value":
				e.value = item.Content[k+1].Value
				e.literal = !strings.Contains(e.value, "…")
			}
		}
		es = append(es, e)
	}
	return es
}

// withEnvEntries adds to c each MUSTER_* variable as the flag it sets, and
// returns the variables its command does not read.
func withEnvEntries(root *cobra.Command, c docCommand, where string, es []envEntry) (docCommand, []string) {
	cmd := root
	for _, w := range c.words {
		sub := childNamed(cmd, w.s)
		if sub == nil {
			break
		}
		cmd = sub
	}
	cmd.InheritedFlags()
	var problems []string
	words := append([]docWord(nil), c.words...)
	for _, e := range es {
		if !strings.HasPrefix(e.name, "MUSTER_") {
			if strings.HasPrefix(e.name, "(") {
				problems = append(problems, fmt.Sprintf("%s:%d: %s", where, e.line, e.name))
			}
			continue
		}
		var flag *pflag.Flag
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			if envNameOf(f) == e.name {
				flag = f
			}
		})
		switch {
		case flag != nil && !strings.Contains(flag.Usage, "(env "+e.name+")"):
			problems = append(problems, fmt.Sprintf("%s:%d: %s would set --%s, but %q does not read its flags from the environment", where, e.line, e.name, flag.Name, cmd.CommandPath()))
		case flag != nil:
			words = append(words, docWord{s: "--" + flag.Name, literal: true}, docWord{s: e.value, literal: e.literal})
		case !strings.Contains(cmd.Long, e.name):
			problems = append(problems, fmt.Sprintf("%s:%d: %s is not a variable %q reads (no flag's, nor named in its help)", where, e.line, e.name, cmd.CommandPath()))
		}
	}
	c.words = words
	c.text = "muster " + joinWords(words)
	return c, problems
}

// withEnvFile adds to a unit's command the MUSTER_* variables its
// EnvironmentFile sets, or shows commented out as examples.
func withEnvFile(root *cobra.Command, c docCommand, file, env string) (docCommand, []string) {
	var es []envEntry
	for i, l := range strings.Split(env, "\n") {
		l = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "#"))
		name, value, ok := strings.Cut(l, "=")
		if !ok || !envAssign.MatchString(name+"=") || strings.Contains(name, " ") {
			continue
		}
		value = unquoteWord(value)
		es = append(es, envEntry{line: i + 1, name: name, value: value, literal: literalWord(value) && !strings.Contains(value, "...")})
	}
	return withEnvEntries(root, c, file, es)
}

// TestDeployCommandChecker shows the chart and env-file reading fails on
// what a template or an env file can get wrong.
func TestDeployCommandChecker(t *testing.T) {
	root := newRoot(&Env{})
	values := "image: {repository: registry.example/muster}\nagent: {conns: many, port: 9464, img: busybox:1.36}\n"
	for _, tc := range []struct {
		name, tpl string
		want      []string // problems, as substrings, in order
	}{
		{"wrong subcommand in args", "containers:\n  - name: a\n    image: {{ include \"muster.image\" . }}\n    args: [\"agent\", \"rnu\"]\n",
			[]string{`x.yaml:4: muster agent rnu: "muster agent" runs only its help: no subcommand "rnu"`}},
		{"wrong flag in block args", "spec:\n  containers:\n    - image: {{ include \"muster.image\" . }}\n      imagePullPolicy: IfNotPresent\n      args:\n        - authority\n        {{- if .Values.x }}\n        - --listn\n        {{- end }}\n        - :7443\n",
			[]string{`x.yaml:5: muster authority --listn :7443: unknown flag --listn`}},
		{"wrong variable", "containers:\n  - image: muster:v1\n    args: [authority]\n    env:\n      - {name: MUSTER_LISTEN, value: \"0.0.0.0:7443\"}\n      - name: MUSTER_AGENT_CERT_TTLS\n        value: 24h\n",
			[]string{`x.yaml:6: MUSTER_AGENT_CERT_TTLS is not a variable "muster authority" reads`}},
		{"variable of a command that reads none", "containers:\n  - image: muster:v1\n    args: [token, list]\n    env:\n      - {name: MUSTER_LIMIT, value: \"3\"}\n",
			[]string{`x.yaml:5: MUSTER_LIMIT would set --limit, but "muster token list" does not read its flags from the environment`}},
		{"value from values.yaml that does not parse", "containers:\n  - image: muster:v1\n    args: [authority]\n    env:\n      - {name: MUSTER_MAX_CONNECTIONS, value: {{ .Values.agent.conns | quote }}}\n",
			[]string{`invalid value "many" for --max-connections`}},
		{"wrong flag after a command naming muster", "containers:\n  - name: a\n    image: {{ .Values.agent.img }}\n    command: [\"/usr/bin/muster\", \"agent\", \"status\"]\n    args: [\"--bogus\"]\n",
			[]string{`unknown flag --bogus`}},
		{"other containers are not muster", "containers:\n  - name: a\n    image: {{ .Values.agent.img }}\n    command: [\"sh\", \"-c\", \"muster --bogus\"]\n    args: [\"--bogus\"]\n  - image: {{ .Values.agent.img }}\n    args: [\"--bogus\"]\n    env:\n      - {name: MUSTER_BOGUS, value: x}\n", nil},
		{"right containers", "containers:\n  - name: agent\n    image: {{ include \"muster.image\" . }}\n    args: [\"agent\", \"run\"]\n    env:\n      - {name: MUSTER_AGENT_DATA, value: /var/lib/muster-agent}\n      - {name: MUSTER_METRICS_LISTEN, value: {{ printf \"0.0.0.0:%d\" (int .Values.agent.port) | quote }}}\n      - name: MUSTER_JOIN_URI\n        valueFrom: {secretKeyRef: {name: s, key: join-uri}}\n      - {name: OTHER, value: x}\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmds, problems := chartCommands(root, "x.yaml", tc.tpl, []byte(values))
			for _, c := range cmds {
				if p := checkDocCommand(root, c); p != "" {
					problems = append(problems, fmt.Sprintf("%s:%d: %s: %s", c.file, c.line, c.text, p))
				}
			}
			if len(cmds) == 0 && tc.want != nil {
				t.Fatalf("no muster container found")
			}
			if len(problems) != len(tc.want) {
				t.Fatalf("problems %q, want %q (commands %v)", problems, tc.want, cmds)
			}
			for i := range problems {
				if !strings.Contains(problems[i], tc.want[i]) {
					t.Errorf("problem %q, want one with %q", problems[i], tc.want[i])
				}
			}
		})
	}
	t.Run("env file", func(t *testing.T) {
		c := docCommand{words: []docWord{{s: "agent", literal: true}, {s: "run", literal: true}}}
		env := "# MUSTER_JOIN_URI='muster+token://…'\n# MUSTER_NODE_ID=web-1\nMUSTER_METRICS_LISTEN=bad:port:x\n# MUSTER_NODEID=web-1\nPATH=/bin\n# prose = not a variable\n"
		c, problems := withEnvFile(root, c, "agent.env", env)
		if p := checkDocCommand(root, c); p != "" {
			problems = append(problems, p)
		}
		want := []string{`agent.env:4: MUSTER_NODEID is not a variable "muster agent run" reads`}
		if len(problems) != len(want) || !strings.HasPrefix(problems[0], want[0]) {
			t.Errorf("problems %q, want %q (command %s)", problems, want, c.text)
		}
	})
}

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

// The docs' muster command lines are checked against the real command tree
// without running them: the subcommand path names a runnable command, every
// flag exists on it (and takes a value exactly when given one), literal flag
// values parse, and the positional arguments pass its Args validator. A
// block that only shows what muster prints is a ```text block, or has
// <!-- not a command --> on the line before its fence. A prose code span
// that starts with "muster " is a command too (it may wrap to the next
// line); one holding only command words and value-less flags (`muster
// admin add`, `muster init --custody`, `muster token …`) names a command
// or its flag, and only those names are checked.

// TestDocCommandsExist checks every muster command in README.md's and
// docs/*.md's code blocks and prose code spans, and the packaged systemd
// units' ExecStart lines.
func TestDocCommandsExist(t *testing.T) {
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{"../../README.md"}, files...)
	root := newRoot(&Env{})
	checked, inline := 0, 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(f, "../../")
		for _, c := range docCommands(name, string(data)) {
			checked++
			if c.inline {
				inline++
			}
			if p := checkDocCommand(root, c); p != "" {
				t.Errorf("%s:%d: %s: %s", c.file, c.line, c.text, p)
			}
		}
	}
	units, err := filepath.Glob("../../packaging/systemd/*.service")
	if err != nil || len(units) == 0 {
		t.Fatalf("no packaged systemd units: %v", err)
	}
	for _, f := range units {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(f, "../../")
		for _, c := range unitCommands(name, 1, strings.Split(string(data), "\n")) {
			checked++
			if p := checkDocCommand(root, c); p != "" {
				t.Errorf("%s:%d: %s: %s", c.file, c.line, c.text, p)
			}
		}
	}
	t.Logf("%d commands in the docs and units, %d of them inline", checked, inline)
	// The docs hold two hundred in blocks and more inline; far fewer means
	// the extraction broke.
	if checked-inline < 190 {
		t.Errorf("%d muster commands found in the docs' blocks, want at least 190: the extraction misses blocks", checked-inline)
	}
	if inline < 300 {
		t.Errorf("%d muster commands found in the docs' prose, want at least 300: the extraction misses code spans", inline)
	}
}

// TestDocCommandChecker shows the checker fails on what a doc can get
// wrong, and passes what the docs write on purpose.
func TestDocCommandChecker(t *testing.T) {
	root := newRoot(&Env{})
	for _, tc := range []struct {
		name, doc string
		want      []string // one problem per entry, as "line: substring"
	}{
		{"wrong flag", "```sh\nmuster token create --nodes web-01\n```\n",
			[]string{`2: unknown flag --nodes`}},
		{"wrong subcommand", "```sh\nmuster token craete --node web-01\n```\n",
			[]string{`2: "muster token" runs only its help`}},
		{"unknown top-level command", "```sh\nmuster tokens list\n```\n",
			[]string{`2: unknown command "tokens"`}},
		{"wrong flag on a continuation line", "```sh\nmuster authority --data /var/lib/muster \\\n  --listen :7443 \\\n  --agent-ttl 24h\n```\n",
			[]string{`2: unknown flag --agent-ttl`}},
		{"wrong command in $(…)", "```sh\nexport URI=$(muster token creat -o json | jq -r .uri)\n```\n",
			[]string{`2: "muster token" runs only its help`}},
		{"wrong flag in backquotes", "```sh\necho `muster psk show --rawest`\n```\n",
			[]string{`2: unknown flag --rawest`}},
		{"flag without its value", "```sh\nmuster agent status --data\n```\n",
			[]string{`2: flag --data needs a value`}},
		{"value given to a switch", "```sh\nmuster psk show --raw=please\n```\n",
			[]string{`2: invalid value "please" for --raw`}},
		{"literal value that does not parse", "```sh\nmuster token create --ttl 1day\n```\n",
			[]string{`2: invalid value "1day" for --ttl`}},
		{"missing argument", "```sh\nmuster token get -o json\n```\n",
			[]string{`2: arguments []: accepts 1 arg(s), received 0`}},
		{"extra argument", "```console\n$ muster lock list web-01\nID  NODE\n```\n",
			[]string{`2: arguments [web-01]: unknown command "web-01" for "muster lock list"`}},
		{"wrong flag after a pipe and an env assignment", "```sh\necho x | MUSTER_X=1 muster token apply -f - --dry\n```\n",
			[]string{`2: unknown flag --dry`}},
		{"wrong flag in a synopsis alternative", "```sh\nmuster lock create (--node NODE | --instanse ID) [--ttl 1h]\n```\n",
			[]string{`2: unknown flag --instanse`}},
		{"wrong flag after a wrapper", "```sh\nsudo -u muster muster init --data D --nam prod\n/usr/bin/time -f \"%e s\" muster agents list --limt 3 > /dev/null\n```\n",
			[]string{`2: unknown flag --nam`, `3: unknown flag --limt`}},
		{"wrong flag in a plain block of commands", "```\nmuster init --data d\nfor op in a b; do\n  muster bench --data d --op $op --concurency 16\ndone\n```\n",
			[]string{`4: unknown flag --concurency`}},
		{"right lines", "```sh\n" +
			"muster token create                                  # prints a joining URI\n" +
			"muster agent join --data ./agent --node demo-01 'muster+token://…'\n" +
			"MUSTER_JOIN_URI='muster+token://…' \\\n    muster agent join --data ADIR\n" +
			"muster token list [-o json] [--limit N] [--page-size N]\n" +
			"muster psk show [-o json | --raw]\n" +
			"muster lock create (--node NODE | --instance ID | --admin NAME) [--ttl 1h] [--reason TEXT]\n" +
			"muster discovery --data D \\\n  [--store sqlite://…|postgres://…] [--trusted-proxy IP|CIDR]... [--key-rotation 24h]\n" +
			"muster audit list [--since 2h | --since 2026-11-22T10:00:00Z] [--action lock.*] [-o json]\n" +
			"muster ca rotate $role --activate --data /var/lib/muster/authority\n" +
			"go run ./cmd/muster dev --data ./d\n" +
			"cat >/etc/muster/agent.env <<'ENV'\nmuster token create --bogus\nENV\n" +
			"muster token get ID -o yaml > token.yaml && muster token apply -f token.yaml; muster lock list\n" +
			"docker run --rm -v muster-data:/data -e X=1 muster:v1.2.3-pkcs11 init --data /data/authority\n" +
			"GODEBUG=x python3 -c 'import os' valgrind --tool=callgrind muster authority --data d --metrics-listen '' &\n" +
			"# or: muster agent join --data ADIR --node web-01 \\\n#       'muster+psk://HEX@HOST:PORT'\n" +
			"# muster: a comment about muster, not a command\n" +
			"source <(muster completion bash)\n" +
			"muster help token create\n" +
			"muster --help; muster token -h; muster --version\n" +
			"```\n", nil},
		{"wrong flag in a commented alternative", "```sh\nmuster agent join --data D\n# or: muster agent join --data D \\\n#   --psk-fil F\n```\n",
			[]string{`3: unknown flag --psk-fil`}},
		{"help of a group with a wrong flag", "```sh\nmuster token --help --bogus\nmuster --hepl\n```\n",
			[]string{`2: "muster token" runs only its help: name a subcommand`, `3: "muster" runs only its help: name a subcommand`}},
		{"wrong command in <(…)", "```sh\nsource <(muster completion bsh)\n```\n",
			[]string{`2: "muster completion" runs only its help: no subcommand "bsh"`}},
		{"wrong flag behind docker run", "```sh\ndocker run --rm -v muster-data:/data \\\n  registry.example/muster:v1 init --dat /data/authority\n```\n",
			[]string{`2: unknown flag --dat`}},
		{"wrong flag behind a program that runs valgrind", "```\npython3 -c 'x' valgrind --tool=callgrind muster authority --date d &\nmuster status\n```\n",
			[]string{`2: unknown flag --date`}},
		{"wrong flag in a unit's ExecStart", "```ini\n[Service]\nExecStart=\nExecStart=/usr/bin/muster agent run --data /var/lib/muster-agent \\\n  --workload-api-sock unix:///run/a.sock\n```\n",
			[]string{`4: unknown flag --workload-api-sock`}},
		{"wrong flag in a container's args", "```yaml\ncontainers:\n  - name: a\n    image: registry.example.org/muster:VERSION\n    args: [\"agent\", \"run\",\n           \"--metric-listen\", \"0.0.0.0:9464\"]\n  - name: b\n    image: busybox\n    args: [\"--bogus\"]\n---\ncommand: [\"/usr/bin/muster\", \"agent\", \"status\"]\nargs: [\"--bogus\"]\n```\n",
			[]string{`5: unknown flag --metric-listen`, `12: unknown flag --bogus`}},
		{"wrong flag in an indented code block", "Rotate with\n\n    muster ca rotate ROLE [--activate] [--root-keys FILE]\n\nthen\n\n1. Do this:\n\n       muster ca root status\n       muster ca root statuz\n\n   and prose\n    muster token create --bogus is prose in a list item\n",
			[]string{`3: unknown flag --root-keys`, `10: "muster ca root" runs only its help: no subcommand "statuz"`}},
		{"indented output is not a command", "Prints\n\n    muster: FAILED_PRECONDITION: run muster ca rotate --bogus\n", nil},
		{"console output is not a command", "```console\n$ muster status\nmuster token create --bogus\n```\n", nil},
		{"text block is not checked", "```text\nmuster token create --bogus\n```\n", nil},
		{"opted out block is not checked", "<!-- not a command -->\n```sh\nmuster token create --bogus\n```\n", nil},
		{"wrong flag in an inline span", "Run `muster token create --nodes web-01` to make one.\n",
			[]string{`1: unknown flag --nodes`}},
		{"wrong subcommand in an inline span that wraps", "Intro.\n\nThen `muster token\ncreat --node web-01` prints\na URI.\n",
			[]string{`3: "muster token" runs only its help: no subcommand "creat"`}},
		{"wrong names in inline spans naming a command", "`muster init --custdy` keeps keys; `muster ca rotat` and `muster tokens` do not exist.\n",
			[]string{`1: unknown flag --custdy for "muster init"`, `1: "muster ca" has no subcommand "rotat"`, `1: unknown command "tokens"`}},
		{"wrong flag in an inline span behind a variable or another build", "`MUSTER_DATA=d muster status --dat d`, `muster-pkcs11 authority --pkcs11-modul M`\n",
			[]string{`1: unknown flag --dat`, `1: unknown flag --pkcs11-modul`}},
		{"wrong flag in a table cell", "| command | what |\n|---|---|\n| `muster psk show [-o json \\| --rawx]` | shows it |\n",
			[]string{`3: unknown flag --rawx`}},
		{"wrong flag inline in a list item's paragraph", "1. First:\n\n    then `muster lock list --limt 3`\n    shows them\n",
			[]string{`3: unknown flag --limt`}},
		{"inline spans that name commands or are not commands", "`muster admin add` (or `muster admin add --offline`) and `muster init\n--custody`; `muster token …`, `muster audit`; `muster.db`, `MUSTER_DATA`, `muster`, ``muster+token://…``.\n", nil},
		{"prose is not checked", "Run muster token create --bogus.\n\n```yaml\nmuster: token\n```\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, c := range docCommands("x.md", tc.doc) {
				if p := checkDocCommand(root, c); p != "" {
					got = append(got, fmt.Sprintf("%d: %s", c.line, p))
				}
			}
			if len(got) != len(tc.want) {
				t.Fatalf("problems %q, want %q", got, tc.want)
			}
			for i := range got {
				if !strings.HasPrefix(got[i], tc.want[i]) {
					t.Errorf("problem %q, want one starting %q", got[i], tc.want[i])
				}
			}
		})
	}
}

// docCommand is one muster invocation found in a doc: its words after the
// program name.
type docCommand struct {
	file  string
	line  int
	text  string
	words []docWord
	// inline: in a prose code span, where `muster admin add` or `muster
	// init --custody` (command words and value-less flags only) names a
	// command or its flag rather than a line to run: then the names are
	// checked, not the arguments or values.
	inline bool
}

type docWord struct {
	s       string
	literal bool // no placeholder, variable or substitution in it
	group   int  // depth inside a synopsis's [ … ] or ( … )
	alt     bool // a synopsis's "|" between alternatives
}

// docCommands returns the muster commands in the fenced shell blocks of a
// Markdown document: ```sh, ```bash, ```console (the "$ " lines), plain
// ``` blocks and indented code blocks whose lines run muster, ```ini
// units' Exec lines, ```yaml containers running muster, and the prose's
// `muster …` code spans.
func docCommands(file, doc string) []docCommand {
	lines := strings.Split(doc, "\n")
	var cmds []docCommand
	prev := ""
	para, paraAt := []string(nil), 0 // the prose paragraph being read
	flush := func() {
		cmds = append(cmds, inlineCommands(file, paraAt, para)...)
		para = nil
	}
	defer flush()
	for i := 0; i < len(lines); i++ {
		fence := strings.TrimSpace(lines[i])
		if strings.HasPrefix(lines[i], "    ") && fence != "" && (i == 0 || strings.TrimSpace(lines[i-1]) == "") {
			flush()
			// An indented code block (or a list item's indented
			// paragraph: only one that runs muster is read).
			j := i
			for j < len(lines) && strings.HasPrefix(lines[j], "    ") && strings.TrimSpace(lines[j]) != "" {
				j++
			}
			if runs, console := runsMuster(lines[i:j]); runs && prev != "<!-- not a command -->" {
				cmds = append(cmds, blockCommands(file, i+1, lines[i:j], console)...)
			} else if !runs {
				para, paraAt = lines[i:j], i+1 // a list item's paragraph
				flush()
			}
			i, prev = j-1, ""
			continue
		}
		if !strings.HasPrefix(fence, "```") {
			if fence != "" {
				prev = fence
				if para == nil {
					paraAt = i + 1
				}
				para = append(para, lines[i])
			} else {
				flush()
			}
			continue
		}
		flush()
		lang, _, _ := strings.Cut(strings.TrimSpace(strings.TrimPrefix(fence, "```")), " ")
		optOut := prev == "<!-- not a command -->"
		start := i + 1
		for i++; i < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[i]), "```"); i++ {
		}
		body := lines[start:min(i, len(lines))]
		prev = ""
		if optOut {
			continue
		}
		console := false
		switch lang {
		case "ini", "systemd":
			cmds = append(cmds, unitCommands(file, start+1, body)...)
			continue
		case "yaml", "yml":
			cmds = append(cmds, containerCommands(file, start, strings.Join(body, "\n"))...)
			continue
		case "sh", "bash", "shell":
		case "console":
			console = true
		case "":
			var runs bool
			if runs, console = runsMuster(body); !runs {
				continue
			}
		default:
			continue
		}
		cmds = append(cmds, blockCommands(file, start+1, body, console)...)
	}
	return cmds
}

// inlineCommands returns the muster commands in a prose paragraph's code
// spans (which may wrap to the next line), each read as a shell line with
// the placeholders of a code block: `muster …`, `muster-pkcs11 …`,
// `MUSTER_X=1 muster …`, `sudo -u muster muster …` run muster; `muster.db`
// or `muster+token://…` do not.
func inlineCommands(file string, first int, para []string) []docCommand {
	text := strings.Join(para, "\n")
	var cmds []docCommand
	for i := 0; i < len(text); {
		if text[i] != '`' {
			i++
			continue
		}
		n := 0
		for i+n < len(text) && text[i+n] == '`' {
			n++
		}
		fence := strings.Repeat("`", n)
		end := -1
		for j := i + n; j < len(text); {
			k := strings.Index(text[j:], fence)
			if k < 0 {
				break
			}
			k += j
			if k+n < len(text) && text[k+n] == '`' { // a longer run
				for k < len(text) && text[k] == '`' {
					k++
				}
				j = k
				continue
			}
			end = k
			break
		}
		if end < 0 {
			i += n
			continue
		}
		span := strings.TrimSpace(strings.ReplaceAll(text[i+n:end], "\n", " "))
		line := first + strings.Count(text[:i], "\n")
		i = end + n
		if !strings.Contains(span, "muster") {
			continue
		}
		// A table cell writes | as \|.
		found, _ := lineCommands(file, line, strings.ReplaceAll(span, `\|`, "|"))
		for _, c := range found {
			c.inline = true
			cmds = append(cmds, c)
		}
	}
	return cmds
}

// runsMuster reports whether a plain block's lines run muster, and whether
// they do it at a "$ " prompt (the other lines being its output).
func runsMuster(body []string) (runs, console bool) {
	for _, l := range body {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "muster ") || strings.HasPrefix(l, "$ muster ") {
			runs = true
		}
		if strings.HasPrefix(l, "$ ") {
			console = true
		}
	}
	return runs, console
}

// blockCommands joins a block's continued lines and finds the muster
// commands in each, skipping here-documents' bodies and, in a console
// block, the lines without a "$ " prompt.
func blockCommands(file string, first int, body []string, console bool) []docCommand {
	var cmds []docCommand
	for i := 0; i < len(body); i++ {
		line := body[i]
		if console {
			l, ok := strings.CutPrefix(strings.TrimSpace(line), "$ ")
			if !ok {
				continue
			}
			line = l
		}
		n := first + i
		if c, ok := commentedCommand(line); ok {
			// "# or: muster …" names another command to run; a comment's
			// continuation is the next comment line.
			line = c
			for strings.HasSuffix(line, "\\") && i+1 < len(body) && strings.HasPrefix(strings.TrimSpace(body[i+1]), "#") {
				i++
				line = strings.TrimSuffix(line, "\\") + " " + strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(body[i]), "#"))
			}
		}
		for strings.HasSuffix(line, "\\") && i+1 < len(body) {
			i++
			line = strings.TrimSuffix(line, "\\") + " " + strings.TrimSpace(body[i])
		}
		found, heredoc := lineCommands(file, n, line)
		cmds = append(cmds, found...)
		if heredoc != "" {
			for i++; i < len(body) && strings.TrimSpace(body[i]) != heredoc; i++ {
			}
		}
	}
	return cmds
}

// unitCommands returns the muster commands of a systemd unit's Exec…= lines.
func unitCommands(file string, first int, body []string) []docCommand {
	var cmds []docCommand
	for i := 0; i < len(body); i++ {
		n := first + i
		line := strings.TrimSpace(body[i])
		for strings.HasSuffix(line, "\\") && i+1 < len(body) {
			i++
			line = strings.TrimSuffix(line, "\\") + " " + strings.TrimSpace(body[i])
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok || !strings.HasPrefix(key, "Exec") {
			continue
		}
		found, _ := lineCommands(file, n, strings.TrimLeft(value, "-+!@:"))
		cmds = append(cmds, found...)
	}
	return cmds
}

// containerCommands returns the muster commands of a YAML document's
// containers: an image named muster and its args (or a command naming
// muster, then its args).
func containerCommands(file string, fenceLine int, doc string) []docCommand {
	var cmds []docCommand
	var walk func(*yaml.Node)
	walk = func(n *yaml.Node) {
		if n.Kind == yaml.MappingNode {
			var image, command, args *yaml.Node
			for i := 0; i+1 < len(n.Content); i += 2 {
				switch n.Content[i].Value {
				case "image":
					image = n.Content[i+1]
				case "command":
					command = n.Content[i+1]
				case "args":
					args = n.Content[i+1]
				}
			}
			var words []docWord
			runs, at := false, 0
			if image != nil {
				ref, _, _ := strings.Cut(image.Value[strings.LastIndex(image.Value, "/")+1:], ":")
				runs, at = ref == "muster" && command == nil, image.Line
			}
			if command != nil && command.Kind == yaml.SequenceNode && len(command.Content) > 0 && isMuster(command.Content[0].Value) {
				for _, w := range command.Content[1:] {
					words = append(words, docWord{s: w.Value, literal: !strings.ContainsAny(w.Value, "$…")})
				}
				runs, at = true, command.Line
			}
			if runs && args != nil && args.Kind == yaml.SequenceNode {
				for _, w := range args.Content {
					words = append(words, docWord{s: w.Value, literal: !strings.ContainsAny(w.Value, "$…")})
				}
				at = args.Line
			}
			if runs && (args != nil || command != nil) {
				cmds = append(cmds, docCommand{file: file, line: fenceLine + at, text: "muster " + joinWords(words), words: words})
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	dec := yaml.NewDecoder(strings.NewReader(doc))
	for {
		var root yaml.Node
		if dec.Decode(&root) != nil {
			return cmds // the end, or not YAML: a fragment with placeholders
		}
		walk(&root)
	}
}

// commentedCommand returns the muster command a comment line offers as an
// alternative ("# or: muster …", "# muster …").
func commentedCommand(line string) (string, bool) {
	c, ok := strings.CutPrefix(strings.TrimSpace(line), "#")
	if !ok {
		return "", false
	}
	c = strings.TrimSpace(c)
	if o, ok := strings.CutPrefix(c, "or:"); ok {
		c = strings.TrimSpace(o)
	}
	return c, strings.HasPrefix(c, "muster ")
}

var (
	envAssign   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)
	upperWord   = regexp.MustCompile(`(^|[^A-Za-z0-9])[A-Z][A-Z0-9_]*([^A-Za-z0-9]|$)`)
	angleHolder = regexp.MustCompile(`<[^>]+>`)
)

// lineCommands splits one shell line at its operators (| || && ; &),
// drops comments and redirections, recurses into $(…) and `…`, and returns
// the segments that run muster, and a here-document's delimiter if the line
// opens one.
func lineCommands(file string, n int, line string) ([]docCommand, string) {
	var (
		cmds    []docCommand
		seg     []docWord
		heredoc string
		depth   int // synopsis group depth, in a muster segment only
	)
	flush := func() {
		if c, ok := musterCommand(seg); ok {
			c.file, c.line = file, n
			cmds = append(cmds, c)
		}
		seg, depth = nil, 0
	}
	inMuster := func() bool { _, ok := musterCommand(seg); return ok }
	src := []rune(line)
	for i := 0; i < len(src); {
		r := src[i]
		switch {
		case r == ' ' || r == '\t':
			i++
			continue
		case r == '#':
			i = len(src)
			continue
		case r == '|' && depth > 0:
			seg = append(seg, docWord{s: "|", group: depth, alt: true})
			i++
			continue
		case r == '|' || r == ';' || r == '&' && (i+1 >= len(src) || src[i+1] != '>'):
			for i < len(src) && strings.ContainsRune("|;&", src[i]) {
				i++
			}
			flush()
			continue
		case (r == '<' || r == '>') && i+1 < len(src) && src[i+1] == '(':
			// Process substitution, as source <(muster completion bash).
			end := closeParen(src, i+2)
			sub, _ := lineCommands(file, n, string(src[i+2:end]))
			cmds = append(cmds, sub...)
			seg = append(seg, docWord{s: string(src[i:min(end+1, len(src))]), group: depth})
			i = end + 1
			continue
		case r == '<' || r == '>' || (r >= '0' && r <= '9' || r == '&') && redirectAt(src, i):
			op := ""
			for i < len(src) && strings.ContainsRune("0123456789<>&", src[i]) {
				op += string(src[i])
				i++
				if strings.HasSuffix(op, "&") && i < len(src) && src[i] >= '0' && src[i] <= '9' {
					break // 2>&1: the descriptor is the target
				}
			}
			for i < len(src) && (src[i] == ' ' || src[i] == '\t') {
				i++
			}
			w, next, subs := shellWord(src, i, false)
			for _, s := range subs {
				sub, _ := lineCommands(file, n, s)
				cmds = append(cmds, sub...)
			}
			i = next
			if strings.HasSuffix(op, "<<") && !strings.HasSuffix(op, "<<<") {
				heredoc = strings.TrimPrefix(w, "-")
			}
			continue
		}
		if inMuster() {
			for i < len(src) && (src[i] == '[' || src[i] == '(') {
				depth++
				i++
			}
		}
		w, next, subs := shellWord(src, i, depth > 0)
		raw := string(src[i:next])
		i = next
		for _, s := range subs {
			sub, _ := lineCommands(file, n, s)
			cmds = append(cmds, sub...)
		}
		closes := 0
		if inMuster() && depth > 0 {
			for strings.HasSuffix(w, "]") || strings.HasSuffix(w, ")") || strings.HasSuffix(w, "]...") {
				w = strings.TrimSuffix(w, "...") // repeatable
				w, closes = w[:len(w)-1], closes+1
			}
		}
		if w != "" || raw != "" {
			literal := len(subs) == 0 && !strings.Contains(raw, "$") && !strings.Contains(w, "…") &&
				!upperWord.MatchString(w) && !angleHolder.MatchString(w) && !(depth > 0 && strings.Contains(w, "|"))
			seg = append(seg, docWord{s: w, literal: literal, group: depth})
		}
		depth = max(depth-closes, 0)
	}
	flush()
	return cmds, heredoc
}

// redirectAt reports whether src[i:] starts a redirection such as 2> or &>.
func redirectAt(src []rune, i int) bool {
	j := i
	for j < len(src) && (src[j] >= '0' && src[j] <= '9' || src[j] == '&') {
		j++
	}
	return j < len(src) && (src[j] == '>' || src[j] == '<') && (i == 0 || src[i-1] == ' ' || src[i-1] == '\t')
}

// shellWord reads one word from src[i:], removing quotes, and returns it,
// where it ends and the text of each $(…) or `…` inside it.
func shellWord(src []rune, i int, inGroup bool) (string, int, []string) {
	var b strings.Builder
	var subs []string
	for i < len(src) {
		r := src[i]
		switch {
		case r == ' ' || r == '\t' || r == ';' || r == '|' && !inGroup || r == '&' || r == '<' || r == '>':
			return b.String(), i, subs
		case r == '\'':
			j := i + 1
			for j < len(src) && src[j] != '\'' {
				j++
			}
			b.WriteString(string(src[i+1 : min(j, len(src))]))
			i = j + 1
		case r == '"':
			j := i + 1
			for j < len(src) && src[j] != '"' {
				if src[j] == '$' && j+1 < len(src) && src[j+1] == '(' {
					end := closeParen(src, j+2)
					subs = append(subs, string(src[j+2:end]))
					b.WriteString(string(src[j:min(end+1, len(src))]))
					j = end + 1
					continue
				}
				if src[j] == '\\' && j+1 < len(src) {
					j++
				}
				b.WriteRune(src[j])
				j++
			}
			i = j + 1
		case r == '$' && i+1 < len(src) && src[i+1] == '(':
			end := closeParen(src, i+2)
			subs = append(subs, string(src[i+2:end]))
			b.WriteString(string(src[i:min(end+1, len(src))]))
			i = end + 1
		case r == '`':
			j := i + 1
			for j < len(src) && src[j] != '`' {
				j++
			}
			subs = append(subs, string(src[i+1:min(j, len(src))]))
			b.WriteString(string(src[i:min(j+1, len(src))]))
			i = j + 1
		case r == '\\' && i+1 < len(src):
			b.WriteRune(src[i+1])
			i += 2
		default:
			b.WriteRune(r)
			i++
		}
	}
	return b.String(), len(src), subs
}

// closeParen returns the index of the ")" closing a "$(" whose text starts
// at i, skipping quoted text and nested parentheses.
func closeParen(src []rune, i int) int {
	depth := 1
	for ; i < len(src); i++ {
		switch src[i] {
		case '\'', '"':
			q := src[i]
			for i++; i < len(src) && src[i] != q; i++ {
			}
		case '(':
			depth++
		case ')':
			if depth--; depth == 0 {
				return i
			}
		}
	}
	return len(src)
}

// musterCommand finds the muster invocation in one pipeline segment: after
// environment assignments, shell keywords and wrappers (sudo -u USER, time,
// valgrind, exec), the program muster (or a build of it: dist/muster,
// muster-pkcs11, go run ./cmd/muster).
func musterCommand(seg []docWord) (docCommand, bool) {
	i := 0
	for i < len(seg) {
		w := seg[i].s
		switch {
		case envAssign.MatchString(w) && seg[i].group == 0:
			i++
		case w == "do" || w == "then" || w == "else" || w == "!" || w == "{" || w == "exec" || w == "nohup" || w == "env" || w == "time":
			i++
		case w == "sudo" || w == "/usr/bin/time" || w == "valgrind":
			i++
			for i < len(seg) && strings.HasPrefix(seg[i].s, "-") {
				if len(seg[i].s) == 2 && strings.Contains("ugfo", seg[i].s[1:]) {
					i++
				}
				i++
			}
		case w == "go" && i+2 < len(seg) && seg[i+1].s == "run" && strings.HasSuffix(seg[i+2].s, "cmd/muster"):
			return docCommand{text: joinWords(seg), words: seg[i+3:]}, true
		case isMuster(w):
			return docCommand{text: joinWords(seg), words: seg[i+1:]}, true
		case (w == "docker" || w == "podman") && i+1 < len(seg) && seg[i+1].s == "run":
			// docker run [OPTIONS] IMAGE ARGS: the image is muster's.
			for j := i + 2; j < len(seg); j++ {
				ref, _, _ := strings.Cut(seg[j].s[strings.LastIndex(seg[j].s, "/")+1:], ":")
				if ref == "muster" && !strings.HasPrefix(seg[j].s, "-") && !strings.HasPrefix(seg[j-1].s, "-") {
					return docCommand{text: joinWords(seg), words: seg[j+1:]}, true
				}
			}
			return docCommand{}, false
		default:
			// A wrapper run by another program, as python3 -c '…' valgrind … muster.
			for j := i + 1; j < len(seg); j++ {
				if seg[j].s == "valgrind" || seg[j].s == "sudo" || seg[j].s == "/usr/bin/time" {
					i = j
					break
				}
			}
			if seg[i].s == w {
				return docCommand{}, false
			}
		}
	}
	return docCommand{}, false
}

func isMuster(w string) bool {
	base := w[strings.LastIndex(w, "/")+1:]
	return base == "muster" || base == "muster-pkcs11" || base == "muster-after" || base == "muster-before"
}

func joinWords(ws []docWord) string {
	s := make([]string, len(ws))
	for i, w := range ws {
		s[i] = w.s
	}
	return strings.Join(s, " ")
}

// checkDocCommand returns what is wrong with c against root's commands, or
// "" if nothing is.
func checkDocCommand(root *cobra.Command, c docCommand) string {
	root.InitDefaultHelpCmd() // as Execute adds them
	root.InitDefaultCompletionCmd()
	cmd, ws := root, c.words
	for len(ws) > 0 && ws[0].group == 0 && !strings.HasPrefix(ws[0].s, "-") {
		sub := childNamed(cmd, ws[0].s)
		if sub == nil {
			break
		}
		cmd, ws = sub, ws[1:]
	}
	if c.inline && namesOnly(cmd, ws) {
		for _, w := range ws {
			if w.s == "…" {
				continue
			}
			if !strings.HasPrefix(w.s, "-") {
				if cmd == root {
					return fmt.Sprintf("unknown command %q", w.s)
				}
				return fmt.Sprintf("%q has no subcommand %q (it has %s)", cmd.CommandPath(), w.s, childNames(cmd))
			}
			cmd.InitDefaultHelpFlag()
			cmd.InheritedFlags()
			if name := strings.TrimLeft(w.s, "-"); strings.HasPrefix(w.s, "--") && cmd.Flags().Lookup(name) == nil ||
				!strings.HasPrefix(w.s, "--") && cmd.Flags().ShorthandLookup(name) == nil {
				return fmt.Sprintf("unknown flag %s for %q", w.s, cmd.CommandPath())
			}
		}
		return ""
	}
	if !cmd.Runnable() && len(ws) == 1 && (ws[0].s == "--help" || ws[0].s == "-h" || cmd == root && ws[0].s == "--version") {
		return "" // a group's help (the image's CMD ["--help"])
	}
	if !cmd.Runnable() {
		if len(ws) > 0 && ws[0].group == 0 && !strings.HasPrefix(ws[0].s, "-") {
			if cmd == root {
				return fmt.Sprintf("unknown command %q", ws[0].s)
			}
			return fmt.Sprintf("%q runs only its help: no subcommand %q (it has %s)", cmd.CommandPath(), ws[0].s, childNames(cmd))
		}
		return fmt.Sprintf("%q runs only its help: name a subcommand (%s)", cmd.CommandPath(), childNames(cmd))
	}
	cmd.InitDefaultHelpFlag()
	if cmd == root {
		cmd.InitDefaultVersionFlag()
	}
	cmd.InheritedFlags() // merges the parents' persistent flags into Flags()
	flags := cmd.Flags()
	var args, optional []string
	counted := true
	for i := 0; i < len(ws); i++ {
		w := ws[i]
		if w.alt {
			continue
		}
		var f *pflag.Flag
		var name, value string
		hasValue := false
		switch {
		case w.s == "--":
			for _, a := range ws[i+1:] {
				args = append(args, a.s)
			}
			i = len(ws)
			continue
		case strings.HasPrefix(w.s, "--"):
			name, value, hasValue = strings.Cut(w.s[2:], "=")
			if f = flags.Lookup(name); f == nil {
				return fmt.Sprintf("unknown flag --%s for %q", name, cmd.CommandPath())
			}
			name = "--" + name
		case strings.HasPrefix(w.s, "-") && len(w.s) > 1:
			name = w.s[1:2]
			if f = flags.ShorthandLookup(name); f == nil {
				return fmt.Sprintf("unknown flag -%s for %q", name, cmd.CommandPath())
			}
			name = "-" + name
			if rest := strings.TrimPrefix(w.s[2:], "="); rest != "" {
				value, hasValue = rest, true
			}
		default:
			if w.s == "…" {
				counted = false
			} else if w.group > 0 {
				optional = append(optional, w.s)
			} else {
				args = append(args, w.s)
			}
			continue
		}
		literal := w.literal
		if !hasValue && f.NoOptDefVal == "" {
			if i+1 >= len(ws) || ws[i+1].alt {
				return fmt.Sprintf("flag %s needs a value", name)
			}
			i++
			value, hasValue, literal = ws[i].s, true, ws[i].literal
		}
		if hasValue && literal {
			if err := f.Value.Set(value); err != nil {
				return fmt.Sprintf("invalid value %q for %s: %v", value, name, err)
			}
		}
	}
	if !counted {
		return ""
	}
	if err := validArgs(cmd, args); err != "" {
		return err
	}
	if len(optional) > 0 {
		return validArgs(cmd, append(args, optional...))
	}
	return ""
}

// namesOnly reports whether the words after a command's path only name
// flags (no values, no arguments), or are "…" or, after a group, one
// misspelt subcommand: what an inline span naming a command holds.
func namesOnly(cmd *cobra.Command, ws []docWord) bool {
	for i, w := range ws {
		if w.s == "…" || strings.HasPrefix(w.s, "-") && !strings.Contains(w.s, "=") && len(w.s) > 1 {
			continue
		}
		if i == 0 && len(ws) == 1 && w.literal && !cmd.Runnable() {
			continue // a subcommand that is none: reported as such
		}
		return false
	}
	return true
}

func validArgs(cmd *cobra.Command, args []string) string {
	if cmd.Args == nil && cmd.HasSubCommands() && len(args) > 0 {
		return fmt.Sprintf("%q has no subcommand %q (it has %s)", cmd.CommandPath(), args[0], childNames(cmd))
	}
	if err := cmd.ValidateArgs(args); err != nil {
		return fmt.Sprintf("arguments %v: %v", args, err)
	}
	return ""
}

func childNamed(cmd *cobra.Command, name string) *cobra.Command {
	for _, c := range cmd.Commands() {
		if c.Name() == name || c.HasAlias(name) {
			return c
		}
	}
	return nil
}

func childNames(cmd *cobra.Command) string {
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			names = append(names, c.Name())
		}
	}
	return strings.Join(names, ", ")
}

// TestHelpExamplesExist checks the muster commands in every command's
// --help examples the same way: they are the first docs a user pastes.
func TestHelpExamplesExist(t *testing.T) {
	root := newRoot(&Env{})
	checked := 0
	var walk func(*cobra.Command)
	walk = func(cmd *cobra.Command) {
		if cmd.Example != "" {
			file := "help of " + cmd.CommandPath()
			for _, c := range blockCommands(file, 1, strings.Split(cmd.Example, "\n"), false) {
				checked++
				if p := checkDocCommand(root, c); p != "" {
					t.Errorf("%s, example line %d: %s: %s", c.file, c.line, c.text, p)
				}
			}
		}
		for _, sub := range cmd.Commands() {
			walk(sub)
		}
	}
	walk(root)
	t.Logf("%d commands in help examples", checked)
	if checked < 20 {
		t.Errorf("%d muster commands found in the help examples, want at least 20", checked)
	}
}

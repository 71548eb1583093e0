package cli

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// The commands muster itself tells an operator to run (errors, refusal
// and audit reasons, hints, printed next steps, the dev banner) are checked
// against the command tree the way the docs' are (checkDocCommand), read
// from the source with go/parser so a new hint is covered without a list:
//
//   - Every string literal of non-test Go code in the module (tools/ are
//     other modules), and every "a" + x + "b" concatenation of them (x read
//     as the placeholder X), is searched for "muster NAME" (or
//     "muster-pkcs11 NAME"), NAME a
//     top-level command; or any NAME after run, use, with, see, try, start
//     or then, in `…` or "…", or on a printed command line (below), so a
//     misspelt command is reported rather than taken for prose.
//   - Format verbs (%s, %d, %q, %v, %w, …) become the placeholder X, which
//     the checker counts as an argument or a flag's value without parsing
//     it, as it does NAME, FILE, ADIR, sha256:… and … . A "%s" followed by
//     a top-level command is the program itself (the dev banner prints
//     os.Args[0] there) at the start of an indented line, after "| ",
//     after a word telling the operator to run it (with, run, use, try,
//     then: the break-glass binary, muster or muster-pkcs11), or at the
//     start of a string whose first line gives a --flag: it becomes
//     muster.
//   - A command in `…` or "…" (starting at muster) is read to its closing
//     quote with the docs check's shell reader; so is an indented line
//     that starts with muster and does not end as a sentence does (in , ;
//     . or ): a printed command line such as "  muster signer revoke v2".
//   - Elsewhere it is prose, read to the end of its line: subcommands,
//     flags with their values (the flag's definition says whether it takes
//     one), placeholder arguments, and a literal argument that a flag
//     follows or that the command needs and that ends the sentence ("…
//     muster ca rotate jwt."). It ends at the first other word, at "(",
//     "[", "#" or "|", or after a word ending in , ; : . or ). So "run
//     muster ca rotate %s --activate once it …" is "muster ca rotate X
//     --activate", and a misspelt subcommand after a command group is
//     still read (and reported). A command in prose therefore stays on one
//     line, as it must to be pasted.
//   - Not commands: strings given to a field or constant that names who
//     did something or what a thing is (Actor, Description, CommonName,
//     consts named …Actor/…actor and caCommonName: "muster discovery
//     forget" as an audit actor, "muster discovery CA" as a certificate's
//     name), and commands' Example fields, which TestHelpExamplesExist
//     checks line by line.
//
// Not covered: a command assembled at run time from non-literal parts (init
// appends storeHint's note on the store to its "Next:" line through a %s,
// read as one placeholder), flags named without "muster …" before them ("start
// it with --allow-authority …"), and whether a prose flag's value is a value
// or the sentence's next word ("muster init --custody keeps its keys").

// TestHintCommandsExist checks every muster command in the module's non-test
// Go strings.
func TestHintCommandsExist(t *testing.T) {
	root := newRoot(&Env{})
	checked := 0
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "../.." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "vendor" || fileExists(filepath.Join(path, "go.mod"))) {
				return filepath.SkipDir // another module (tools/…), or not code
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		name := strings.TrimPrefix(path, "../../")
		cmds, err := hintCommands(root, name, src)
		if err != nil {
			return err
		}
		for _, c := range cmds {
			checked++
			if p := checkDocCommand(root, c); p != "" {
				t.Errorf("%s:%d: %s: %s", c.file, c.line, c.text, p)
			}
			if p := breakGlassWithoutData(c); p != "" {
				t.Errorf("%s:%d: %s: %s", c.file, c.line, c.text, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d commands in the program's strings", checked)
	// The program names well over a hundred; far fewer means the
	// extraction broke.
	if checked < 120 {
		t.Errorf("%d muster commands found in the program's strings, want at least 120: the extraction misses them", checked)
	}
}

// breakGlassWithoutData: a command run with --offline (break-glass:
// admin add, ca rotate, settings set, audit list…) opens the data
// directory itself, so a hint naming one must name it (--data), as the
// default ./muster-data is never the installed authority's: pasted
// without it, the command opens nothing or the wrong directory.
func breakGlassWithoutData(c docCommand) string {
	if c.inline {
		return ""
	}
	offline, data := false, false
	for _, w := range c.words {
		switch {
		case w.s == "--offline":
			offline = true
		case w.s == "--data" || strings.HasPrefix(w.s, "--data="):
			data = true
		}
	}
	if offline && !data {
		return "runs --offline without --data: pasted, it opens ./muster-data, not the authority's directory"
	}
	return ""
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// notCommandKeys are the fields whose strings name a program or a thing,
// not a command to run (or, Example, are checked by TestHelpExamplesExist).
var notCommandKeys = map[string]bool{"Actor": true, "Description": true, "CommonName": true, "Example": true}

// hintCommands returns the muster commands in one Go file's strings.
func hintCommands(root *cobra.Command, file string, src []byte) ([]docCommand, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var cmds []docCommand
	add := func(pos token.Pos, s string, raw bool) {
		cmds = append(cmds, stringCommands(root, file, fset.Position(pos).Line, s, raw)...)
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.KeyValueExpr:
			if k, ok := n.Key.(*ast.Ident); ok && notCommandKeys[k.Name] {
				return false
			}
		case *ast.ValueSpec:
			for _, id := range n.Names {
				if strings.HasSuffix(strings.ToLower(id.Name), "actor") || id.Name == "caCommonName" {
					return false
				}
			}
		case *ast.BinaryExpr:
			if s, ok := concatenation(n); ok {
				add(n.Pos(), s, false)
				return false
			}
		case *ast.BasicLit:
			if n.Kind == token.STRING {
				if s, err := strconv.Unquote(n.Value); err == nil {
					add(n.Pos(), s, strings.HasPrefix(n.Value, "`"))
				}
			}
		}
		return true
	})
	return cmds, nil
}

// concatenation returns a + b + … with at least one string literal, its
// other operands read as the placeholder X.
func concatenation(e *ast.BinaryExpr) (string, bool) {
	if e.Op != token.ADD {
		return "", false
	}
	var b strings.Builder
	lits := 0
	var walk func(ast.Expr)
	walk = func(x ast.Expr) {
		switch x := x.(type) {
		case *ast.ParenExpr:
			walk(x.X)
			return
		case *ast.BinaryExpr:
			if x.Op == token.ADD {
				walk(x.X)
				walk(x.Y)
				return
			}
		case *ast.BasicLit:
			if x.Kind == token.STRING {
				if s, err := strconv.Unquote(x.Value); err == nil {
					b.WriteString(s)
					lits++
					return
				}
			}
		}
		b.WriteString("X")
	}
	walk(e)
	return b.String(), lits > 0
}

// tellWords, before "muster NAME", tell the operator to run it: NAME is
// then checked even when it is no command (a misspelt one).
var tellWords = map[string]bool{"run": true, "use": true, "with": true, "see": true, "try": true, "start": true, "then": true}

var (
	// A format verb: %s, %-8s, %5.2f, %[1]s, %q, %w, ….
	formatVerb = regexp.MustCompile(`%[-+# 0]*(\[\d+\])?\d*(\.\d+)?[a-zA-Z]`)
	// The program as a verb: "  %s token create", "… | %s agent join",
	// or told to run: "… with %s admin add" (the break-glass binary,
	// muster or muster-pkcs11, filled in at run time).
	programVerb = regexp.MustCompile(`(^|\n[ \t]+|^[ \t]+|\| |\b(?:with|run|use|try|then) )%s ([a-z][a-z0-9-]*)`)
	musterAt    = regexp.MustCompile(`muster(?:-pkcs11)? ([a-z][a-z0-9-]*)`)
)

// stringCommands returns the muster commands one Go string names.
// A raw string's lines are the source's: a command on its third line is
// two lines below the literal.
func stringCommands(root *cobra.Command, file string, line int, s string, raw bool) []docCommand {
	if !strings.Contains(s, "muster") && !strings.Contains(s, "%s ") {
		return nil
	}
	first, _, _ := strings.Cut(s, "\n")
	s = programVerb.ReplaceAllStringFunc(s, func(m string) string {
		sub := programVerb.FindStringSubmatch(m)
		if childNamed(root, sub[2]) == nil || sub[1] == "" && !strings.Contains(first, " --") {
			return m
		}
		return strings.Replace(m, "%s ", "muster ", 1)
	})
	s = strings.ReplaceAll(s, "%%", "\x00")
	s = formatVerb.ReplaceAllString(s, "X")
	s = strings.ReplaceAll(s, "\x00", "%")
	var cmds []docCommand
	for _, m := range musterAt.FindAllStringSubmatchIndex(s, -1) {
		start, nameEnd := m[0], m[3]
		if start > 0 && !strings.ContainsRune(" \t\n(`\"'", rune(s[start-1])) {
			continue // dist/muster, a word ending in muster
		}
		if nameEnd < len(s) && !strings.ContainsRune(" \t\n,;:.)`\"", rune(s[nameEnd])) {
			continue // muster authority's …
		}
		n := line
		if raw {
			n += strings.Count(s[:start], "\n")
		}
		lineStart := strings.LastIndexByte(s[:start], '\n') + 1
		end := strings.IndexByte(s[start:], '\n')
		if end < 0 {
			end = len(s) - start
		}
		cmdLine := strings.TrimRight(s[start:start+end], " \t")
		indent := s[lineStart:start]
		lineMode := indent != "" && strings.Trim(indent, " \t") == "" &&
			(nameEnd == len(s) || s[nameEnd] == ' ' || s[nameEnd] == '\n') && !strings.ContainsAny(cmdLine[len(cmdLine)-1:], ",;.)")
		quoted := start > 0 && (s[start-1] == '`' || s[start-1] == '"')
		before := strings.Fields(s[:start])
		told := len(before) > 0 && tellWords[strings.ToLower(before[len(before)-1])]
		if childNamed(root, s[m[2]:m[3]]) == nil && !lineMode && !quoted && !told {
			continue // muster is …, muster reads …
		}
		if lineMode {
			// An indented line of its own, not ending as a sentence
			// does: a printed command line, read as a shell line.
			found, _ := lineCommands(file, n, cmdLine)
			cmds = append(cmds, found...)
			continue
		}
		if quoted {
			end := strings.IndexByte(s[start:], s[start-1])
			if end < 0 {
				end = len(s) - start
			}
			found, _ := lineCommands(file, n, s[start:start+end])
			cmds = append(cmds, found...)
			continue
		}
		if c, ok := proseCommand(root, s[start:]); ok {
			c.file, c.line = file, n
			cmds = append(cmds, c)
		}
	}
	return cmds
}

// proseCommand reads the muster command that s, prose, starts with: see the
// comment at the top of this file.
func proseCommand(root *cobra.Command, s string) (docCommand, bool) {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	fields := strings.Fields(s)[1:] // after "muster"
	var words []docWord
	cmd := root
	inPath := true
	var args []string
	for i := 0; i < len(fields); i++ {
		w := fields[i]
		if strings.HasPrefix(w, "(") || strings.HasPrefix(w, "#") || w == "|" || strings.HasPrefix(w, "[") {
			break
		}
		bare := strings.TrimRight(w, ",;:.)")
		last := bare != w
		if bare == "" {
			break
		}
		placeholder := !literalWord(bare)
		switch {
		case strings.HasPrefix(bare, "-") && len(bare) > 1:
			inPath = false
			words = append(words, docWord{s: bare, literal: true})
			if last || strings.Contains(bare, "=") || i+1 >= len(fields) {
				break
			}
			cmd.InitDefaultHelpFlag()
			fl := cmd.Flags()
			cmd.InheritedFlags()
			f := fl.Lookup(strings.TrimLeft(bare, "-"))
			if !strings.HasPrefix(bare, "--") {
				f = fl.ShorthandLookup(bare[1:2])
			}
			if f != nil && f.NoOptDefVal == "" && (strings.HasPrefix(bare, "--") || len(bare) == 2) {
				i++
				v := strings.TrimRight(fields[i], ",;:.)")
				last = v != fields[i]
				words = append(words, docWord{s: unquoteWord(v), literal: literalWord(v)})
			}
		case inPath && childNamed(cmd, bare) != nil:
			cmd = childNamed(cmd, bare)
			words = append(words, docWord{s: bare, literal: true})
		case inPath && !cmd.Runnable() && !placeholder:
			// A group names a subcommand next: read the word, so a
			// misspelt one is reported.
			words = append(words, docWord{s: bare, literal: true})
			last = true
		case placeholder:
			inPath = false
			args = append(args, bare)
			words = append(words, docWord{s: unquoteWord(bare), literal: false})
		case cmd.Runnable() && (i+1 < len(fields) && strings.HasPrefix(fields[i+1], "-") ||
			(last || i+1 == len(fields)) && cmd.ValidateArgs(args) != nil):
			// A literal argument: one a flag follows, or one the command
			// needs that ends the sentence ("… muster ca rotate jwt.").
			inPath = false
			args = append(args, bare)
			words = append(words, docWord{s: bare, literal: true})
		default:
			last = true
		}
		if last {
			break
		}
	}
	return docCommand{text: "muster " + joinWords(words), words: words}, true
}

// literalWord reports whether w is a literal, not a placeholder (X for a
// format verb, NAME, FILE, sha256:…, <id>, $VAR, or a quoted value).
func literalWord(w string) bool {
	return !strings.ContainsAny(w, "$…'\"") && !upperWord.MatchString(w) && !angleHolder.MatchString(w)
}

func unquoteWord(w string) string {
	if len(w) >= 2 && (w[0] == '\'' || w[0] == '"') && w[len(w)-1] == w[0] {
		return w[1 : len(w)-1]
	}
	return w
}

// TestHintCommandChecker shows the hint check fails on what a hint can get
// wrong, and passes what the program writes on purpose.
func TestHintCommandChecker(t *testing.T) {
	root := newRoot(&Env{})
	for _, tc := range []struct {
		name, src string
		want      []string // one problem per entry, as "line: substring"
	}{
		{"wrong subcommand in prose", "var e = errors.New(\"run muster ca rotat --activate\")",
			[]string{`3: "muster ca" runs only its help: no subcommand "rotat"`}},
		{"wrong top-level command after run", "var e = errors.New(\"run muster tokens list\")",
			[]string{`3: unknown command "tokens"`}},
		{"wrong flag with a format verb", "func f() error { return fmt.Errorf(\"%s does not exist: run muster init --dta %s\", d, d) }",
			[]string{`3: unknown flag --dta for "muster init"`}},
		{"wrong flag in backquotes", "func f() error {\n\treturn status.Errorf(codes.FailedPrecondition,\n\t\t\"activate it with `muster ca rotate %s --activat`, or wait\", role)\n}",
			[]string{`5: unknown flag --activat`}},
		{"flag named without its value", "var e = errors.New(\"give it to muster bot add NAME --public-key, or join\")",
			[]string{`3: flag --public-key needs a value`}},
		{"missing argument", "const doc = `ID first. muster discovery forget deletes a registration.`",
			[]string{`3: arguments []: accepts 1 arg(s)`}},
		{"wrong subcommand in a concatenation", "func f(p string) error {\n\treturn rootRule(\"in progress (phase \" + p + \"); finish it with muster ca root next-phaze\")\n}",
			[]string{`4: "muster ca root" runs only its help: no subcommand "next-phaze"`}},
		{"wrong flag in a printed banner", "func f() {\n\tfmt.Fprintf(w, `\nmuster dev: authority %s is listening\n  1. Create a join token:\n       %s token create --dta %s\n`, id, m, q)\n}",
			[]string{`7: unknown flag --dta`}},
		{"wrong flag after a pipe", "var s = fmt.Sprintf(\"%s psk show --data %s --raw | %s agent join --psk-fil -\", m, d, m)",
			[]string{`3: unknown flag --psk-fil`}},
		{"wrong flag on a printed line with a literal argument", "const next = \"Next:\\n  muster signer revoke v2 --bogus\\n\"",
			[]string{`3: unknown flag --bogus`}},
		{"wrong flag of the pkcs11 build on a printed line", "func f() {\n\tfmt.Fprintf(w, `Next:\n  1. Restart:\n       muster-pkcs11 authority --data DIR --pkcs11-modul %s\n`, m)\n}",
			[]string{`6: unknown flag --pkcs11-modul`}},
		{"right hints", "package x\n" +
			"var a = fmt.Errorf(\"%s does not exist: run muster init --data %s\", d, d)\n" +
			"var b = errors.New(\"the data directory holds no identity: join first (muster agent join)\")\n" +
			"var c = fmt.Errorf(\"see `muster audit list --action 'ca.*'`; run muster admin add %s --offline --data DIR, run where\", n)\n" +
			"const d = \"Next:\\n  muster signer revoke v2\\n  muster ca rotate ROLE --activate     (bootstrap, server)\\n\"\n" +
			"var e = fmt.Sprintf(\"%s version %d, root %s\", r, v, fp)\n" +
			"var f = fmt.Sprintf(\"muster dev: authority %s is listening; muster is a tool; dist/muster tokens; muster authority's address\", a)\n" +
			"var g = audit.Event{Actor: \"muster discovery forget\", Description: \"muster bench \" + run}\n" +
			"var h = x509.Certificate{Subject: pkix.Name{CommonName: \"muster discovery CA\"}}\n" +
			"const migrateActor = \"muster ca migrate-custody --bogus\"\n" +
			"var i = cobra.Command{Example: \"  muster token creat\"}\n" +
			"var j = \"(muster agent join --psk-file FILE, with the CA fingerprint). muster init\\ncreates it. muster discovery forget AUTHORITY_ID.\"\n" +
			"var k = \"100%% done: muster ca rotate jwt\"\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := tc.src
			if !strings.HasPrefix(src, "package ") {
				src = "package x\n\n" + src
			}
			cmds, err := hintCommands(root, "x.go", []byte(src))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range cmds {
				if p := checkDocCommand(root, c); p != "" {
					got = append(got, fmt.Sprintf("%d: %s", c.line, p))
				}
			}
			if len(got) != len(tc.want) {
				t.Fatalf("problems %q, want %q (commands %v)", got, tc.want, cmds)
			}
			for i := range got {
				if !strings.HasPrefix(got[i], tc.want[i]) {
					t.Errorf("problem %q, want one starting %q", got[i], tc.want[i])
				}
			}
		})
	}
}

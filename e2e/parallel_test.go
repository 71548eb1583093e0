package e2e

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// serialTests are the tests that do not call t.Parallel, and why: each
// checks a window of the product's timing that tests running beside it on
// a loaded machine could stretch (a stream closed within a second of a
// lock, a list refused within 5 s), or measures or loads the authority
// itself. Go runs them one after the other, before the parallel tests
// start. Every other test calls t.Parallel first
// (TestEveryTestIsParallelOrSerial).
var serialTests = map[string]string{
	"TestIdleConnectionMemory":                "measures the authority's resident memory; 500 ms probes of closed connections",
	"TestConnectionsInAllAreCapped":           "a connection past the cap closed within 1 s",
	"TestBench":                               "runs the load generator, reads the authority's CPU time",
	"TestAgentStream":                         "a stream closed within 1.5 s of a lock",
	"TestAgentStreamEnds":                     "streams closed within 1.5 s of a deletion, a supersession",
	"TestReplicasShareSignersAndStreams":      "a task through one replica reaches an agent on the other within 1 s",
	"TestForcedActivationReachesTheFleet":     "a signer step reaches a connected agent within 2 s",
	"TestEmergencyRevocationRevokes":          "a signer step reaches a connected agent within 2 s",
	"TestNonReadingStreamClosedByLock":        "a non-reading stream closed within 2 s of a lock",
	"TestLockRightAfterAnOutage":              "a stream closed within 2 s of a lock",
	"TestClientGoneMidJoinIsAudited":          "client deadlines of a few hundred microseconds aimed into a join",
	"TestConnectionSharesUnderAttack":         "an attacker's and operators' connections timed against each other",
	"TestHalfOpenConnectionsLeaveOperators":   "an attacker's and operators' connections timed against each other",
	"TestBootstrapRateLimit":                  "bad exchanges fast enough to outrun the rate limit's refill",
	"TestReadyzWhenIntermediatesCannotBeRead": "readiness follows the 3-second re-read within 5 s",
	"TestHalfOpenFloodFromManySources":        "an attacker's and an agent's connections timed against each other",
	"TestOneStreamPerAgentAcrossReplicas":     "the older stream ended within 5 s of a newer one on another replica",
	"TestWorkloadAPIServesAndPushes":          "a renewal and a bundle change reach open streams within 1 s",
	"TestWorkloadAPIPushesBoundKeyRotation":   "a bound-key refresh reaches open streams within 1 s",
}

// TestEveryTestIsParallelOrSerial: every test of the package either calls
// t.Parallel as its first statement or is in serialTests, not both, so
// that a new test that only waits does not add its waits to CI's time
// unnoticed.
func TestEveryTestIsParallelOrSerial(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*_test.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("test files: %v", err)
	}
	seen := map[string]bool{}
	fset := token.NewFileSet()
	for _, file := range files {
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Name.Name == "TestMain" {
				continue
			}
			name := fn.Name.Name
			seen[name] = true
			_, serial := serialTests[name]
			switch parallel := callsParallelFirst(fn); {
			case parallel && serial:
				t.Errorf("%s (%s) calls t.Parallel and is in serialTests: remove one", name, fset.Position(fn.Pos()))
			case !parallel && !serial:
				t.Errorf("%s (%s) neither calls t.Parallel first nor is in serialTests (with why it must run alone)", name, fset.Position(fn.Pos()))
			}
		}
	}
	for name := range serialTests {
		if !seen[name] {
			t.Errorf("serialTests names %s, which is no test of the package", name)
		}
	}
	// .ci/run runs the longest tests in a process of their own and skips
	// them in the main run: a name there that is no test would run
	// nothing there, unnoticed.
	ci, err := os.ReadFile("../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^long_e2e='\^\(([A-Za-z0-9_|]+)\)\$'$`).FindSubmatch(ci)
	if m == nil {
		t.Fatal("../.ci/run has no line long_e2e='^(TestA|TestB)$'")
	}
	for _, name := range strings.Split(string(m[1]), "|") {
		if !seen[name] {
			t.Errorf(".ci/run's long_e2e names %s, which is no test of the package", name)
		}
	}
}

// callsParallelFirst reports whether fn's first statement is t.Parallel().
func callsParallelFirst(fn *ast.FuncDecl) bool {
	if fn.Body == nil || len(fn.Body.List) == 0 {
		return false
	}
	es, ok := fn.Body.List[0].(*ast.ExprStmt)
	if !ok {
		return false
	}
	call, ok := es.X.(*ast.CallExpr)
	if !ok || len(call.Args) != 0 {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Parallel" {
		return false
	}
	recv, ok := sel.X.(*ast.Ident)
	return ok && len(fn.Type.Params.List) == 1 && len(fn.Type.Params.List[0].Names) == 1 && recv.Name == fn.Type.Params.List[0].Names[0].Name
}

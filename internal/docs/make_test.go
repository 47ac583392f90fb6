package docs

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/cli"
)

// makefiles are the Makefile and the files it includes.
var makefiles = []string{"Makefile", "cuda/kernels.mk", "cuda/emu/emu.mk"}

// makeTargets returns every target the Makefiles define, with its recipe.
func makeTargets(t *testing.T) map[string]string {
	t.Helper()
	target := regexp.MustCompile(`^([a-zA-Z0-9_.-]+)\s*:([^=]|$)`)
	recipes := map[string]string{}
	for _, f := range makefiles {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		cur := ""
		for _, l := range strings.Split(string(b), "\n") {
			if m := target.FindStringSubmatch(l); m != nil {
				cur = m[1]
				recipes[cur] += ""
				continue
			}
			if strings.HasPrefix(l, "\t") && cur != "" {
				recipes[cur] += l + "\n"
			} else if l != "" && !strings.HasPrefix(l, "#") {
				cur = ""
			}
		}
	}
	return recipes
}

// Every make target the README names exists, and the two commands it
// promises a newcomer do what it says: make demo runs the two kcheck
// commands its output shows, and make test vets, runs the tests under the
// race detector and, without it, the tests it leaves out (the documented examples, which
// skip under the detector, included).
func TestMakeTargets(t *testing.T) {
	recipes := makeTargets(t)
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	for _, m := range regexp.MustCompile("`make ([a-z][a-z0-9-]*)").FindAllStringSubmatch(string(b), -1) {
		named[m[1]] = true
	}
	forEachCodeLine(t, "README.md", func(_ int, l string) {
		for _, m := range regexp.MustCompile(`(?:^|&& |\|\| )make ([a-z][a-z0-9-]*)`).FindAllStringSubmatch(strings.TrimSpace(l), -1) {
			named[m[1]] = true
		}
	})
	if len(named) < 5 {
		t.Fatalf("the README names %d make targets: is the pattern still right?", len(named))
	}
	for n := range named {
		if _, ok := recipes[n]; !ok {
			t.Errorf("README.md names make %s, which no Makefile defines (%s)", n, strings.Join(makefiles, ", "))
		}
	}
	for _, want := range []string{"$(GO) vet $(PKGS)", "$(GO) test -race -short $(PKGS)", "$(GO) test $(TEST_FULL_PKGS)"} {
		if !strings.Contains(recipes["test"], want) {
			t.Errorf("make test does not run %q, as the README says it does:\n%s", want, recipes["test"])
		}
	}
	var ran []string
	for _, m := range regexp.MustCompile(`@bin/kcheck ([^;\n]+)`).FindAllStringSubmatch(recipes["demo"], -1) {
		ran = append(ran, "kcheck "+strings.TrimSpace(m[1]))
	}
	shown := demoCommands(t)
	if strings.Join(ran, "\n") != strings.Join(commandsOf(shown), "\n") {
		t.Errorf("make demo runs\n  %s\nbut the README shows\n  %s", strings.Join(ran, "\n  "), strings.Join(commandsOf(shown), "\n  "))
	}
}

// demoRun is one command of the README's make demo transcript and the
// output it shows.
type demoRun struct {
	cmd    string
	output []string
}

func commandsOf(rs []demoRun) []string {
	var c []string
	for _, r := range rs {
		c = append(c, r.cmd)
	}
	return c
}

// demoCommands reads the README's transcript of make demo: the indented
// block after "What `make demo` prints", each "$ kcheck ..." line followed
// by its output up to the demo's own "(exit ...)" line.
func demoCommands(t *testing.T) []demoRun {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), "What `make demo` prints")
	if !ok {
		t.Fatal("README.md has no transcript of make demo")
	}
	var runs []demoRun
	in := false
	for _, l := range strings.Split(after, "\n")[1:] {
		switch {
		case strings.HasPrefix(l, "    $ "):
			runs = append(runs, demoRun{cmd: strings.TrimPrefix(l, "    $ ")})
			in = true
		case strings.HasPrefix(l, "    (exit"):
			in = false
		case in && (strings.HasPrefix(l, "    ") || l == ""):
			runs[len(runs)-1].output = append(runs[len(runs)-1].output, strings.TrimPrefix(l, "    "))
		case !strings.HasPrefix(l, "    ") && l != "" && len(runs) > 0:
			return runs
		}
	}
	return runs
}

// elapsed is the closing line's timing, the one part of the transcript
// that differs run to run.
var elapsed = regexp.MustCompile(` in [0-9.]+(ms|s)$`)

// The README's transcript of make demo is what the commands print, line for
// line (the closing line's time aside): it says "verbatim".
func TestREADMEDemoTranscript(t *testing.T) {
	if raceEnabled {
		t.Skip("whole kcheck runs: make test runs this test without the race detector")
	}
	runs := demoCommands(t)
	if len(runs) != 2 {
		t.Fatalf("the transcript shows %d commands, want make demo's 2", len(runs))
	}
	t.Chdir(sandbox(t))
	for _, r := range runs {
		argv, _, _, err := shellSplit(r.cmd)
		if err != nil || len(argv) < 2 || argv[0] != "kcheck" {
			t.Fatalf("%q: %v", r.cmd, err)
		}
		var out bytes.Buffer
		cli.Main(argv[1:], strings.NewReader(""), &out, &out)
		got := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
		want := r.output
		for len(want) > 0 && want[len(want)-1] == "" {
			want = want[:len(want)-1]
		}
		for i := range max(len(got), len(want)) {
			g, w := "", ""
			if i < len(got) {
				g = elapsed.ReplaceAllString(got[i], " in Ts")
			}
			if i < len(want) {
				w = elapsed.ReplaceAllString(want[i], " in Ts")
			}
			if g != w {
				t.Errorf("%s: line %d of the README's transcript is stale (run make demo and paste its output):\n  README: %s\n  prints: %s", r.cmd, i+1, w, g)
				break
			}
		}
	}
}

// make test's second pass runs only the packages FULL_PKGS finds by their
// markers (testing.Short() or a raceEnabled constant): a test that skipped
// or shrank in the first pass for another reason written another way would
// never run whole. So every Skip in a test whose condition is about the
// race detector or -short must use one of the two markers, and the
// Makefile's pattern must be the one this test checks for.
func TestSecondPassFindsEverySkip(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `grep -rlE 'testing\.Short\(\)|raceEnabled' --include='*.go' cases cmd cuda internal reference`) {
		t.Fatal("Makefile's FULL_PKGS no longer finds packages by testing.Short() or raceEnabled: update this test with it")
	}
	about := regexp.MustCompile(`(?i)race|short`)
	marker := regexp.MustCompile(`testing\.Short\(\)|raceEnabled`)
	checked := 0
	for _, dir := range []string{"cases", "cmd", "cuda", "internal", "reference"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			lines := strings.Split(string(src), "\n")
			for i, l := range lines {
				if !strings.Contains(l, ".Skip") {
					continue
				}
				// the nearest if above the Skip is its condition
				for j := i - 1; j >= 0 && j >= i-4; j-- {
					c := strings.TrimSpace(lines[j])
					if !strings.HasPrefix(c, "if ") && !strings.HasPrefix(c, "} else if ") {
						continue
					}
					checked++
					if about.MatchString(c) && !marker.MatchString(c) {
						rel, _ := filepath.Rel(root, path)
						t.Errorf("%s:%d: %q skips on the race detector or -short without testing.Short() or raceEnabled: make test's second pass (FULL_PKGS) would not find it", rel, j+1, c)
					}
					break
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if checked < 10 {
		t.Fatalf("found %d skip conditions: is the scan still right?", checked)
	}
}

package docs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/cli"
)

// root is the repository, from this package's directory.
const root = "../.."

// rule says what a documented command must do when run as shown. Exactly
// one of exit, interrupted, resolve and skip applies.
type rule struct {
	// exit is the status the command must end with, run in full.
	exit *cli.ExitCode
	// interrupted: the command takes too long for make test (the reason),
	// so it runs under a context canceled before it starts: its flags,
	// files, case names, backends and faults are resolved and it must stop
	// with 130 before doing the work. KCHECK_SLOW_EXAMPLES=1 runs it in
	// full instead (any of pass, fail, inconclusive).
	interrupted string
	// resolve: the command takes too long and does not stop on
	// cancellation (the reason); its --case names and --backend are
	// resolved against the catalog and the backends instead.
	resolve string
	// skip: it cannot run here (the reason: a GPU, the Python venv, an
	// engine's captures).
	skip string
}

func exits(c cli.ExitCode) rule { return rule{exit: &c} }

// documented is every command the help texts and README.md show, by its
// text (without a trailing # comment). A command shown that is not here
// fails the test (classify it), and so does one here that is shown nowhere.
var documented = map[string]rule{
	// kcheck check --help
	"kcheck check fixtures/examples/nvfp4_dequant_ok.safetensors": exits(cli.ExitPass),
	"kcheck check --json fixtures/ | jq .verdict":                 exits(cli.ExitFail), // the examples carry planted faults
	"git bisect run kcheck check --bisect capture.safetensors":    exits(cli.ExitFail), // the judge git bisect runs, on a failing capture: "bad"
	// kcheck run --help
	"kcheck run --case mla_decode/deepseek-v3/tp8/bf16/p64/ctx-P+1":                               exits(cli.ExitPass),
	"kcheck run --match 'nvfp4_*' --backend faulty:nibble_order":                                  {interrupted: "24 NVFP4 cases at real MoE sizes, about 160 s"},
	"kcheck run --backend cuda --shard 3/16 --json > shard-3.json":                                {skip: "needs a GPU (--backend cuda)"},
	"kcheck bench --backend cuda":                                                                 {skip: "needs a GPU (--backend cuda)"},
	"kcheck bench --backend reference --case bench/nvfp4_gemm/gate_up_n2048_k7168/m16 --repeat 3": {resolve: "three 16x2048x7168 GEMMs, about 18 s, and bench does not stop on cancellation"},
	// kcheck bisect --help, and the README's bisect section
	"kcheck bisect --simulate --backend faulty:stale_pages --prompts 3 --steps 12":                   {interrupted: "a binary search over 36 simulated decode steps, about 40 s"},
	"kcheck bisect --case kv_cache_gather/bf16/p16/ctx-3P --backend faulty:page_boundary_off_by_one": exits(cli.ExitFail),
	"kcheck bisect --simulate --backend cuda --kv-cache-dtype fp8_ds_mla --prompts 3 --steps 12":     {skip: "needs a GPU (--backend cuda)"},
	"kcheck bisect --case kv_cache_gather/bf16/p16/ctx-3P --backend cuda":                            {skip: "needs a GPU (--backend cuda)"},
	// kcheck diagnose --help, and the README's diagnose section
	"kcheck diagnose fixtures/examples/pipeline_quant_nibble_order.safetensors":                                                exits(cli.ExitFail),
	"kcheck diagnose --simulate --preset deepseek-v3 --tp 8 --backend faulty:stale_pages --prompts 3 --steps 12":               {interrupted: "three prompts of a simulated decoder and one run a stage swap, about 40 s"},
	"kcheck diagnose --simulate --backend cuda --kv-cache-dtype fp8_ds_mla --json | jq .stage":                                 {skip: "needs a GPU (--backend cuda)"},
	"kcheck diagnose --simulate --backend faulty:stale_pages --prompts 3 --steps 8":                                            {interrupted: "three prompts of a simulated decoder and one run a stage swap, about 25 s"},
	"kcheck diagnose /tmp/caps/pipeline.l0.s0-7.safetensors":                                                                   {skip: "needs a capture from a running engine (the hook, python/kcheck/capture)"},
	"kcheck diagnose fixtures/examples/pipeline_cache_page_off_by_one.safetensors":                                             exits(cli.ExitFail),
	"kcheck merge shard-*.json > all.json":                                                                                     exits(cli.ExitFail), // the shards hold a failing result
	"kcheck check --json capture.safetensors > results.json":                                                                   exits(cli.ExitFail),
	"kcheck report --out report results.json":                                                                                  exits(cli.ExitPass),
	"kcheck check --report report-full capture.safetensors":                                                                    exits(cli.ExitFail),
	"kcheck shrink --case mla_decode/deepseek-v3/tp8/bf16/p64/ctx-P+1 --backend faulty:page_tail_attended -o tail.safetensors": exits(cli.ExitPass),
	"kcheck shrink capture.safetensors -o capture.min.safetensors":                                                             exits(cli.ExitPass),
	// README.md
	"kcheck check --quiet fixtures/examples":                                                                        exits(cli.ExitFail),
	"kcheck check --from vllm /tmp/caps":                                                                            {skip: "needs captures from a running vLLM (the hook, python/kcheck/capture)"},
	"kcheck check capture.safetensors":                                                                              exits(cli.ExitFail),
	"kcheck check --json fixtures/examples | jq -r '.file + \" \" + .verdict'":                                      exits(cli.ExitFail),
	"kcheck check --report fixtures/examples/report fixtures/examples/pipeline_cache_page_off_by_one.safetensors":   exits(cli.ExitFail),
	"bin/kcheck run --backend worker:vllm,lse_dtype=f32,partials=off --match 'mla_decode/deepseek-v3/tp8/bf16/*'":   {skip: "needs the Python venv (make python-setup) and vLLM"},
	"bin/kcheck run --backend worker:sglang --match 'kv_cache_write/fp8_ds_mla/*/amax'":                             {skip: "needs the Python venv (make python-setup) and SGLang"},
	"bin/kcheck run --backend worker:torchao --match 'nvfp4_quantize/*'":                                            {skip: "needs the Python venv (make python-setup) and torchao"},
	"kcheck run --backend cuda --long --shard ${SLURM_ARRAY_TASK_ID}/16 --json > shard-${SLURM_ARRAY_TASK_ID}.json": {skip: "needs a GPU and a Slurm array job"},
}

// example is one documented command and where it is shown.
type example struct {
	where, cmd string
}

// TestDocumentedExamples runs every kcheck command the help texts and the
// README show, as shown, in a directory laid out like the repository's
// (fixtures/ and a failing capture.safetensors), and holds each to its
// rule. A help text's examples run in order in one directory, as a user
// would type them; so do the README's.
func TestDocumentedExamples(t *testing.T) {
	if raceEnabled {
		t.Skip("whole kcheck runs: make test runs this test without the race detector")
	}
	groups := append(helpExamples(t), readmeExamples(t))
	seen := map[string]bool{}
	for _, g := range groups {
		for _, ex := range g {
			seen[ex.cmd] = true
		}
	}
	for cmd := range documented {
		if !seen[cmd] {
			t.Errorf("documented lists %q, which no help text or README shows any more: remove it", cmd)
		}
	}
	slow := os.Getenv("KCHECK_SLOW_EXAMPLES") != ""
	for _, g := range groups {
		t.Run(g[0].where, func(t *testing.T) {
			dir := sandbox(t)
			t.Chdir(dir)
			for _, ex := range g {
				if strings.HasPrefix(ex.cmd, "make ") || ex.cmd == "make" {
					continue // TestMakeTargets
				}
				r, ok := documented[ex.cmd]
				if !ok {
					t.Errorf("%s shows %q, which this test does not know: add it to documented with what it must do", ex.where, ex.cmd)
					continue
				}
				if r.skip != "" {
					t.Logf("skipped %q: %s", ex.cmd, r.skip)
					continue
				}
				runExample(t, dir, ex, r, slow)
			}
		})
	}
}

// runExample runs one command in dir and checks it against r.
func runExample(t *testing.T, dir string, ex example, r rule, slow bool) {
	t.Helper()
	argv, filter, redirect, err := shellSplit(ex.cmd)
	if err != nil {
		t.Errorf("%s: %q: %v", ex.where, ex.cmd, err)
		return
	}
	if len(argv) >= 3 && argv[0] == "git" && argv[1] == "bisect" && argv[2] == "run" {
		argv = argv[3:] // the command git bisect runs at each revision
	}
	if len(argv) == 0 || (argv[0] != "kcheck" && argv[0] != "bin/kcheck") {
		t.Errorf("%s: %q does not run kcheck", ex.where, ex.cmd)
		return
	}
	args := globbed(t, dir, argv[1:])
	if r.resolve != "" {
		t.Logf("not run %q (%s): resolving its cases and backend", ex.cmd, r.resolve)
		resolve(t, ex, args)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	want := r.exit
	if r.interrupted != "" && !slow {
		cancel()
		c := cli.ExitInterrupted
		want = &c
		t.Logf("interrupted %q at once (%s; KCHECK_SLOW_EXAMPLES=1 runs it): its arguments are resolved", ex.cmd, r.interrupted)
	}
	var out, errw bytes.Buffer
	code := cli.MainContext(ctx, args, strings.NewReader(""), &out, &errw)
	switch {
	case want == nil: // a slow example run in full
		if code != cli.ExitPass && code != cli.ExitFail && code != cli.ExitInconclusive {
			t.Errorf("%s: %q: exit %d, want a verdict (0, 1 or 3)\nstderr: %.2000s", ex.where, ex.cmd, code, errw.String())
		}
	case code != *want:
		t.Errorf("%s: %q: exit %d, want %d\nstdout: %.1000s\nstderr: %.2000s", ex.where, ex.cmd, code, *want, out.String(), errw.String())
	}
	if redirect != "" {
		if err := os.WriteFile(filepath.Join(dir, redirect), out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if strings.HasPrefix(filter, "jq") && code != cli.ExitInterrupted {
		checkJSONLines(t, ex, out.String())
	}
}

// checkJSONLines: what a `| jq` example reads must be JSON objects, one a line.
func checkJSONLines(t *testing.T, ex example, s string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i, l := range lines {
		var v map[string]any
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Errorf("%s: %q: line %d of its output is not a JSON object for jq: %v\n%.300s", ex.where, ex.cmd, i+1, err, l)
			return
		}
	}
}

// resolve checks what a command that cannot run here names: each --case
// is a catalog case, each --backend a backend kcheck knows.
func resolve(t *testing.T, ex example, args []string) {
	t.Helper()
	all, err := cases.Catalog()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, c := range all {
		names[c.Name] = true
	}
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "--case":
			if !names[args[i+1]] {
				t.Errorf("%s: %q: no catalog case %q", ex.where, ex.cmd, args[i+1])
			}
		case "--backend":
			if _, err := backend.Parse(args[i+1]); err != nil {
				t.Errorf("%s: %q: %v", ex.where, ex.cmd, err)
			}
		}
	}
}

// helpExamples returns each command's help examples, a group a command.
func helpExamples(t *testing.T) [][]example {
	t.Helper()
	var groups [][]example
	for _, name := range subcommands(t) {
		help := helpText(t, name, "--help")
		_, after, ok := strings.Cut(help, "\nExamples:\n")
		if !ok {
			continue
		}
		block, _, _ := strings.Cut(after, "\n\n")
		var g []example
		for _, l := range strings.Split(block, "\n") {
			if cmd := stripComment(strings.TrimSpace(l)); cmd != "" {
				g = append(g, example{where: "kcheck " + name + " --help", cmd: cmd})
			}
		}
		groups = append(groups, g)
	}
	if len(groups) < 5 {
		t.Fatalf("found the examples of %d commands only: is the help format still cobra's?", len(groups))
	}
	return groups
}

// subcommands lists the commands `kcheck --help` shows.
func subcommands(t *testing.T) []string {
	t.Helper()
	help := helpText(t, "--help")
	_, after, ok := strings.Cut(help, "\nAvailable Commands:\n")
	if !ok {
		t.Fatalf("kcheck --help lists no commands:\n%s", help)
	}
	block, _, _ := strings.Cut(after, "\n\n")
	var names []string
	for _, l := range strings.Split(block, "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && f[0] != "help" && f[0] != "completion" {
			names = append(names, f[0])
		}
	}
	return names
}

func helpText(t *testing.T, args ...string) string {
	t.Helper()
	var out, errw bytes.Buffer
	if code := cli.Main(args, strings.NewReader(""), &out, &errw); code != cli.ExitPass {
		t.Fatalf("kcheck %v: exit %d\n%s", args, code, errw.String())
	}
	return out.String()
}

// readmeShows matches a README code line that runs kcheck or make, after an
// optional "$ " prompt.
var readmeShows = regexp.MustCompile(`^(?:\$ )?((?:kcheck|bin/kcheck|make) .*|make)$`)

// readmeExamples returns the README's kcheck and make commands, the lines
// of its code blocks (fenced or indented) that start with one.
func readmeExamples(t *testing.T) []example {
	t.Helper()
	var g []example
	forEachCodeLine(t, "README.md", func(n int, line string) {
		if m := readmeShows.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			g = append(g, example{where: "README.md", cmd: stripComment(m[1])})
		}
	})
	if len(g) < 10 {
		t.Fatalf("found %d commands in README.md: is the code block format still the same?", len(g))
	}
	return g
}

// forEachCodeLine calls fn with every line of a Markdown file's code
// blocks: fenced (```) or indented four spaces.
func forEachCodeLine(t *testing.T, file string, fn func(n int, line string)) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	fenced := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		if strings.HasPrefix(l, "```") {
			fenced = !fenced
			continue
		}
		if fenced || strings.HasPrefix(l, "    ") {
			fn(n, l)
		}
	}
}

// stripComment removes a shell comment (" #" outside quotes) and spaces.
func stripComment(s string) string {
	var q rune
	for i, r := range s {
		switch {
		case q != 0:
			if r == q {
				q = 0
			}
		case r == '\'' || r == '"':
			q = r
		case r == '#' && (i == 0 || s[i-1] == ' '):
			return strings.TrimSpace(s[:i])
		}
	}
	return strings.TrimSpace(s)
}

// shellSplit splits a command line as a POSIX shell would, for the forms
// the documents use: quoted words, one pipe (whose right side is returned
// as filter) and a final "> FILE" redirect.
func shellSplit(s string) (argv []string, filter, redirect string, err error) {
	var word strings.Builder
	inWord, q := false, rune(0)
	flush := func() {
		if inWord {
			argv = append(argv, word.String())
			word.Reset()
			inWord = false
		}
	}
	for i, r := range s {
		switch {
		case q != 0:
			if r == q {
				q = 0
			} else {
				word.WriteRune(r)
			}
		case r == '\'' || r == '"':
			q, inWord = r, true
		case r == ' ':
			flush()
		case r == '|':
			flush()
			filter = strings.TrimSpace(s[i+1:])
			return argv, filter, redirect, nil
		case r == '&' || r == ';' || r == '$' || r == '<':
			return nil, "", "", fmt.Errorf("shell syntax %q this test does not run", r)
		case r == '>':
			flush()
			rest := strings.Fields(s[i+1:])
			if len(rest) != 1 {
				return nil, "", "", fmt.Errorf("a redirect must name one file")
			}
			return argv, filter, rest[0], nil
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	if q != 0 {
		return nil, "", "", fmt.Errorf("unterminated quote")
	}
	flush()
	return argv, filter, redirect, nil
}

// globbed expands words with a * that match files in dir, as the shell
// would (a quoted glob reaches kcheck as written: the documents quote
// those).
func globbed(t *testing.T, dir string, args []string) []string {
	t.Helper()
	var out []string
	for _, a := range args {
		if strings.Contains(a, "*") && !strings.Contains(a, "/") {
			if m, _ := filepath.Glob(filepath.Join(dir, a)); len(m) > 0 {
				for _, f := range m {
					out = append(out, filepath.Base(f))
				}
				continue
			}
		}
		out = append(out, a)
	}
	return out
}

// failingCapture stands for the documents' capture.safetensors: a single
// kernel capture with a planted fault (a gather reading each page's first
// token one page off).
const failingCapture = "fixtures/examples/kv_cache_gather_page_off_by_one.safetensors"

// sandbox is a directory laid out as the documents assume a checkout is:
// the shipped captures under fixtures/ (links to the files, so nothing the
// examples write lands in the repository: the committed example report is
// not linked), capture.safetensors, and two shard results for merge.
func sandbox(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, sub := range []string{"golden", "examples"} {
		if err := os.MkdirAll(filepath.Join(dir, "fixtures", sub), 0o755); err != nil {
			t.Fatal(err)
		}
		files, err := filepath.Glob(filepath.Join(root, "fixtures", sub, "*.safetensors"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no fixtures under fixtures/%s: %v", sub, err)
		}
		for _, f := range files {
			abs, err := filepath.Abs(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(abs, filepath.Join(dir, "fixtures", sub, filepath.Base(f))); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.Symlink(filepath.Join(dir, failingCapture), filepath.Join(dir, "capture.safetensors")); err != nil {
		t.Fatal(err)
	}
	for i, f := range []string{"fixtures/golden/nvfp4_gemm.safetensors", failingCapture} {
		var out bytes.Buffer
		cli.Main([]string{"check", "--json", filepath.Join(dir, f)}, strings.NewReader(""), &out, &bytes.Buffer{})
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("shard-%d.json", i)), out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

package report

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

const fx = "../../fixtures/"

// fixtureBundle checks shipped evidence files the way `check --report`
// does: a recorder observes the checks, each item keeps its profiles and
// the hash of its file.
func fixtureBundle(t *testing.T, files ...string) Bundle {
	t.Helper()
	b := NewBundle("kcheck check --report DIR ...")
	rec := NewRecorder()
	for _, f := range files {
		path := fx + f
		res := check.File(t.Context(), path, nil, rec.Options(check.Options{}))
		if res.Error != nil {
			t.Fatalf("%s: %s", f, *res.Error)
		}
		ev, err := HashFiles(path)
		if err != nil {
			t.Fatal(err)
		}
		b.Items = append(b.Items, Item{Result: res, Reproduce: "kcheck check " + path, Profiles: rec.Take(), Evidence: ev})
	}
	return b
}

var threeFixtures = []string{
	"examples/pipeline_quant_nibble_order.safetensors",
	"examples/nvfp4_dequant_nibble_order.safetensors",
	"golden/mla_decode.safetensors",
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// shared is one report of threeFixtures, written once for the tests that
// read it (rendering PNGs is the slow part).
var shared struct {
	once  sync.Once
	b     Bundle
	dir   string
	files []string
	err   error
}

func sharedReport(t *testing.T) (Bundle, string, []string) {
	t.Helper()
	shared.once.Do(func() {
		shared.b = fixtureBundle(t, threeFixtures...)
		shared.dir, shared.err = os.MkdirTemp("", "kcheck-report-test-")
		if shared.err == nil {
			shared.files, shared.err = WriteDir(shared.dir, shared.b, WriteOptions{})
		}
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.b, shared.dir, shared.files
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

// The Markdown holds every section a bug report needs, each plot it links
// is a valid PNG, and every PNG written is linked.
func TestWriteDirSections(t *testing.T) {
	b, dir, files := sharedReport(t)
	md := readFile(t, filepath.Join(dir, MarkdownFile))
	for _, want := range []string{
		"## kcheck report: 2 fail, 1 pass",
		"| 1 | `" + fx + threeFixtures[0] + "` | pipeline | **FAIL** | `quant` |",
		"Reproduce:\n\n```sh\nkcheck check " + fx + threeFixtures[1] + "\n```",
		"Capture: source `kcheck fixtures (faulty:nibble_order)`",
		"| stage | kernel | verdict | local worst err/tol | propagated worst err/tol |",
		"The first stage whose local error leaves its budget is **`quant`**",
		"**In short:** stage `quant` (nvfp4_gemm) fails on its own captured inputs",
		"| metric | value | noise floor (expected vs exact) | bound |",
		"| max abs error |", "| cos diff |", "| RMSE |", "| SQNR (dB) |",
		"Worst elements:", "| where | actual | expected | exact | err | tol | err/tol |",
		"**Signature: `",
		"Outputs that pass:",
		"### Environment", "| Go | go",
		"### Evidence files",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report.md lacks %q", want)
		}
	}
	// The worst elements are named in the kernel's coordinates.
	if !regexp.MustCompile(`\| row \d+, col \d+, block16 \d+`).MatchString(md) {
		t.Error("worst elements are not named by row, col and block16")
	}
	for _, it := range b.Items {
		for _, e := range it.Evidence {
			if !strings.Contains(md, "| `"+e.File+"` | ") || !strings.Contains(md, e.SHA256) {
				t.Errorf("evidence %s (%s) not listed", e.File, e.SHA256)
			}
		}
	}
	// Plots: every link resolves to a PNG, every PNG is linked.
	links := regexp.MustCompile(`!\[[^\]]*\]\((plots/[^)]+\.png)\)`).FindAllStringSubmatch(md, -1)
	if len(links) < 4 {
		t.Fatalf("%d plots linked, want at least 4 (two failing checks, two plots each)", len(links))
	}
	linked := map[string]bool{}
	for _, l := range links {
		linked[l[1]] = true
		f, err := os.Open(filepath.Join(dir, l[1]))
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: not a PNG: %v", l[1], err)
		}
		if r := img.Bounds(); r.Dx() < 300 || r.Dy() < 200 {
			t.Errorf("%s is %dx%d", l[1], r.Dx(), r.Dy())
		}
	}
	pngs, _ := filepath.Glob(filepath.Join(dir, PlotDir, "*"))
	for _, p := range pngs {
		rel, _ := filepath.Rel(dir, p)
		if !linked[filepath.ToSlash(rel)] {
			t.Errorf("%s written but not linked", rel)
		}
	}
	if len(files) != len(pngs)+2 {
		t.Errorf("WriteDir reported %d files; %d plots + report.md + report.json are there", len(files), len(pngs))
	}
	// Only the drawn (local, not passing) profiles are kept.
	var back Bundle
	if err := json.Unmarshal([]byte(readFile(t, filepath.Join(dir, JSONFile))), &back); err != nil {
		t.Fatalf("report.json does not parse: %v", err)
	}
	if len(back.Items) != 3 || back.Items[0].Result.Verdict != "fail" || *back.Items[0].Result.Stage != "quant" {
		t.Fatalf("report.json items: %+v", back.Items)
	}
	if n := len(back.Items[0].Profiles); n != 1 || back.Items[0].Profiles[0].Tensor != "quant.out" {
		t.Errorf("pipeline item keeps %d profiles, want quant.out only", n)
	}
}

// Re-rendering report.json gives the same Markdown and the same plots: the
// JSON is the whole report.
func TestRerenderFromJSON(t *testing.T) {
	_, d1, _ := sharedReport(t)
	d2 := t.TempDir()
	back, err := Load(filepath.Join(d1, JSONFile))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := WriteDir(d2, back, WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{MarkdownFile, JSONFile} {
		if a, b := readFile(t, filepath.Join(d1, f)), readFile(t, filepath.Join(d2, f)); a != b {
			t.Errorf("%s differs after re-rendering report.json", f)
		}
	}
	p1, _ := filepath.Glob(filepath.Join(d1, PlotDir, "*.png"))
	p2, _ := filepath.Glob(filepath.Join(d2, PlotDir, "*.png"))
	if len(p1) != len(p2) || len(p1) == 0 {
		t.Fatalf("plots %d then %d", len(p1), len(p2))
	}
	for i := range p1 {
		if readFile(t, p1[i]) != readFile(t, p2[i]) {
			t.Errorf("%s differs after re-rendering", filepath.Base(p1[i]))
		}
	}
}

// A profile aggregates the same err/tol compare judged: over any one
// coordinate, the largest value is the check's max_excess and the failing
// counts add up to its over_tol.
func TestProfileAgreesWithCompare(t *testing.T) {
	b := fixtureBundle(t, append(threeFixtures, "golden/kv_cache_write.safetensors", "examples/nvfp4_quantize_nibble_order.safetensors")...)
	n := 0
	for _, it := range b.Items {
		for _, c := range it.Result.Checks {
			p := findProfile(it.Profiles, c.Tensor)
			if p == nil {
				t.Errorf("%s %s: no profile", it.Result.File, c.Tensor)
				continue
			}
			if p.Sampled != 1 {
				continue
			}
			for _, cp := range p.Coords[:p.Axes] {
				mx, fails := 0.0, 0
				for j := range cp.Values {
					mx = math.Max(mx, float64(cp.Max[j]))
					fails += cp.Failing[j]
				}
				if want := float64(c.Metrics.MaxExcess); mx != want && !(math.IsInf(mx, 1) && math.IsInf(want, 1)) {
					t.Errorf("%s %s by %s: largest err/tol %v, compare says %v", it.Result.File, c.Tensor, cp.Name, mx, want)
				}
				if fails != c.Metrics.OverTol {
					t.Errorf("%s %s by %s: %d failing, compare says %d", it.Result.File, c.Tensor, cp.Name, fails, c.Metrics.OverTol)
				}
				n++
			}
		}
	}
	if n < 10 {
		t.Errorf("only %d coordinate profiles compared", n)
	}
}

// A profile's mean cannot look better than its elements: a group holding
// an infinite err/tol (a NaN or Inf where the expected output has none)
// has an infinite mean, drawn at the top beside its maximum, not the mean
// of its finite rest (an all-NaN output, the shipped example
// mla_decode_page_tail, had a mean of 0 everywhere, which the plot drew as
// a perfect output), and no mean exceeds its group's maximum.
func TestProfileMeanOfNonFinite(t *testing.T) {
	b := fixtureBundle(t, "examples/mla_decode_page_tail.safetensors", "golden/mla_decode.safetensors", "examples/kv_cache_gather_page_off_by_one.safetensors")
	nonFinite := 0
	for _, it := range b.Items {
		for _, p := range it.Profiles {
			if p.Sampled != 1 {
				continue
			}
			for _, cp := range p.Coords {
				for j, v := range cp.Values {
					mx, mean := float64(cp.Max[j]), float64(cp.Mean[j])
					if math.IsInf(mx, 1) {
						nonFinite++
						if !math.IsInf(mean, 1) {
							t.Errorf("%s %s, %s %d: largest err/tol +Inf, mean %v; want +Inf", it.Result.File, p.Tensor, cp.Name, v, mean)
						}
					}
					if mean > mx {
						t.Errorf("%s %s, %s %d: mean err/tol %v above the largest %v", it.Result.File, p.Tensor, cp.Name, v, mean, mx)
					}
				}
			}
		}
	}
	if nonFinite == 0 {
		t.Error("no group with an infinite err/tol: the fixture no longer holds the NaN outputs this test is about")
	}
}

// Without --force nothing is overwritten, the refusal comes before any
// write, and no temporary file is left behind; with it the files are
// replaced.
func TestWriteDirRefusesOverwrite(t *testing.T) {
	b := fixtureBundle(t, threeFixtures[1])
	dir := t.TempDir()
	noPlots := WriteOptions{NoPlots: true} // the refusal is the same for every file; PNGs are slow
	if _, err := WriteDir(dir, b, noPlots); err != nil {
		t.Fatal(err)
	}
	if err := Preflight(dir, false); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("Preflight on a written report: %v", err)
	}
	snapshot := func() map[string]string {
		m := map[string]string{}
		filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
			if err == nil && !fi.IsDir() {
				m[p] = readFile(t, p)
			}
			return nil
		})
		return m
	}
	before := snapshot()
	b2 := b
	b2.Title = "a different report"
	_, err := WriteDir(dir, b2, noPlots)
	if err == nil || !strings.Contains(err.Error(), "exists: not overwriting it (use --force)") {
		t.Fatalf("second WriteDir: %v", err)
	}
	after := snapshot()
	if len(after) != len(before) {
		t.Errorf("%d files before, %d after a refused write", len(before), len(after))
	}
	for p, c := range before {
		if after[p] != c {
			t.Errorf("%s changed by a refused write", p)
		}
	}
	if _, err := WriteDir(dir, b2, WriteOptions{Force: true, NoPlots: true}); err != nil {
		t.Fatal(err)
	}
	if md := readFile(t, filepath.Join(dir, MarkdownFile)); !strings.HasPrefix(md, "## a different report") {
		t.Errorf("--force did not replace report.md: %.40q", md)
	}
	var leftovers []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && strings.Contains(filepath.Base(p), ".tmp-") {
			leftovers = append(leftovers, p)
		}
		return nil
	})
	if len(leftovers) > 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}
}

// `check --json` lines re-render: items in order, a reproduction command
// for files that exist, and plots from the signature's groups only.
func TestLoadCheckJSONLines(t *testing.T) {
	b := fixtureBundle(t, threeFixtures[1], threeFixtures[2])
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, it := range b.Items {
		if err := enc.Encode(it.Result); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "results.json")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Items) != 2 || got.Items[0].Result.File != b.Items[0].Result.File {
		t.Fatalf("items: %+v", got.Items)
	}
	if want := "kcheck check " + fx + threeFixtures[1]; got.Items[0].Reproduce != want {
		t.Errorf("reproduce %q, want %q", got.Items[0].Reproduce, want)
	}
	var md bytes.Buffer
	if err := Markdown(&md, got, MarkdownOptions{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "**Signature: `") {
		t.Error("re-rendered Markdown lacks the signature")
	}

	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte(`{"file": "x", "verdict": "pass", "checks": []}`+"\n"+`{"hello": 1}`), 0o644)
	if _, err := Load(bad); err == nil || !strings.Contains(err.Error(), "object 2 is neither") {
		t.Errorf("Load of a stray object: %v", err)
	}
}

func intp(v int) *int { return &v }

// A diagnosis (reference/CONTRACTS.md §7.5's shape) renders its drift table, swaps and
// the drift plot, and loads from `diagnose --json` output.
func TestDiagnosisReport(t *testing.T) {
	stage := "cache"
	d := Diagnosis{Verdict: "fail", Stage: &stage, FirstStep: intp(25), FirstContextLen: intp(89)}
	for s := 0; s < 40; s++ {
		e := 1e-3
		if s >= 25 {
			e = 1e-3 * math.Pow(1.5, float64(s-24))
		}
		d.Steps = append(d.Steps, Step{Step: s, Prompt: s / 15, ContextLen: 64 + s, Error: compare.Float(e), Floor: 1.2e-3})
	}
	d.Swaps = []Swap{{Stage: "quant", MaxError: 0.5}, {Stage: "cache", MaxError: 1.1e-3, RemovesDrift: true}}
	js, _ := json.Marshal(d)
	path := filepath.Join(t.TempDir(), "diag.json")
	os.WriteFile(path, append(js, '\n'), 0o644)
	b, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if b.Diagnosis == nil || len(b.Diagnosis.Steps) != 40 {
		t.Fatalf("diagnosis not loaded: %+v", b.Diagnosis)
	}
	dir := t.TempDir()
	if _, err := WriteDir(dir, b, WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	md := readFile(t, filepath.Join(dir, MarkdownFile))
	for _, want := range []string{
		"## kcheck diagnosis: fail, culprit stage `cache`",
		"The error first leaves the noise floor at step 25 (context length 89).",
		"| `cache` | 0.0011 | **yes** |",
		"| 25 ← | 1 | 89 |",
		"![Figure 1, drift.png](plots/drift.png)", "*Figure 1, `drift.png`: error per decode step",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report.md lacks %q\n%s", want, md)
		}
	}
	f, err := os.Open(filepath.Join(dir, PlotDir, "drift.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Errorf("drift.png: %v", err)
	}
}

// Table cells survive pipes and newlines; metrics spell their special values.
func TestCellAndNum(t *testing.T) {
	if got := text("a|b\nc"); got != `a\|b\\nc` {
		t.Errorf("text = %q", got)
	}
	for v, want := range map[float64]string{math.Inf(1): "+Inf", math.Inf(-1): "-Inf", 0.000123456: "0.0001235", 12345678: "1.235e+07"} {
		if got := num(v); got != want {
			t.Errorf("num(%v) = %q, want %q", v, got, want)
		}
	}
	if num(math.NaN()) != "NaN" {
		t.Error("NaN")
	}
	if got := ShellQuote("a b'c"); got != `'a b'\''c'` {
		t.Errorf("shellQuote = %s", got)
	}
}

// HashFiles against the FIPS 180-2 test vector SHA-256("abc").
func TestHashFiles(t *testing.T) {
	p := filepath.Join(t.TempDir(), "abc")
	os.WriteFile(p, []byte("abc"), 0o644)
	ev, err := HashFiles(p)
	if err != nil {
		t.Fatal(err)
	}
	if ev[0].SHA256 != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" || ev[0].Bytes != 3 {
		t.Errorf("got %+v", ev[0])
	}
	if _, err := HashFiles(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing evidence file hashed")
	}
}

// Heat-map binning keeps at most maxGrid columns and puts every value in
// the bin that starts at or below it.
func TestGridBinning(t *testing.T) {
	cells := map[[2]int]float64{}
	for x := 0; x < 1000; x++ {
		cells[[2]int{x % 3, x}] = float64(x)
	}
	g := gridOf("token", "head", cells)
	if len(g.XVals) > maxGrid || g.XWidth < 2 || len(g.YVals) != 3 {
		t.Fatalf("grid %d x %d, width %d", len(g.YVals), len(g.XVals), g.XWidth)
	}
	if !sort.IntsAreSorted(g.XVals) {
		t.Error("bins unsorted")
	}
	// The last bin holds the largest value, 999, in the row 999 % 3 = 0.
	if got := float64(g.Max[0][len(g.XVals)-1]); got != 999 {
		t.Errorf("last bin of row 0 = %v, want 999", got)
	}
}

// fixedTol is a policy with one tolerance for every element.
type fixedTol float64

func (fixedTol) Name() string { return "fixed" }
func (f fixedTol) Bounds(context.Context, kernel.Output, tensor.DType) compare.Bounds {
	return compare.Bounds{Tol: func(int, float64, float64) float64 { return float64(f) }, Band: 1}
}

// The report judges no element itself: its profile is compare's (the one
// the signature was read from), so its largest value and failing count are
// the check's own max excess and over-tolerance count, at the failing
// elements' own coordinates.
func TestProfileIsCompares(t *testing.T) {
	const n = 1000
	ref := kernel.Output{Name: "out", Shape: []int{n}, Exact: make(kernel.Dense, n), Expected: make(kernel.Dense, n),
		Coords: kernel.Coords{Axes: []kernel.CoordKind{"token"}}}
	act := tensor.New(tensor.F32, n)
	for _, i := range []int{7, 503} {
		act.SetFloat64(i, 1)
	}
	act.SetFloat64(900, math.NaN())
	c, err := compare.Compare(ref, act, fixedTol(0.1), compare.Options{Profile: true})
	if err != nil {
		t.Fatal(err)
	}
	if c.Profile == nil {
		t.Fatal("compare built no profile")
	}
	p, _ := profileOf(check.Observation{Kernel: "k", Ref: &ref, Actual: act, Check: c, Policy: fixedTol(0.1)})
	if p.Sampled != 1 {
		t.Fatalf("sampled 1 in %d, want every element", p.Sampled)
	}
	tok := p.Coords[0]
	count, fails, found := 0, 0, map[int]float64{}
	for j, v := range tok.Values {
		count += tok.Count[j]
		fails += tok.Failing[j]
		if tok.Failing[j] > 0 {
			found[v] = float64(tok.Max[j])
		}
	}
	if count != n || fails != c.Metrics.OverTol || fails != 3 || found[7] != 10 || found[503] != 10 || !math.IsInf(found[900], 1) {
		t.Errorf("count %d (want %d), failing %d (want the check's %d, 3), failing values %v (want 7 and 503 at err/tol 10, 900 at +Inf)",
			count, n, fails, c.Metrics.OverTol, found)
	}
	// Without a profile asked for, a check carries none.
	if c, _ := compare.Compare(ref, act, fixedTol(0.1), compare.Options{}); c.Profile != nil {
		t.Error("a profile built that nobody asked for")
	}
}

// A diagnose result with more fields than the spec's converts through JSON.
func TestDiagnosisFrom(t *testing.T) {
	type step struct {
		Step     int     `json:"step"`
		Error    float64 `json:"error"`
		OffFloor bool    `json:"off_floor"`
	}
	v := struct {
		Verdict string `json:"verdict"`
		Reason  string `json:"reason"`
		Steps   []step `json:"steps"`
		Config  any    `json:"config"`
	}{"fail", "because", []step{{3, 0.5, true}}, map[string]int{"prompts": 2}}
	d, err := DiagnosisFrom(v)
	if err != nil || d.Verdict != "fail" || d.Reason != "because" || len(d.Steps) != 1 || d.Steps[0].Error != 0.5 {
		t.Errorf("got %+v, %v", d, err)
	}
}

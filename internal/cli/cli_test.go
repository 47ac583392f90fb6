package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/faults"
	"github.com/kcheck-dev/kcheck/internal/version"
)

const fx = "../../fixtures/"

func run(t *testing.T, args ...string) (ExitCode, string, string) {
	t.Helper()
	var out, errw bytes.Buffer
	code := Main(args, strings.NewReader(""), &out, &errw)
	return code, out.String(), errw.String()
}

// Exit status as reference/CONTRACTS.md §7.3 fixes it, with and without --bisect.
func TestCheckExitCodes(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.safetensors")
	if err := os.WriteFile(bad, []byte("not a safetensors file"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want ExitCode
	}{
		{"pass", []string{"check", fx + "examples/nvfp4_dequant_ok.safetensors"}, ExitPass},
		{"fail", []string{"check", fx + "examples/nvfp4_dequant_nibble_order.safetensors"}, ExitFail},
		{"fail beats pass", []string{"check", fx + "examples/nvfp4_dequant_ok.safetensors", fx + "examples/nvfp4_dequant_nibble_order.safetensors"}, ExitFail},
		{"unusable input", []string{"check", bad}, ExitUsage},
		{"unusable input, bisect", []string{"check", "--bisect", bad}, ExitSkip},
		{"fail, bisect", []string{"check", "--bisect", fx + "examples/nvfp4_dequant_nibble_order.safetensors"}, ExitFail},
		{"missing file", []string{"check", "/nonexistent.safetensors"}, ExitUsage},
		{"usage", []string{"check"}, ExitUsage},
		{"unknown flag", []string{"check", "--frobnicate", bad}, ExitUsage},
		{"directory", []string{"check", fx + "golden"}, ExitPass},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if code, out, errs := run(t, tc.args...); code != tc.want {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.want, out, errs)
			}
		})
	}
}

func TestExitForVerdict(t *testing.T) {
	tests := []struct {
		verdict compare.Verdict
		bisect  bool
		want    ExitCode
	}{
		{"pass", false, 0}, {"fail", false, 1}, {"error", false, 2}, {"inconclusive", false, 3},
		{"pass", true, 0}, {"fail", true, 1}, {"error", true, 125}, {"inconclusive", true, 125},
	}
	for _, tc := range tests {
		if got := exitForVerdict(tc.verdict, tc.bisect); got != tc.want {
			t.Errorf("exitForVerdict(%s, bisect=%v) = %d, want %d", tc.verdict, tc.bisect, got, tc.want)
		}
	}
}

// --json prints one object per file with the fields scripts rely on.
func TestCheckJSON(t *testing.T) {
	code, out, _ := run(t, "check", "--json", fx+"examples/pipeline_ok.safetensors", fx+"examples/pipeline_quant_nibble_order.safetensors")
	if code != ExitFail {
		t.Fatalf("exit %d, want 1", code)
	}
	dec := json.NewDecoder(strings.NewReader(out))
	var objs []map[string]any
	for dec.More() {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, m)
	}
	if len(objs) != 2 {
		t.Fatalf("%d JSON objects, want one per file", len(objs))
	}
	for _, m := range objs {
		for _, key := range []string{"file", "kernel", "verdict", "stage", "checks", "error"} {
			if _, ok := m[key]; !ok {
				t.Errorf("object for %v lacks %q", m["file"], key)
			}
		}
	}
	if objs[0]["stage"] != nil || objs[1]["stage"] != "quant" {
		t.Errorf("stages %v, %v; want null and quant", objs[0]["stage"], objs[1]["stage"])
	}
	checks := objs[1]["checks"].([]any)
	first := checks[0].(map[string]any)
	if _, ok := first["signature"]; !ok {
		t.Errorf("failing check has no signature: %v", first)
	}
}

func TestRunSharding(t *testing.T) {
	code, out, errs := run(t, "cases", "--match", "splitk_combine/*")
	if code != 0 {
		t.Fatalf("cases: %d %s", code, errs)
	}
	all := strings.Fields(out)
	seen := map[string]int{}
	for i := 0; i < 3; i++ {
		code, out, errs := run(t, "run", "--match", "splitk_combine/*", "--shard", []string{"0/3", "1/3", "2/3"}[i], "-q")
		if code != 0 {
			t.Fatalf("shard %d: exit %d %s", i, code, errs)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if last := lines[len(lines)-1]; !strings.Contains(last, " passed in ") {
			t.Errorf("shard %d: no closing line, the last is %q", i, last)
		}
		for _, line := range lines[:len(lines)-1] { // the results, then the closing line
			seen[strings.Fields(line)[1]]++
		}
	}
	if len(seen) != len(all) {
		t.Errorf("shards ran %d distinct cases, the selection has %d", len(seen), len(all))
	}
	for name, n := range seen {
		if n != 1 {
			t.Errorf("case %s ran %d times across shards", name, n)
		}
	}
	for _, bad := range []string{"3/3", "x", "1/0", "-1/2"} {
		if code, _, _ := run(t, "run", "--match", "splitk_combine/*", "--shard", bad); code != ExitUsage {
			t.Errorf("--shard %s: exit %d, want 2", bad, code)
		}
	}
}

func TestRunFaultyBackendFails(t *testing.T) {
	code, out, errs := run(t, "run", "--case", "nvfp4_dequantize/m16/k2048/linear/dequant", "--backend", "faulty:nibble_order", "-q")
	if code != ExitFail || !strings.HasPrefix(out, "FAIL") {
		t.Fatalf("exit %d out %q err %q, want a fail", code, out, errs)
	}
	if code, _, errs := run(t, "run", "--case", "nope"); code != ExitUsage || !strings.Contains(errs, "no case named") {
		t.Errorf("unknown case: exit %d, stderr %q", code, errs)
	}
	if code, _, errs := run(t, "run", "--backend", "warp-drive", "--case", "nvfp4_dequantize/m16/k2048/linear/dequant"); code != ExitUsage || !strings.Contains(errs, "unknown backend") {
		t.Errorf("unknown backend: exit %d, stderr %q", code, errs)
	}
}

// kcheck faults --json keeps the fields of reference/CONTRACTS.md §7.4 and carries each
// fault's simulation settings and the reason the simulation cannot show it,
// as the catalog holds them.
func TestFaultsJSON(t *testing.T) {
	code, out, errs := run(t, "faults", "--json")
	if code != ExitPass {
		t.Fatalf("exit %d, stderr %s", code, errs)
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatal(err)
	}
	all := faults.All()
	if len(rows) != len(all) {
		t.Fatalf("%d rows for %d faults", len(rows), len(all))
	}
	for i, f := range all {
		r := rows[i]
		if r["name"] != f.Name || r["stage"] != f.Stage || r["bug_class"] != f.BugClass {
			t.Errorf("row %d: name, stage, bug_class %v %v %v; want %s %s %s", i, r["name"], r["stage"], r["bug_class"], f.Name, f.Stage, f.BugClass)
		}
		sim, ok := r["simulate"].(map[string]any)
		if !ok || len(sim) != len(f.Simulate) {
			t.Errorf("%s: simulate %v, want %v", f.Name, r["simulate"], f.Simulate)
		}
		for k, v := range f.Simulate {
			if sim[k] != v {
				t.Errorf("%s: simulate %s = %v, want %s", f.Name, k, sim[k], v)
			}
		}
		if got, _ := r["not_simulated"].(string); got != f.NotSimulated {
			t.Errorf("%s: not_simulated %q, want %q", f.Name, got, f.NotSimulated)
		}
	}
	if !strings.Contains(out, `"simulate":{"kv-cache-dtype":"fp8_e4m3"}`) || !strings.Contains(out, `"not_simulated":"the simulated decoder`) {
		t.Errorf("the catalog's settings are not in the JSON: %.600s", out)
	}
}

func TestMerge(t *testing.T) {
	dir := t.TempDir()
	var files []string
	for i, shard := range []string{"0/2", "1/2"} {
		_, out, _ := run(t, "run", "--match", "splitk_combine/kimi-k2/*", "--shard", shard, "--json")
		f := filepath.Join(dir, []string{"a.json", "b.json"}[i])
		if err := os.WriteFile(f, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	code, out, errs := run(t, append([]string{"merge"}, files...)...)
	if code != ExitPass || !strings.Contains(errs, "5 results: 5 pass") {
		t.Fatalf("merge: exit %d, stderr %q", code, errs)
	}
	if n := strings.Count(out, "\n"); n != 5 {
		t.Errorf("%d merged objects, want 5", n)
	}
	// The same shard twice is an overlap, not a bigger run.
	if code, _, errs := run(t, "merge", files[0], files[0]); code != ExitUsage || !strings.Contains(errs, "appears twice") {
		t.Errorf("duplicate shard: exit %d, stderr %q", code, errs)
	}
	garbage := filepath.Join(dir, "g.json")
	os.WriteFile(garbage, []byte(`{"file": 3}`), 0o644)
	if code, _, errs := run(t, "merge", garbage); code != ExitUsage || !strings.Contains(errs, "g.json") {
		t.Errorf("garbage: exit %d, stderr %q", code, errs)
	}
}

// diagnose --report writes the attribution's evidence like check does,
// and refuses to overwrite.
func TestDiagnoseReport(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "rep")
	code, out, errs := run(t, "diagnose", "--report", dir, fx+"examples/pipeline_cache_page_off_by_one.safetensors")
	if code != ExitFail || !strings.Contains(out, "culprit stage cache") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil || !strings.Contains(string(md), "page_boundary") {
		t.Fatalf("report.md (%v) does not name the page_boundary signature", err)
	}
	if code, _, errs := run(t, "diagnose", "--report", dir, fx+"examples/pipeline_ok.safetensors"); code != ExitUsage || !strings.Contains(errs, "--report") {
		t.Errorf("second report into the same directory: exit %d, stderr %q", code, errs)
	}
}

// bench measures; it judges nothing. On the reference backend it reports
// the bytes a kernel must move: for a dequantize, the packed codes, the
// scales and the global scale read once and the output written once.
func TestBenchReference(t *testing.T) {
	file := filepath.Join(t.TempDir(), "cases.json")
	os.WriteFile(file, []byte(`{"cases":[{"name":"d","kernel":"nvfp4_dequantize","m":32,"k":64,"seed":1}]}`), 0o644)
	code, out, errs := run(t, "bench", "--cases", file, "--case", "d", "--backend", "reference", "--repeat", "2", "--json")
	if code != ExitPass {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var row benchRow
	if err := json.Unmarshal([]byte(out), &row); err != nil {
		t.Fatal(err)
	}
	// packed 32*32 + scales 32*4 (E4M3) + global 4 + out 32*64 bf16
	if want := int64(32*32 + 32*4 + 4 + 32*64*2); row.Bytes != want || row.MS <= 0 || row.Error != "" {
		t.Errorf("row %+v, want %d bytes and a positive time", row, want)
	}
	if code, _, _ := run(t, "bench", "--cases", file, "--case", "d", "--backend", "reference", "--repeat", "0"); code != ExitUsage {
		t.Errorf("--repeat 0: exit %d, want 2", code)
	}
}

func TestSanitizedBackend(t *testing.T) {
	tests := []struct {
		spec string
		on   bool
		want string
		err  bool
	}{
		{"cuda", false, "cuda", false},
		{"cuda", true, "cuda:sanitize", false},
		{"cuda:timeout=5s", true, "cuda:timeout=5s,sanitize", false},
		{"reference", true, "", true},
	}
	for _, tc := range tests {
		got, err := sanitized(tc.spec, tc.on)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("sanitized(%q, %v) = %q, %v; want %q (error %v)", tc.spec, tc.on, got, err, tc.want, tc.err)
		}
	}
}

// kcheck --version says the module version and the revision (issue 11 item
// 15); `go test` stamps none, so here it is "unknown", and the report's
// environment says the same.
func TestVersion(t *testing.T) {
	code, stdout, stderr := run(t, "--version")
	if code != ExitPass || !strings.HasPrefix(stdout, "kcheck (devel), revision ") || !strings.Contains(stdout, "go1.") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if want := version.Current().String() + "\n"; stdout != want {
		t.Errorf("stdout %q, want %q", stdout, want)
	}
}

// check and run end with pytest's closing line, on stdout for people and on
// stderr under --json, whose stdout stays one JSON object a line.
func TestClosingLine(t *testing.T) {
	bad := writeFile(t, filepath.Join(t.TempDir(), "bad.safetensors"), []byte("junk"))
	pass, fail := fx+"examples/nvfp4_dequant_ok.safetensors", fx+"examples/nvfp4_dequant_nibble_order.safetensors"
	closing := regexp.MustCompile(`(?m)^1 passed, 2 failed, 1 error in [0-9]+\.[0-9]s$`)
	code, stdout, _ := run(t, "check", "--quiet", pass, fail, fail, bad)
	if code != ExitFail || !closing.MatchString(stdout) {
		t.Errorf("check: exit %d, stdout %q: want the closing line", code, stdout)
	}
	code, stdout, stderr := run(t, "check", "--json", pass, fail, fail, bad)
	if code != ExitFail || !closing.MatchString(stderr) || closing.MatchString(stdout) {
		t.Errorf("check --json: exit %d, stderr %q: want the closing line there and not on stdout", code, stderr)
	}
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("check --json stdout line %q is not JSON", line)
		}
	}
	cases := writeFile(t, filepath.Join(t.TempDir(), "c.json"), []byte(`{"cases":[{"name":"a","kernel":"nvfp4_quantize","m":2,"k":32},{"name":"b","kernel":"nvfp4_quantize","m":2,"k":32}]}`))
	code, stdout, _ = run(t, "run", "--quiet", "--cases", cases)
	if code != ExitPass || !regexp.MustCompile(`(?m)^2 passed in [0-9]+\.[0-9]s$`).MatchString(stdout) {
		t.Errorf("run: exit %d, stdout %q: want 2 passed", code, stdout)
	}
}

//go:build unix

package cli

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// runRSS runs this test binary as kcheck (TestMain) with args and returns
// its exit status, output and peak resident set size in bytes: the
// kernel's high-water mark of the child's own memory (VmHWM of
// /proc/self/status, which the child writes as it exits). Not the child's
// rusage: Go starts children with vfork, and exec records the parent's
// high-water mark as the child's ru_maxrss, so a child of a large test
// process (one under -race) would read at least the parent's size.
func runRSS(t *testing.T, args ...string) (ExitCode, string, int64) {
	t.Helper()
	peak := filepath.Join(t.TempDir(), "peak")
	cmd := selfExec()
	cmd.Env = append(cmd.Env, "KCHECK_PEAK_RSS_FILE="+peak)
	cmd.Args = append(cmd.Args[:1], args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(peak)
	if err != nil {
		if _, statErr := os.Stat("/proc/self/status"); statErr != nil {
			t.Skip("no /proc/self/status on this system")
		}
		t.Fatalf("kcheck %v reported no peak RSS (it died?): exit %d, output %.2000s", args, code, out.String())
	}
	kb, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("peak RSS file %q: %v", b, err)
	}
	return ExitCode(code), out.String(), kb << 10
}

// writePeakRSS writes the process's peak RSS in KiB (VmHWM) to path; the
// child side of runRSS.
func writePeakRSS(path string) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			os.WriteFile(path, []byte(strings.TrimSuffix(strings.TrimSpace(v), " kB")), 0o644)
		}
	}
}

// A refusal costs no more than the process itself: sizes that a few bytes
// on the command line or in a case file make any size are estimated by
// multiplication and refused before anything is allocated (issue 11 item
// 11: a 90-byte case file with "batch": 100000000 used 2.6 GB to print its
// refusal, 2^40 and `diagnose --simulate --hidden 1600000000` ran out of
// memory).
func TestRefusalsAllocateNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	dir := t.TempDir()
	caseFile := func(name, js string) string { return writeFile(t, filepath.Join(dir, name), []byte(js)) }
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"case batch 10^8", []string{"run", "--cases", caseFile("b8.json", `{"cases":[{"name":"x","kernel":"mla_decode","batch":100000000}]}`)}, "case x needs"},
		{"case batch 2^40", []string{"run", "--cases", caseFile("b40.json", `{"cases":[{"name":"x","kernel":"kv_cache_gather","batch":1099511627776}]}`)}, "case x needs more than 2^61 B"},
		{"bisect a case of batch 10^8", []string{"bisect", "--case", "x", "--cases", filepath.Join(dir, "b8.json")}, "case x needs"},
		{"shrink a case of batch 10^8", []string{"shrink", "--case", "x", "--cases", filepath.Join(dir, "b8.json"), "--backend", "reference", "--out", filepath.Join(dir, "x.safetensors")}, "case x needs"},
	}
	for _, flag := range []string{"hidden", "prefill", "page-size", "batch", "splits", "s-q", "steps"} {
		tests = append(tests, struct {
			name string
			args []string
			want string
		}{"simulate --" + flag + " 1600000000", []string{"diagnose", "--simulate", "--" + flag, "1600000000"}, "the simulation needs"})
	}
	for _, tc := range tests {
		code, out, rss := runRSS(t, tc.args...)
		if code != ExitUsage || !strings.Contains(out, tc.want) || !strings.Contains(out, "refused") {
			t.Errorf("%s: exit %d, output %.500s; want exit 2 and a refusal saying %q", tc.name, code, out, tc.want)
		}
		if rss > 200<<20 {
			t.Errorf("%s: peak RSS %d MiB to refuse it", tc.name, rss>>20)
		}
		t.Logf("%s: refused at a peak RSS of %d MiB", tc.name, rss>>20)
	}
}

// The simulation's estimate is an upper bound of what it really holds:
// the peak RSS of whole runs stays under it (it errs large where it
// guesses), so a simulation it accepts under --max-memory fits.
func TestSimulationEstimateBoundsRSS(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("measures whole simulations' memory (see raceEnabled)")
	}
	needs := regexp.MustCompile(`needs about ([0-9.]+) MiB`)
	for _, settings := range [][]string{
		{"--steps", "2", "--prompts", "1"},
		{"--splits", "64", "--steps", "2", "--prompts", "1"},
		{"--batch", "8", "--prefill", "200", "--steps", "2", "--prompts", "1"},
	} {
		args := append([]string{"diagnose", "--simulate"}, settings...)
		_, out, _ := runRSS(t, append(args, "--max-memory", "1")...) // refused: says its estimate
		m := needs.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("%v: no estimate in %q", settings, out)
		}
		mib, _ := strconv.ParseFloat(m[1], 64)
		code, out, rss := runRSS(t, args...)
		if code != ExitPass {
			t.Fatalf("%v: exit %d: %.500s", settings, code, out)
		}
		if float64(rss) > mib*(1<<20) {
			t.Errorf("%v: peak RSS %.1f MiB, over the estimate %.1f MiB", settings, float64(rss)/(1<<20), mib)
		}
		t.Logf("%v: peak RSS %.1f MiB, estimate %.1f MiB", settings, float64(rss)/(1<<20), mib)
	}
}

// Timed-out checks do not pile up (issue 11 item 9): eight copies of a
// file whose check (about 3.9e10 multiply-adds) is estimated at 345 MiB,
// each past a 200ms --timeout, stay under --max-memory 400M as a process,
// one check's memory at a time. (The in-process measure of what checks
// past their deadline keep is check.TestTimedOutChecksHoldNothing.)
func TestTimedOutChecksStayUnderTheBound(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("measures a process's memory (see raceEnabled)")
	}
	dir := t.TempDir()
	first := samePagesFile(t, filepath.Join(dir, "c0.safetensors"), "mla_decode", 64, 4096, 128)
	b, err := os.ReadFile(first)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 8; i++ {
		writeFile(t, filepath.Join(dir, fmt.Sprintf("c%d.safetensors", i)), b)
	}
	code, out, rss := runRSS(t, "check", "--quiet", "--max-memory", "400M", "--timeout", "200ms", dir)
	if code != ExitUsage || strings.Count(out, "ERROR") != 8 {
		t.Fatalf("exit %d, output %.1000s: want 8 timed-out checks", code, out)
	}
	if rss > 400<<20 {
		t.Errorf("peak RSS %d MiB over --max-memory 400M", rss>>20)
	}
	t.Logf("8 timed-out checks: peak RSS %d MiB", rss>>20)
}

// A 99 MB header (issue 11 item 12) was parsed outside --max-memory: 1.2
// to 2 GB of RSS at --max-memory 16M. Its parse is now charged against the
// bound, so the file is refused before its header is read, in a few MB.
func TestBigHeaderWithinMemoryBound(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big_header.safetensors")
	h := `{"__metadata__":{"kcheck.format":"1","kcheck.kernel":"nvfp4_dequantize","note":"` + strings.Repeat("x", 99_000_000) + `"}}`
	if err := os.WriteFile(path, append(binary.LittleEndian.AppendUint64(nil, uint64(len(h))), h...), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, rss := runRSS(t, "check", "--json", "--max-memory", "16M", path)
	t.Logf("peak RSS %.1f MiB", float64(rss)/(1<<20))
	if code != ExitUsage || !strings.Contains(out, "header could take") || !strings.Contains(out, "--max-memory") {
		t.Fatalf("exit %d, output %.1000s", code, out)
	}
	if limit := int64(16<<20) + 64<<20; rss > limit {
		t.Errorf("peak RSS %d bytes at --max-memory 16M, more than the bound and 64 MiB for the process itself", rss)
	}
}

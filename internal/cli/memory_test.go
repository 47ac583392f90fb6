package cli

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// peakRSSEnv makes the test binary acting as kcheck (TestMain) print its
// peak resident set at exit, read from /proc/self/status (VmHWM): a
// child's rusage would count the parent's resident set at the fork.
const peakRSSEnv = "KCHECK_CLI_PEAK_RSS"

func peakRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// runMeasured runs kcheck with args in a child process and returns its
// exit status, its output and its peak RSS.
func runMeasured(t *testing.T, args ...string) (ExitCode, string, int64) {
	t.Helper()
	if peakRSS() == 0 {
		t.Skip("no VmHWM in /proc/self/status: peak RSS is unreadable here")
	}
	cmd := selfExec()
	cmd.Args = append(cmd.Args, args...)
	cmd.Env = append(cmd.Env, peakRSSEnv+"=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := 0
	if err != nil {
		code = cmd.ProcessState.ExitCode()
	}
	m := regexp.MustCompile(peakRSSEnv + ` (\d+)`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("the child printed no peak RSS:\n%s", out.String())
	}
	rss, _ := strconv.ParseInt(m[1], 10, 64)
	return ExitCode(code), out.String(), rss
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
	code, out, rss := runMeasured(t, "check", "--json", "--max-memory", "16M", path)
	t.Logf("peak RSS %.1f MiB", float64(rss)/(1<<20))
	if code != ExitUsage || !strings.Contains(out, "header could take") || !strings.Contains(out, "--max-memory") {
		t.Fatalf("exit %d, output %.1000s", code, out)
	}
	if limit := int64(16<<20) + 64<<20; rss > limit {
		t.Errorf("peak RSS %d bytes at --max-memory 16M, more than the bound and 64 MiB for the process itself", rss)
	}
}

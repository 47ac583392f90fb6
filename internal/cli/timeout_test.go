package cli

import (
	"encoding/json"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kcheck-dev/kcheck/internal/check"
)

// A case past --timeout is an ordinary return (issue 12 item 2): its
// result is verdict error saying so, the run goes on to the next case, and
// nothing of the slow case runs on once the command has returned.
func TestRunTimeoutIsAnOrdinaryReturn(t *testing.T) {
	cases := writeFile(t, filepath.Join(t.TempDir(), "cases.json"), []byte(`{"cases":[
 {"name":"a-slow","kernel":"mla_decode","tp":1,"seq_lens":[65536]},
 {"name":"b-fast","kernel":"nvfp4_quantize","m":2,"k":32}]}`))
	goroutines := runtime.NumGoroutine()
	start := time.Now()
	code, stdout, stderr := run(t, "run", "--json", "--cases", cases, "--timeout", "50ms")
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("the run took %v with a 50ms time limit a case", took)
	}
	if code != ExitUsage {
		t.Errorf("exit %d, want %d (a case's verdict is error)\nstderr: %s", code, ExitUsage, stderr)
	}
	var got []check.Result
	dec := json.NewDecoder(strings.NewReader(stdout))
	for {
		var r check.Result
		if dec.Decode(&r) != nil {
			break
		}
		if r.File != "" {
			got = append(got, r)
		}
	}
	if len(got) != 2 {
		t.Fatalf("%d results, want 2\nstdout: %s", len(got), stdout)
	}
	if r := got[0]; r.Verdict != check.Error || r.Error == nil || !strings.Contains(*r.Error, "timed out after") || !strings.Contains(*r.Error, "(the per-case time limit; raise it with --timeout)") {
		t.Errorf("the slow case: verdict %s, error %v: want the per-case time limit", r.Verdict, r.Error)
	}
	if got[0].Error != nil {
		t.Log(*got[0].Error)
	}
	if r := got[1]; r.Verdict != check.Pass {
		t.Errorf("the case after it: verdict %s, want pass", r.Verdict)
	}
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > goroutines+1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > goroutines+1 {
		t.Errorf("%d goroutines after the run, %d before: the timed-out case runs on", n, goroutines)
	}
}

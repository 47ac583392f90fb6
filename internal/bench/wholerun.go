package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Side is one way of checking a capture in the whole-check table: a kcheck
// binary, the numpy script or the read-limit tool, run as a child process
// whose stdout says what it found.
type Side struct {
	Label string
	Kind  SideKind
	Argv  []string // the command before the capture's path
	Env   []string
}

// SideKind says how a side's stdout is read.
type SideKind int

const (
	KcheckSide    SideKind = iota // `kcheck check --json`: one JSON object a file, its "verdict"
	NumpySide                     // numpy_checks.py: one JSON line, "verdict" and its own "seconds"
	ReadLimitSide                 // cmd/readlimit: one JSON line, "bytes", "sum" and "seconds"
)

// Outcome is what one side found on one capture.
type Outcome struct {
	Proc
	Verdict string  // "pass", "fail" or "error" (kcheck, numpy); "read" for the read limit
	Seconds float64 // the side's own time where it reports one (numpy, read limit), else the wall time
	Bytes   int64   // read limit: the bytes it read
	Sum     uint64  // read limit: their sum
	Detail  string  // numpy: the failing counts; an error's message
}

// Run checks the capture at path with the side and reads its answer.
func (s Side) Run(path string, timeout time.Duration) (Outcome, error) {
	argv := append(append([]string(nil), s.Argv...), path)
	p, err := Measure(argv, s.Env, timeout)
	o := Outcome{Proc: p, Seconds: p.Wall}
	if err != nil {
		return o, fmt.Errorf("%s on %s: %v", s.Label, path, err)
	}
	line := firstLine(p.Stdout)
	switch s.Kind {
	case KcheckSide:
		var r struct {
			Verdict string `json:"verdict"`
			Error   string `json:"error"`
		}
		if json.Unmarshal(line, &r) != nil || r.Verdict == "" {
			return o, fmt.Errorf("%s on %s printed no verdict (exit %d): %q %s", s.Label, path, p.Exit, trim(line), p.Stderr)
		}
		o.Verdict, o.Detail = r.Verdict, r.Error
		if want := map[string]int{"pass": 0, "fail": 1}[r.Verdict]; (r.Verdict == "pass" || r.Verdict == "fail") && p.Exit != want {
			return o, fmt.Errorf("%s on %s: verdict %s but exit %d", s.Label, path, r.Verdict, p.Exit)
		}
	case NumpySide:
		var r struct {
			Verdict string           `json:"verdict"`
			Seconds float64          `json:"seconds"`
			Failing map[string]int64 `json:"failing"`
			Error   *string          `json:"error"`
		}
		if json.Unmarshal(line, &r) != nil || r.Verdict == "" {
			return o, fmt.Errorf("%s on %s printed no verdict (exit %d): %q %s", s.Label, path, p.Exit, trim(line), p.Stderr)
		}
		o.Verdict, o.Seconds = r.Verdict, r.Seconds
		if r.Error != nil {
			o.Detail = *r.Error
		} else if len(r.Failing) > 0 {
			b, _ := json.Marshal(r.Failing)
			o.Detail = string(b)
		}
	case ReadLimitSide:
		var r struct {
			Bytes   int64   `json:"bytes"`
			Sum     uint64  `json:"sum"`
			Seconds float64 `json:"seconds"`
		}
		if p.Exit != 0 || json.Unmarshal(line, &r) != nil {
			return o, fmt.Errorf("%s on %s (exit %d): %q %s", s.Label, path, p.Exit, trim(line), p.Stderr)
		}
		o.Verdict, o.Seconds, o.Bytes, o.Sum = "read", r.Seconds, r.Bytes, r.Sum
	}
	return o, nil
}

func firstLine(b []byte) []byte {
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		return b[:i]
	}
	return b
}

func trim(b []byte) string {
	s := string(b)
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

// LoadAverage is /proc/loadavg's one-, five- and fifteen-minute averages,
// as the table prints them ("" where /proc does not say).
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	for _, x := range f[:3] {
		if _, err := strconv.ParseFloat(x, 64); err != nil {
			return ""
		}
	}
	return strings.Join(f[:3], " ")
}

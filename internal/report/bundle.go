package report

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"runtime"

	"github.com/kcheck-dev/kcheck/internal/bounded"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/version"
)

// Format is the version of report.json.
const Format = 1

// Bundle is everything a report renders: report.json holds it as is, and
// `kcheck report` re-renders the Markdown and plots from it.
type Bundle struct {
	Format int `json:"kcheck_report"`
	// Title heads the Markdown ("" gives one from the verdicts).
	Title       string      `json:"title,omitempty"`
	Environment Environment `json:"environment"`
	// Command is the command line that produced the results.
	Command   string     `json:"command,omitempty"`
	Items     []Item     `json:"items"`
	Diagnosis *Diagnosis `json:"diagnosis,omitempty"`
}

// Item is one checked file or case.
type Item struct {
	Result check.Result `json:"result"`
	// Reproduce is the command that re-runs this item.
	Reproduce string `json:"reproduce,omitempty"`
	// Profiles hold each output's error by coordinate (see Recorder);
	// absent when the item was re-rendered from `check --json` output.
	Profiles []Profile `json:"profiles,omitempty"`
	// Evidence is each file behind the item, with its hash.
	Evidence []Evidence `json:"evidence,omitempty"`
}

// Evidence identifies a file by size and SHA-256.
type Evidence struct {
	File   string `json:"file"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
	// NotHashed says why a file has no hash (HashFilesContext).
	NotHashed string `json:"not_hashed,omitempty"`
}

// Diagnosis is a drift simulation's outcome, in the shape `kcheck diagnose
// --json` prints (reference/CONTRACTS.md §7.5; the extra fields of internal/diagnose's
// Report that a report shows have the same names, so its JSON decodes
// into this directly).
type Diagnosis struct {
	Mode            string          `json:"mode,omitempty"`
	Backend         string          `json:"backend,omitempty"`
	File            string          `json:"file,omitempty"`
	Reason          string          `json:"reason,omitempty"`
	Verdict         compare.Verdict `json:"verdict"`
	Stage           *string         `json:"stage"`
	FirstStep       *int            `json:"first_step"`
	FirstContextLen *int            `json:"first_context_len"`
	Steps           []Step          `json:"steps"`
	Swaps           []Swap          `json:"swaps,omitempty"`
	Notes           []string        `json:"notes,omitempty"`
}

// Step is one decode step of the simulation.
type Step struct {
	Step       int           `json:"step"`
	Prompt     int           `json:"prompt"`
	ContextLen int           `json:"context_len"`
	Error      compare.Float `json:"error"`
	Floor      compare.Float `json:"floor"`
	// Threshold, when set, is the error above which the step counts as off
	// the floor.
	Threshold compare.Float `json:"threshold,omitempty"`
}

// Swap is the simulation rerun with one stage replaced by its reference.
type Swap struct {
	Stage string `json:"stage"`
	// MaxError is the largest per-step error with that stage swapped;
	// RemovesDrift says whether it stays on the noise floor.
	MaxError     compare.Float `json:"max_error"`
	RemovesDrift bool          `json:"removes_drift"`
}

// Environment is where a report was made.
type Environment struct {
	Kcheck   string `json:"kcheck"`
	Revision string `json:"revision,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	Built    string `json:"built,omitempty"`
	Go       string `json:"go"`
	OS       string `json:"os"`
	Arch     string `json:"arch"`
	CPUs     int    `json:"cpus"`
}

// CurrentEnvironment describes this process: kcheck's version and VCS
// revision (internal/version: what `kcheck --version` prints), the Go
// version, OS, architecture and CPU count.
func CurrentEnvironment() Environment {
	v := version.Current()
	return Environment{Kcheck: v.Version, Revision: v.Revision, Modified: v.Modified, Built: v.Time,
		Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU()}
}

// HashFiles returns the size and SHA-256 of each file.
func HashFiles(paths ...string) ([]Evidence, error) {
	return HashFilesContext(context.Background(), paths...)
}

// HashFilesContext is HashFiles under ctx. A regular file is hashed up to
// the size it had when opened; a stream (a pipe, a device, a file that
// stats as 0 bytes: /dev/zero would be hashed for ever) is not hashed,
// and its Evidence says why: the check consumed it, and what a second
// read gives is not what was checked.
func HashFilesContext(ctx context.Context, paths ...string) ([]Evidence, error) {
	var out []Evidence
	for _, p := range paths {
		f, err := bounded.Open(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("evidence file: %v", err)
		}
		if f.Stream() {
			f.Close()
			out = append(out, Evidence{File: p, NotHashed: "a stream (a pipe, a device or a file of no stated size): the check read it, and a second read would not give the same bytes"})
			continue
		}
		h := sha256.New()
		n, err := io.Copy(h, io.LimitReader(f, f.Info().Size()))
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("evidence file %s: %v", p, err)
		}
		out = append(out, Evidence{File: p, Bytes: n, SHA256: hex.EncodeToString(h.Sum(nil))})
	}
	return out, nil
}

// NewBundle starts a bundle for this process's environment.
func NewBundle(command string) Bundle {
	return Bundle{Format: Format, Environment: CurrentEnvironment(), Command: command}
}

// DiagnosisFrom converts a diagnosis result whose JSON has the spec's shape
// (internal/diagnose's Report) into a Diagnosis, through its JSON.
func DiagnosisFrom(v any) (*Diagnosis, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var d Diagnosis
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

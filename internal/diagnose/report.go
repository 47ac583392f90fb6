package diagnose

import (
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/sim"
)

// Report is `kcheck diagnose`'s answer (reference/CONTRACTS.md §7.5: verdict, stage,
// first_step, first_context_len, steps).
type Report struct {
	Mode    string          `json:"mode"` // "simulation" or "capture"
	Backend string          `json:"backend,omitempty"`
	File    string          `json:"file,omitempty"`
	Verdict compare.Verdict `json:"verdict"`
	// Stage is the culprit stage (null when nothing drifts).
	Stage           *string             `json:"stage"`
	FirstStep       *int                `json:"first_step"`
	FirstContextLen *int                `json:"first_context_len"`
	Steps           []sim.StepResult    `json:"steps"`
	Prompts         []sim.PromptSummary `json:"prompts,omitempty"`
	// Swaps: each stage swapped for its reference, one at a time.
	Swaps []sim.SwapResult `json:"swaps,omitempty"`
	// Isolated: each stage alone on the backend, run when no single swap
	// removes the drift.
	Isolated []sim.SwapResult `json:"isolated,omitempty"`
	Reason   string           `json:"reason"`
	Notes    []string         `json:"notes,omitempty"`
	Config   *sim.Config      `json:"config,omitempty"`
	// FreeRunning: each chain chose its own tokens (else teacher-forced).
	FreeRunning bool           `json:"free_running,omitempty"`
	Thresholds  sim.Thresholds `json:"thresholds"`
	// Capture holds the per-stage check of a pipeline capture.
	Capture *CaptureAttribution `json:"capture,omitempty"`
	Error   *string             `json:"error"`
}

// FromSim is a simulation's diagnosis as a Report: the simulation decides
// every field, and this only gives it the report's shape.
func FromSim(d *sim.Diagnosis) *Report {
	cfg := d.Config
	return &Report{Mode: "simulation", Backend: d.Backend, Verdict: d.Verdict, Stage: d.Stage,
		FirstStep: d.FirstStep, FirstContextLen: d.FirstContextLen, Steps: d.Steps, Prompts: d.Prompts,
		Swaps: d.Swaps, Isolated: d.Isolated, Reason: d.Reason, Notes: d.Notes, Config: &cfg,
		FreeRunning: d.FreeRunning, Thresholds: d.Thresholds}
}

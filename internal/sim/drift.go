package sim

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/kernel"
)

// Stages are the spec's stage names in pipeline order.
var Stages = []string{kernel.StageQuant, kernel.StageCache, kernel.StageAttn, kernel.StageCombine}

// Kernels are the kernels the simulated decoder calls on its backend (a
// test records them): a planted fault that lives in none of them cannot
// show in a simulation.
var Kernels = []string{"nvfp4_dequantize", "nvfp4_quantize", "nvfp4_gemm", "kv_cache_write", "mla_decode", "splitk_combine"}

// Thresholds decide when a step's error has left the noise floor.
//
// A step's error is the relative RMS distance between the backend's
// attention output and the reference run's (the reference at kernel
// precision, run on its own chain); its floor is the same distance between
// the reference run and the exact chain. A correct kernel of the declared
// precision differs from the reference by rounding of the same kind and
// size as the reference differs from exact (another accumulation order,
// another split), so its error stays within a small multiple of the floor.
// The floor is taken as its running maximum over the prompt's steps so
// far, because a single step where the two chains happen to agree closely
// says nothing about the next; it restarts with each prompt, whose chain
// starts afresh.
type Thresholds struct {
	// FloorFactor: a step is off the floor when error > FloorFactor·floor.
	FloorFactor float64
	// MinError is the smallest error that can count, for steps whose
	// floor is near zero: half a bf16 ulp, relative (2^-9).
	MinError float64
	// Band: an error within (1, Band] times the threshold at its worst is
	// inconclusive rather than a failure.
	Band float64
}

// DefaultThresholds are 4x the floor, 2^-9 at least, and a 2x band.
func DefaultThresholds() Thresholds { return Thresholds{FloorFactor: 4, MinError: 0x1p-9, Band: 2} }

// StepResult is one decode step of the drift curve (reference/CONTRACTS.md §7.5: step, prompt,
// context_len, error, floor).
type StepResult struct {
	// Step counts decode steps across prompts from 0.
	Step   int `json:"step"`
	Prompt int `json:"prompt"`
	// PromptStep is the step within its prompt.
	PromptStep int           `json:"prompt_step"`
	ContextLen int           `json:"context_len"`
	Error      compare.Float `json:"error"`
	Floor      compare.Float `json:"floor"`
	Threshold  compare.Float `json:"threshold"`
	OffFloor   bool          `json:"off_floor"`
	// TokensChanged counts the requests whose next token (the output
	// head's argmax) differs from the reference run's.
	TokensChanged int `json:"tokens_changed"`
}

// SwapResult is the drift of a run with one stage swapped for (or, for
// isolation runs, alone on) the backend.
type SwapResult struct {
	Stage string `json:"stage"`
	// MaxRatio is the worst error/threshold over the steps (<= 1: no step
	// leaves the floor).
	MaxRatio  compare.Float `json:"max_ratio"`
	MaxError  compare.Float `json:"max_error"`
	FirstStep *int          `json:"first_step"`
	// RemovesDrift: with this stage on the reference, no step leaves the
	// floor (for isolation runs: this stage alone drifts).
	RemovesDrift bool `json:"removes_drift"`
}

// PromptSummary is the drift of one prompt.
type PromptSummary struct {
	Prompt    int           `json:"prompt"`
	MaxError  compare.Float `json:"max_error"`
	MaxFloor  compare.Float `json:"max_floor"`
	FirstStep *int          `json:"first_step"`
}

// Diagnosis is a simulation's answer: where its error leaves the floor and
// which stage's swap removes the drift (reference/CONTRACTS.md §7.5:
// verdict, stage, first_step, first_context_len, steps). internal/diagnose
// lays it out as `kcheck diagnose --simulate` prints it.
type Diagnosis struct {
	Backend string
	Verdict compare.Verdict
	// Stage is the culprit stage (nil when nothing drifts).
	Stage           *string
	FirstStep       *int
	FirstContextLen *int
	Steps           []StepResult
	Prompts         []PromptSummary
	// Swaps: each stage swapped for its reference, one at a time.
	Swaps []SwapResult
	// Isolated: each stage alone on the backend, run when no single swap
	// removes the drift.
	Isolated []SwapResult
	Reason   string
	Notes    []string
	Config   Config
	// FreeRunning: each chain chose its own tokens (else teacher-forced).
	FreeRunning bool
	Thresholds  Thresholds
}

// Baseline is what every diagnosis of one simulation compares against:
// the reference run, the exact chain, and the per-step floor and threshold.
type Baseline struct {
	// Free: runs choose their own tokens and feed their own outputs
	// forward (else they are teacher-forced with the reference's inputs).
	Free       bool
	Ref, Exact Trace
	Floor      []float64
	Threshold  []float64
}

// Baseline runs the reference and the exact chain.
func (s *Sim) Baseline(ctx context.Context, th Thresholds) (*Baseline, error) {
	return s.baseline(ctx, th, false)
}

func (s *Sim) baseline(ctx context.Context, th Thresholds, free bool) (*Baseline, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	ref, err := s.Run(ctx, backend.Reference{})
	if err != nil {
		return nil, fmt.Errorf("reference run: %w", err)
	}
	ex, err := s.RunForced(ctx, backend.Exact{}, ref)
	if free {
		ex, err = s.Run(ctx, backend.Exact{})
	}
	if err != nil {
		return nil, fmt.Errorf("exact run: %w", err)
	}
	b := &Baseline{Free: free, Ref: ref, Exact: ex, Floor: make([]float64, len(ref)), Threshold: make([]float64, len(ref))}
	running := 0.0
	for i := range ref {
		if i > 0 && ref[i].Prompt != ref[i-1].Prompt {
			running = 0 // a new prompt's chain starts afresh
		}
		b.Floor[i] = relRMS(ref[i].Out, ex[i].Out)
		if !math.IsNaN(b.Floor[i]) {
			running = math.Max(running, b.Floor[i])
		}
		b.Threshold[i] = math.Max(th.FloorFactor*running, th.MinError)
	}
	return b, nil
}

// relRMS is sqrt(Σ(a-b)²/Σb²) over the elements; a NaN or infinity in a
// where b is finite makes it +Inf, and a nonzero difference against an
// all-zero b is +Inf too.
func relRMS(a, b []float64) float64 {
	var num, den float64
	for i := range b {
		if math.IsNaN(b[i]) || math.IsInf(b[i], 0) {
			if !(math.IsNaN(a[i]) && math.IsNaN(b[i])) && a[i] != b[i] {
				return math.Inf(1)
			}
			continue
		}
		if math.IsNaN(a[i]) || math.IsInf(a[i], 0) {
			return math.Inf(1)
		}
		d := a[i] - b[i]
		num += d * d
		den += b[i] * b[i]
	}
	switch {
	case num == 0:
		return 0
	case den == 0:
		return math.Inf(1)
	}
	return math.Sqrt(num / den)
}

// drift compares a trace with the baseline: the per-step results and the
// worst error/threshold ratio. Steps the trace does not reach (its chain
// broke: a kernel refused the garbage an earlier one made) count as
// infinitely wrong.
func (b *Baseline) drift(tr Trace) ([]StepResult, float64) {
	steps := make([]StepResult, len(b.Ref))
	worst := 0.0
	for i, ref := range b.Ref {
		e := math.Inf(1)
		changed := len(ref.Next)
		if i < len(tr) {
			e = relRMS(tr[i].Out, ref.Out)
			changed = 0
			for j, tok := range ref.Next {
				if j >= len(tr[i].Next) || tr[i].Next[j] != tok {
					changed++
				}
			}
		}
		ratio := e / b.Threshold[i]
		steps[i] = StepResult{Step: i, Prompt: ref.Prompt, PromptStep: ref.Step, ContextLen: ref.ContextLen,
			Error: compare.Float(e), Floor: compare.Float(b.Floor[i]), Threshold: compare.Float(b.Threshold[i]), OffFloor: ratio > 1,
			TokensChanged: changed}
		worst = math.Max(worst, ratio)
	}
	return steps, worst
}

// runBroken runs be, turning an error into a broken chain (the steps it
// reached) and a note.
func (s *Sim) runBroken(ctx context.Context, be backend.Backend, b *Baseline) (Trace, string, error) {
	run := func() (Trace, error) {
		if b.Free {
			return s.Run(ctx, be)
		}
		return s.RunForced(ctx, be, b.Ref)
	}
	tr, err := run()
	if err == nil {
		return tr, "", nil
	}
	if ctx.Err() != nil {
		return nil, "", ctx.Err()
	}
	return tr, fmt.Sprintf("%s: the chain broke after %d steps: %v", be.Name(), len(tr), err), nil
}

func firstOff(steps []StepResult) *int {
	for _, s := range steps {
		if s.OffFloor {
			i := s.Step
			return &i
		}
	}
	return nil
}

func maxError(steps []StepResult) float64 {
	m := 0.0
	for _, s := range steps {
		m = math.Max(m, float64(s.Error))
	}
	return m
}

// DiagnoseOptions tune a simulation diagnosis.
type DiagnoseOptions struct {
	Thresholds Thresholds
	// Baseline, when set, is reused (it depends on the simulation only).
	Baseline *Baseline
	// Quick stops swapping at the first stage whose swap removes the drift
	// (the table tests use it; a report shows every swap).
	Quick bool
	// Free runs every chain free (its own tokens and feedback) instead of
	// teacher-forced: closer to an engine serving requests, but two
	// correct chains drift apart by whole FP4 codes, so the floor is
	// coarse and lumpy.
	Free bool
}

// Diagnose runs the simulation on be beside the reference and the exact
// chain, finds where the error leaves the floor, and swaps each stage for
// its reference to find the one whose swap removes the drift.
func (s *Sim) Diagnose(ctx context.Context, be backend.Backend, opts DiagnoseOptions) (*Diagnosis, error) {
	th := opts.Thresholds
	if th.FloorFactor == 0 {
		th = DefaultThresholds()
	}
	base := opts.Baseline
	if base == nil {
		var err error
		if base, err = s.baseline(ctx, th, opts.Free); err != nil {
			return nil, err
		}
	}
	rep := &Diagnosis{Backend: be.Name(), Config: s.cfg, Thresholds: th, FreeRunning: base.Free}
	if ctx == nil {
		ctx = context.Background()
	}
	tr, note, err := s.runBroken(ctx, be, base)
	if err != nil {
		return nil, err
	}
	if note != "" {
		rep.Notes = append(rep.Notes, note)
	}
	var worst float64
	rep.Steps, worst = base.drift(tr)
	rep.Prompts = promptSummaries(rep.Steps)
	if f := firstOff(rep.Steps); f != nil {
		rep.FirstStep = f
		c := rep.Steps[*f].ContextLen
		rep.FirstContextLen = &c
	}
	switch {
	case worst <= 1:
		rep.Verdict = compare.Pass
		rep.Reason = fmt.Sprintf("every step within %g x its noise floor (worst %.3g of the threshold)", th.FloorFactor, worst)
		return rep, nil
	case worst <= th.Band:
		rep.Verdict = compare.Inconclusive
	default:
		rep.Verdict = compare.Fail
	}
	// Swap each stage for its reference.
	for _, stage := range Stages {
		str, note, err := s.runBroken(ctx, backend.Swapped{Base: be, Stage: stage}, base)
		if err != nil {
			return nil, err
		}
		if note != "" {
			rep.Notes = append(rep.Notes, note)
		}
		steps, w := base.drift(str)
		rep.Swaps = append(rep.Swaps, SwapResult{Stage: stage, MaxRatio: compare.Float(w), MaxError: compare.Float(maxError(steps)),
			FirstStep: firstOff(steps), RemovesDrift: w <= 1})
		if opts.Quick && w <= 1 {
			break
		}
	}
	var best *SwapResult
	for i := range rep.Swaps {
		sw := &rep.Swaps[i]
		if sw.RemovesDrift && (best == nil || sw.MaxRatio < best.MaxRatio) {
			best = sw
		}
	}
	if best != nil {
		st := best.Stage
		rep.Stage = &st
		rep.Reason = fmt.Sprintf("the error leaves the floor at step %d (context %d, %.3g x the threshold at worst); swapping %s for its reference removes the drift",
			*rep.FirstStep, *rep.FirstContextLen, worst, st)
		return rep, nil
	}
	// No single swap helps: more than one stage drifts. Run each alone.
	var alone []string
	for _, stage := range Stages {
		str, note, err := s.runBroken(ctx, backend.Only{Base: be, Stage: stage}, base)
		if err != nil {
			return nil, err
		}
		if note != "" {
			rep.Notes = append(rep.Notes, note)
		}
		steps, w := base.drift(str)
		rep.Isolated = append(rep.Isolated, SwapResult{Stage: stage, MaxRatio: compare.Float(w), MaxError: compare.Float(maxError(steps)),
			FirstStep: firstOff(steps), RemovesDrift: w > 1})
		if w > 1 {
			alone = append(alone, stage)
		}
	}
	if len(alone) > 0 {
		st := alone[0]
		rep.Stage = &st
		rep.Reason = fmt.Sprintf("no single swap removes the drift; alone on the backend, %s drift (the first, %s, is named)", strings.Join(alone, ", "), st)
	} else {
		rep.Reason = "no single swap removes the drift and no stage drifts alone: the stages interact"
	}
	return rep, nil
}

// Changed reports whether the backend changed any step's output: a
// backend that plants a bug and changed none proved nothing.
func (r *Diagnosis) Changed() bool {
	for _, s := range r.Steps {
		if s.Error != 0 {
			return true
		}
	}
	return false
}

func promptSummaries(steps []StepResult) []PromptSummary {
	var out []PromptSummary
	for _, s := range steps {
		if len(out) == 0 || out[len(out)-1].Prompt != s.Prompt {
			out = append(out, PromptSummary{Prompt: s.Prompt})
		}
		p := &out[len(out)-1]
		p.MaxError = compare.Float(math.Max(float64(p.MaxError), float64(s.Error)))
		p.MaxFloor = compare.Float(math.Max(float64(p.MaxFloor), float64(s.Floor)))
		if s.OffFloor && p.FirstStep == nil {
			i := s.Step
			p.FirstStep = &i
		}
	}
	return out
}

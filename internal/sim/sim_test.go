package sim

import (
	"context"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/faults"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// tableConfig is the simulation the table tests run: DeepSeek-V3's real
// L = 512 and R = 64 at TP64 (2 heads), two prompts of four steps over
// three requests (padded to a CUDA-graph batch of 4), a 80-wide hidden
// state (K/16 = 5 scale columns: the swizzled layout pads them). Small
// enough that the whole fault table runs in seconds; the second prompt is
// what stale-page bugs need.
func tableConfig() Config {
	return Config{TP: 64, Prompts: 2, Steps: 4, Hidden: 80}
}

// simCache shares simulations and their baselines between tests: both
// depend on the configuration only.
var simCache = struct {
	sync.Mutex
	sims  map[string]*Sim
	bases map[string]*Baseline
}{sims: map[string]*Sim{}, bases: map[string]*Baseline{}}

func cachedSim(t *testing.T, cfg Config) (*Sim, *Baseline) {
	t.Helper()
	key := cfg.withDefaults().String()
	simCache.Lock()
	defer simCache.Unlock()
	if simCache.sims[key] == nil {
		s, err := New(cfg)
		if err != nil {
			t.Fatalf("New(%s): %v", key, err)
		}
		b, err := s.Baseline(context.Background(), DefaultThresholds())
		if err != nil {
			t.Fatalf("baseline of %s: %v", key, err)
		}
		simCache.sims[key], simCache.bases[key] = s, b
	}
	return simCache.sims[key], simCache.bases[key]
}

// configFor applies a fault's Simulate settings to the table configuration.
func configFor(t *testing.T, f *faults.Fault) Config {
	cfg := tableConfig()
	for k, v := range f.Simulate {
		if err := cfg.Set(k, v); err != nil {
			t.Fatalf("fault %s: Simulate %s=%s: %v", f.Name, k, v, err)
		}
	}
	return cfg
}

// The simulation names every catalog fault's own stage, and says where the
// error left the floor.
func TestSimulationAttributesEveryFault(t *testing.T) {
	seen := map[string]bool{}
	for _, f := range faults.All() {
		if (raceEnabled || testing.Short()) && seen[f.Stage] {
			continue // one fault a stage: see raceEnabled
		}
		seen[f.Stage] = true
		t.Run(f.Name, func(t *testing.T) {
			if err := f.Simulated(Kernels...); (err != nil) != (f.NotSimulated != "") {
				t.Errorf("Simulated: %v, with not_simulated %q", err, f.NotSimulated)
			}
			if f.NotSimulated != "" {
				t.Skip(f.NotSimulated)
			}
			s, base := cachedSim(t, configFor(t, f))
			rep, err := s.Diagnose(context.Background(), faults.Backend{Fault: f}, DiagnoseOptions{Baseline: base, Quick: true})
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Showed(rep.Changed()); err != nil {
				t.Errorf("under its Simulate settings: %v", err)
			}
			if rep.Verdict != "fail" || rep.Stage == nil || *rep.Stage != f.Stage {
				t.Fatalf("verdict %s, stage %v; want fail in %s (%s)", rep.Verdict, deref(rep.Stage), f.Stage, rep.Reason)
			}
			if rep.FirstStep == nil || rep.FirstContextLen == nil || !rep.Steps[*rep.FirstStep].OffFloor {
				t.Errorf("first_step %v, first_context_len %v: want the first off-floor step", rep.FirstStep, rep.FirstContextLen)
			}
			for _, st := range rep.Steps[:*rep.FirstStep] {
				if st.OffFloor {
					t.Errorf("step %d is off the floor before first_step %d", st.Step, *rep.FirstStep)
				}
			}
			last := rep.Swaps[len(rep.Swaps)-1]
			if last.Stage != f.Stage || !last.RemovesDrift {
				t.Errorf("swaps %+v: want swapping %s to remove the drift", rep.Swaps, f.Stage)
			}
			for _, sw := range rep.Swaps[:len(rep.Swaps)-1] {
				if sw.RemovesDrift {
					t.Errorf("swapping %s also removes the drift of a %s fault", sw.Stage, f.Stage)
				}
			}
		})
	}
}

// recorder is a backend that records the kernels it is asked to run.
type recorder struct {
	backend.Backend
	mu    sync.Mutex
	calls map[string]bool
}

func (r *recorder) Run(ctx context.Context, name string, in kernel.Inputs) (map[string]*tensor.Tensor, error) {
	r.mu.Lock()
	r.calls[name] = true
	r.mu.Unlock()
	return r.Backend.Run(ctx, name, in)
}

// Kernels is what the simulated decoder calls, and a backend that plants
// no bug changes no step: what kcheck diagnose's refusal of a planted
// fault that cannot show relies on.
func TestKernelsAndChanged(t *testing.T) {
	s, base := cachedSim(t, tableConfig())
	rec := &recorder{Backend: backend.Reference{}, calls: map[string]bool{}}
	rep, err := s.Diagnose(context.Background(), rec, DiagnoseOptions{Baseline: base, Quick: true})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, k := range Kernels {
		want[k] = true
	}
	if !maps.Equal(rec.calls, want) {
		t.Errorf("the simulation calls %v; Kernels lists %v", slices.Sorted(maps.Keys(rec.calls)), Kernels)
	}
	if rep.Changed() {
		t.Errorf("the reference backend changed a step: %+v", rep.Steps)
	}
	f, err := faults.Lookup("fp8_scale_ignored") // fp8 caches only; the table's is bf16
	if err != nil {
		t.Fatal(err)
	}
	rep, err = s.Diagnose(context.Background(), faults.Backend{Fault: f}, DiagnoseOptions{Baseline: base, Quick: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Showed(rep.Changed()); err == nil || !strings.Contains(err.Error(), "--kv-cache-dtype fp8_e4m3") {
		t.Errorf("fp8_scale_ignored over a bf16 cache: %v, want no effect and the setting it needs", err)
	}
}

func deref(s *string) string {
	if s == nil {
		return "null"
	}
	return *s
}

// Stale pages only show once a finished sequence's pages are reused: the
// first prompt runs on a zeroed cache.
func TestStalePagesShowOnTheSecondPrompt(t *testing.T) {
	f, _ := faults.Lookup("stale_pages")
	s, base := cachedSim(t, configFor(t, f))
	rep, err := s.Diagnose(context.Background(), faults.Backend{Fault: f}, DiagnoseOptions{Baseline: base, Quick: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.FirstStep == nil || rep.Steps[*rep.FirstStep].Prompt != 1 || rep.Steps[*rep.FirstStep].PromptStep != 0 {
		t.Errorf("first off-floor step %v: want the second prompt's first step", rep.FirstStep)
	}
	if rep.Prompts[0].FirstStep != nil {
		t.Errorf("prompt 0 leaves the floor at step %d on a fresh cache", *rep.Prompts[0].FirstStep)
	}
}

// precise is a correct kernel set of higher precision than declared:
// float64 accumulation and fp32 P. Not a fault.
type precise struct{}

func (precise) Name() string { return "precise" }
func (precise) Run(ctx context.Context, name string, in kernel.Inputs) (map[string]*tensor.Tensor, error) {
	p := kernel.Params{}
	for k, v := range in.Params {
		p[k] = v
	}
	p["acc_dtype"], p["p_dtype"] = "f64", "f32"
	return backend.Reference{}.Run(ctx, name, kernel.Inputs{Tensors: in.Tensors, Params: p})
}

// resplit is a correct decode that splits the context differently (the
// first split takes everything but one token for each later split, as a
// scheduler balancing by pages might): another valid accumulation order.
type resplit struct{}

func (resplit) Name() string { return "resplit" }
func (resplit) Run(ctx context.Context, name string, in kernel.Inputs) (map[string]*tensor.Tensor, error) {
	if name != "mla_decode" {
		return backend.Reference{}.Run(ctx, name, in)
	}
	s, err := in.Params.Int("num_splits", 0)
	if err != nil {
		return nil, err
	}
	sl := in.Tensors["seq_lens"]
	b := make([]int64, sl.Len()*(s+1))
	for r := 0; r < sl.Len(); r++ {
		n := sl.Int64At(r)
		for k := 1; k <= s; k++ {
			b[r*(s+1)+k] = max(0, n-int64(s-k))
		}
	}
	ts := map[string]*tensor.Tensor{"split_bounds": tensor.FromInt64s(tensor.I32, []int{sl.Len(), s + 1}, b)}
	for k, v := range in.Tensors {
		ts[k] = v
	}
	return backend.Reference{}.Run(ctx, name, kernel.Inputs{Tensors: ts, Params: in.Params})
}

// Correct kernels raise no alarm: the reference itself, the exact chain,
// a more precise kernel and a differently split one, over every cache dtype.
func TestSimulationNoFalseAlarm(t *testing.T) {
	dtypes := []string{"bf16", "fp8_e4m3", "fp8_ds_mla"}
	if raceEnabled || testing.Short() {
		dtypes = dtypes[:1]
	}
	for _, dtype := range dtypes {
		cfg := tableConfig()
		cfg.KVCacheDType = dtype
		s, base := cachedSim(t, cfg)
		bes := []backend.Backend{backend.Reference{}, backend.Exact{}, precise{}, resplit{}}
		if raceEnabled || testing.Short() {
			bes = bes[2:]
		}
		for _, be := range bes {
			rep, err := s.Diagnose(context.Background(), be, DiagnoseOptions{Baseline: base})
			if err != nil {
				t.Fatalf("%s, %s: %v", dtype, be.Name(), err)
			}
			if rep.Verdict != "pass" || rep.Stage != nil || rep.FirstStep != nil {
				t.Errorf("%s, %s: verdict %s, stage %s, first step %v; want pass (%s)", dtype, be.Name(), rep.Verdict, deref(rep.Stage), rep.FirstStep, rep.Reason)
			}
			if be.Name() == "reference" {
				for _, st := range rep.Steps {
					if st.Error != 0 {
						t.Errorf("%s: the reference differs from itself at step %d (%g)", dtype, st.Step, float64(st.Error))
					}
				}
			}
		}
		for i, f := range base.Floor {
			if !(f > 0 && f < 0.01) {
				t.Errorf("%s: floor at step %d is %g; want a rounding-sized floor in (0, 0.01)", dtype, i, f)
			}
		}
	}
}

// relRMS against hand-computed values.
func TestRelRMS(t *testing.T) {
	inf := math.Inf(1)
	nan := math.NaN()
	tests := []struct {
		name string
		a, b []float64
		want float64
	}{
		{"equal", []float64{1, -2}, []float64{1, -2}, 0},
		{"3-4-5", []float64{3, 4}, []float64{0, 0}, inf}, // any error against all-zero
		{"10%", []float64{1.1, 0}, []float64{1, 0}, 0.1},
		// sqrt((0.3² + 0.4²)/(3² + 4²)) = 0.5/5
		{"0.1 of a 3-4-5", []float64{3.3, 4.4}, []float64{3, 4}, 0.1},
		{"NaN where finite", []float64{nan, 1}, []float64{1, 1}, inf},
		{"NaN where NaN", []float64{nan, 1}, []float64{nan, 1}, 0},
		{"zero vs zero", []float64{0}, []float64{0}, 0},
	}
	for _, tc := range tests {
		if got := relRMS(tc.a, tc.b); math.Abs(got-tc.want) > 1e-12 && !(math.IsInf(got, 1) && math.IsInf(tc.want, 1)) {
			t.Errorf("%s: relRMS = %g, want %g", tc.name, got, tc.want)
		}
	}
}

// The allocator hands out the most recently freed block first, and the
// highest block ids first on a fresh cache.
func TestAllocatorIsLIFO(t *testing.T) {
	a := newAllocator(4)
	var got []int
	for i := 0; i < 3; i++ {
		b, _ := a.alloc()
		got = append(got, b)
	}
	if got[0] != 3 || got[1] != 2 || got[2] != 1 {
		t.Errorf("fresh allocation order %v, want [3 2 1]", got)
	}
	a.release([]int{3, 2})
	if b, _ := a.alloc(); b != 2 {
		t.Errorf("after freeing [3 2], got block %d; want 2 (the last freed)", b)
	}
	a.alloc()
	a.alloc()
	if _, err := a.alloc(); err == nil {
		t.Error("allocating past the cache succeeded")
	}
}

func TestConfig(t *testing.T) {
	tests := []struct {
		set  [2]string
		want string // error substring, "" for success
	}{
		{[2]string{"tp", "8"}, ""},
		{[2]string{"kv-cache-dtype", "fp8_e4m3"}, ""},
		{[2]string{"set", "kcheck.fault.int32_limit=4096"}, ""},
		{[2]string{"set", "novalue"}, "KEY=VALUE"},
		{[2]string{"steps", "x"}, "not an integer"},
		{[2]string{"bogus", "1"}, "unknown simulation setting"},
	}
	for _, tc := range tests {
		cfg := DefaultConfig()
		err := cfg.Set(tc.set[0], tc.set[1])
		if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Set(%s, %s) = %v, want %q", tc.set[0], tc.set[1], err, tc.want)
		}
	}
	bad := []struct {
		cfg  Config
		want string
	}{
		{Config{Preset: "gpt-2"}, "unknown preset"},
		{Config{TP: 3}, "does not divide"},
		{Config{Hidden: 100}, "multiple of 16"},
		{Config{KVCacheDType: "int4"}, "kv-cache-dtype"},
		{Config{ScaleLayout: "tiled"}, "scale-layout"},
		{Config{ActCalib: -1}, "act-calib"},
	}
	for _, tc := range bad {
		if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error about %q", tc.cfg, err, tc.want)
		}
	}
}

// A simulation is a pure function of its configuration.
func TestSimulationIsDeterministic(t *testing.T) {
	cfg := tableConfig()
	cfg.Prompts, cfg.Steps = 1, 2
	a, _ := New(cfg)
	b, _ := New(cfg)
	ta, err := a.Run(context.Background(), backend.Reference{})
	if err != nil {
		t.Fatal(err)
	}
	tb, _ := b.Run(context.Background(), backend.Reference{})
	for i := range ta {
		if relRMS(ta[i].Out, tb[i].Out) != 0 {
			t.Fatalf("step %d differs between two runs of one configuration", i)
		}
	}
	if a.Heads() != 2 || a.Config().Hidden != 80 {
		t.Errorf("heads %d, hidden %d; want 2 (128 heads / TP64) and 80", a.Heads(), a.Config().Hidden)
	}
}

package report

import (
	"bytes"
	"fmt"
	"image/png"
	"math"
	"testing"
	"time"

	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
)

// failingResult is a failing result with one failing output.
func failingResult(tensor string) check.Result {
	return check.Result{File: "x.safetensors", Kernel: "mla_decode", Verdict: check.Fail,
		Checks: []compare.Check{{Tensor: tensor, Verdict: compare.Fail}}}
}

// along is a profile of one coordinate with the given err/tol maxima (and
// means) at values start, start+1, ...
func along(name string, start int, max, mean []float64) Profile {
	cp := CoordProfile{Name: name}
	for i := range max {
		cp.Values = append(cp.Values, start+i)
		cp.Max = append(cp.Max, compare.Float(max[i]))
		cp.Mean = append(cp.Mean, compare.Float(mean[i]))
		cp.Failing = append(cp.Failing, 1)
		cp.Count = append(cp.Count, 1)
	}
	return Profile{Tensor: "out", Kernel: "mla_decode", Axes: 1, Coords: []CoordProfile{cp}, Sampled: 1, PageSize: 16}
}

func grid(cells [][]float64) *Grid {
	g := &Grid{X: "latent", Y: "head"}
	for i := range cells[0] {
		g.XVals = append(g.XVals, i)
	}
	for i, row := range cells {
		g.YVals = append(g.YVals, i)
		var r []compare.Float
		for _, v := range row {
			r = append(r, compare.Float(v))
		}
		g.Max = append(g.Max, r)
	}
	return g
}

// Every plot draws whatever err/tol values a profile holds: a NaN or Inf
// mismatch in every element (the shipped example mla_decode_page_tail), NaN,
// values at the ends of the float64 range; a drawing error is returned,
// never a panic, and nothing loops.
func TestPlotsOfNonFiniteValues(t *testing.T) {
	inf, nan := math.Inf(1), math.NaN()
	tiny, huge := 5e-324, math.MaxFloat64
	withMap := func(p Profile, cells [][]float64) Profile { p.Map = grid(cells); return p }
	bitwise := along("token", 0, []float64{inf, 0, inf}, []float64{inf, 0, inf})
	bitwise.Bitwise = true
	cases := []struct {
		name string
		p    Profile
	}{
		{"every element a NaN mismatch (infinite err/tol, mean 0)", along("token", 0, []float64{inf, inf, inf, inf}, []float64{0, 0, 0, 0})},
		{"NaN err/tol", along("token", 0, []float64{nan, 1, 2, nan}, []float64{nan, 1, 1, nan})},
		{"-Inf and negative err/tol", along("token", 0, []float64{math.Inf(-1), -1, 2, 3}, []float64{-1, -1, 1, 1})},
		{"subnormal err/tol", along("token", 0, []float64{tiny, tiny, 2, 3}, []float64{tiny, tiny, 1, 1})},
		{"err/tol at the largest float64", along("token", 0, []float64{huge, huge, 1, tiny}, []float64{huge, 1, 1, tiny})},
		{"all zero", along("token", 0, []float64{0, 0, 0}, []float64{0, 0, 0})},
		{"bitwise, every element differing", bitwise},
		{"tokens just under 2^40, pages of 16", along("token", 1<<40-5, []float64{1, 2, 3, 4, 5}, []float64{1, 1, 1, 1, 1})},
		{"heat map with NaN, Inf and 0", withMap(along("token", 0, []float64{1, 2}, []float64{1, 1}), [][]float64{{nan, inf, 0}, {math.Inf(-1), huge, tiny}})},
		{"heat map of one cell", withMap(along("token", 0, []float64{1, 2}, []float64{1, 1}), [][]float64{{inf}})},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() {
				defer func() {
					if r := recover(); r != nil {
						done <- panicError{r}
					}
				}()
				it := Item{Result: failingResult("out"), Profiles: []Profile{tc.p}}
				files := map[string][]byte{}
				done <- drawn(renderPlots(Bundle{Items: []Item{it}}, MarkdownOptions{}, files), files)
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("plots not drawn: %v", err)
				}
			case <-time.After(time.Minute):
				t.Fatal("drawing did not finish in a minute")
			}
		})
	}
}

// The drift plot draws steps whose error or floor is NaN, Inf, 0,
// subnormal or the largest float64.
func TestDriftPlotOfNonFiniteValues(t *testing.T) {
	vals := []float64{math.NaN(), math.Inf(1), 0, 5e-324, math.MaxFloat64, 1e-3, math.Inf(-1)}
	d := &Diagnosis{Verdict: "fail", FirstStep: intp(3)}
	for i, v := range vals {
		d.Steps = append(d.Steps, Step{Step: i, Prompt: i / 3, ContextLen: 10 + i, Error: compare.Float(v), Floor: compare.Float(vals[len(vals)-1-i]), Threshold: compare.Float(v)})
	}
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("panic: %v", r)
			}
		}()
		files := map[string][]byte{}
		figs := renderPlots(Bundle{Diagnosis: d}, MarkdownOptions{}, files)
		if figs.drift == nil {
			t.Fatal("no drift figure")
		}
		if err := drawn(figs, files); err != nil {
			t.Error(err)
		}
	}()
}

// drawn returns an error unless every figure was drawn to a PNG in files.
func drawn(figs figures, files map[string][]byte) error {
	var all []Figure
	for _, byTensor := range figs.byCheck {
		for _, fs := range byTensor {
			all = append(all, fs...)
		}
	}
	if figs.drift != nil {
		all = append(all, *figs.drift)
	}
	if len(all) == 0 {
		return fmt.Errorf("no figure")
	}
	for _, f := range all {
		if f.Err != "" {
			return fmt.Errorf("%s not drawn: %s", f.Caption, f.Err)
		}
		if _, err := png.Decode(bytes.NewReader(files[f.Path])); err != nil {
			return fmt.Errorf("%s: %v", f.Path, err)
		}
	}
	return nil
}

type panicError struct{ v any }

func (p panicError) Error() string { return fmt.Sprint("panic: ", p.v) }

// A report draws at most maxPlots PNGs, however many failing outputs a
// report.json lists; the rest are named as not drawn.
func TestPlotsBounded(t *testing.T) {
	defer func(n int) { maxPlots = n }(maxPlots)
	maxPlots = 4
	p := along("token", 0, []float64{1, 2, 3}, []float64{1, 1, 1})
	var it Item
	it.Result = failingResult("out")
	it.Result.Checks = nil
	for i := 0; i < maxPlots+3; i++ {
		name := fmt.Sprintf("t%d", i)
		it.Result.Checks = append(it.Result.Checks, compare.Check{Tensor: name, Verdict: compare.Fail})
		q := p
		q.Tensor = name
		it.Profiles = append(it.Profiles, q)
	}
	files := map[string][]byte{}
	figs := renderPlots(Bundle{Items: []Item{it}}, MarkdownOptions{}, files)
	refused := 0
	for _, fs := range figs.byCheck[0] {
		for _, f := range fs {
			if f.Err != "" {
				refused++
			}
		}
	}
	if len(files) != maxPlots || refused != 3 {
		t.Errorf("%d plots drawn, %d refused; want %d and 3", len(files), refused, maxPlots)
	}
}

package report

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/palette/moreland"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/kcheck-dev/kcheck/internal/compare"
)

// Colours: the error in blue, its mean dashed, the tolerance in black,
// page boundaries grey, split boundaries orange, the noise floor green.
var (
	colErr   = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	colTol   = color.RGBA{A: 255}
	colPage  = color.RGBA{R: 160, G: 160, B: 160, A: 255}
	colSplit = color.RGBA{R: 255, G: 127, B: 14, A: 255}
	colFloor = color.RGBA{R: 44, G: 160, B: 44, A: 255}
	colFirst = color.RGBA{R: 214, G: 39, B: 40, A: 255}
)

// maxBoundaries bounds the boundary lines drawn; past it they would paint
// the plot grey, and the caption says they were left out.
const maxBoundaries = 64

// trendOrder are the coordinates an error-along-an-axis plot prefers when
// the signature names none: token positions first.
var trendOrder = []string{"token", "context_len", "visible", "position", "split_start", "row", "block", "page", "request"}

// axisFor picks the coordinate to plot the error along: the signature's
// when it has at least 4 values, else a token-like one, else the output
// axis with the most values.
func axisFor(p Profile, sigCoord string) *CoordProfile {
	byName := map[string]*CoordProfile{}
	for i := range p.Coords {
		byName[p.Coords[i].Name] = &p.Coords[i]
	}
	if c := byName[sigCoord]; c != nil && len(c.Values) >= 4 {
		return c
	}
	for _, n := range trendOrder {
		if c := byName[n]; c != nil && len(c.Values) >= 4 {
			return c
		}
	}
	var best *CoordProfile
	for i := 0; i < p.Axes && i < len(p.Coords); i++ {
		if c := &p.Coords[i]; best == nil || len(c.Values) > len(best.Values) {
			best = c
		}
	}
	return best
}

// yOf returns what a profile plots for value j: the largest err/tol, or for
// a bitwise output the fraction of elements that differ.
func yOf(p Profile, c *CoordProfile, j int) (max, mean float64) {
	if p.Bitwise {
		n := c.Count[j] * max1(p.Sampled)
		if n == 0 {
			return 0, 0
		}
		f := math.Min(float64(c.Failing[j])/float64(n), 1)
		return f, f
	}
	return float64(c.Max[j]), float64(c.Mean[j])
}

func max1(v int) int {
	if v < 1 {
		return 1
	}
	return v
}

// Bounds of a logarithmic err/tol or error axis: its decades stay inside
// the float64 range (10^±300) and it spans at most maxDecades, so that the
// axis and its ticks exist whatever the values; a value outside is drawn at
// the edge it passed.
const (
	minAxisExp = -300
	maxAxisExp = 300
	maxDecades = 30
)

// logRange returns the decades [10^lo, 10^hi] that hold the positive
// finite values from minPos to maxPos, widened to [10^floorExp, 10^ceilExp]
// at least.
func logRange(minPos, maxPos float64, floorExp, ceilExp int) (ymin, ymax float64) {
	lo, hi := floorExp, ceilExp
	if !math.IsInf(minPos, 0) && minPos > 0 {
		lo = min(lo, int(math.Floor(math.Log10(minPos))))
	}
	if !math.IsInf(maxPos, 0) && maxPos > 0 {
		hi = max(hi, int(math.Ceil(math.Log10(maxPos))))
	}
	hi = min(max(hi, minAxisExp+1), maxAxisExp)
	lo = max(lo, minAxisExp, hi-maxDecades)
	return math.Pow(10, float64(lo)), math.Pow(10, float64(hi))
}

// clampY puts y inside [lo, hi] for drawing: NaN and +Inf (an err/tol that
// is not a number, or a mismatch against a zero tolerance) at the top.
func clampY(y, lo, hi float64) float64 {
	switch {
	case math.IsNaN(y) || y > hi:
		return hi
	case y < lo:
		return lo
	}
	return y
}

// plotErrs collects the errors of gonum's constructors, which refuse NaN
// and Inf coordinates: a plot is drawn whole or not at all.
type plotErrs struct{ err error }

func (e *plotErrs) line(xys plotter.XYs) *plotter.Line {
	l, err := plotter.NewLine(xys)
	if err != nil && e.err == nil {
		e.err = err
	}
	if l == nil {
		l = &plotter.Line{}
	}
	return l
}

func (e *plotErrs) linePoints(xys plotter.XYs) (*plotter.Line, *plotter.Scatter) {
	l, s, err := plotter.NewLinePoints(xys)
	if err != nil && e.err == nil {
		e.err = err
	}
	if l == nil || s == nil {
		l, s = &plotter.Line{}, &plotter.Scatter{}
	}
	return l, s
}

// maxCoordMagnitude bounds the coordinate values a plot draws: they index
// elements of a tensor, which never has 2^40 of them, and up to it float64
// holds every integer with room for the ticks between them.
const maxCoordMagnitude = 1 << 40

// positionPlot draws the error along one coordinate with page and split
// boundaries. It returns a nil plot when the profile has nothing to draw.
func positionPlot(p Profile, sigCoord string) (*plot.Plot, string, error) {
	c := axisFor(p, sigCoord)
	if c == nil || len(c.Values) < 2 {
		return nil, "", nil
	}
	if err := c.check(); err != nil {
		return nil, "", err
	}
	maxXY, meanXY := make(plotter.XYs, len(c.Values)), make(plotter.XYs, len(c.Values))
	nonFinite := false
	finiteMax, minPos := 0.0, math.Inf(1)
	for j, v := range c.Values {
		mx, mn := yOf(p, c, j)
		maxXY[j] = plotter.XY{X: float64(v), Y: mx}
		meanXY[j] = plotter.XY{X: float64(v), Y: mn}
		for _, y := range []float64{mx, mn} {
			switch {
			case math.IsInf(y, 1) || math.IsNaN(y):
				nonFinite = true
			case y > 0:
				finiteMax = math.Max(finiteMax, y)
				minPos = math.Min(minPos, y)
			}
		}
	}
	pl := plot.New()
	what := "largest err/tol"
	if p.Bitwise {
		what = "fraction of elements that differ"
	}
	pl.Title.Text = fmt.Sprintf("%s: %s by %s", p.Tensor, what, c.Name)
	pl.X.Label.Text = c.Name
	pl.X.Tick.Marker = intTicks{}
	if c.Width > 1 {
		pl.X.Label.Text += fmt.Sprintf(" (bins of %d)", c.Width)
	}
	var notes []string
	ymin, ymax := 0.0, 1.4
	logY := !p.Bitwise && finiteMax > 0
	switch {
	case logY:
		// err/tol spans decades; the floor of the axis stands in for 0.
		ymin, ymax = logRange(minPos, finiteMax, -1, 1)
		if nonFinite {
			ymax *= 10
		}
		pl.Y.Scale = plot.LogScale{}
		pl.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		pl.Y.Label.Text = "err / tol (log)"
	case p.Bitwise:
		pl.Y.Label.Text = "fraction differing"
	default:
		pl.Y.Label.Text = "err / tol"
	}
	if nonFinite {
		notes = append(notes, "infinite err/tol (NaN/Inf mismatch or error against a zero tolerance) drawn at the top")
	}
	for _, xys := range []plotter.XYs{maxXY, meanXY} {
		for j := range xys {
			xys[j].Y = clampY(xys[j].Y, ymin, ymax)
		}
	}
	if logY {
		ymax *= 100 // headroom for the legend
	}
	pl.Y.Min, pl.Y.Max = ymin, ymax
	xmin, xmax := c.Values[0], c.Values[len(c.Values)-1]
	pl.X.Min, pl.X.Max = float64(xmin), float64(xmax)

	var errs plotErrs
	vline := func(x int, col color.Color, dashed bool) *plotter.Line {
		l := errs.line(plotter.XYs{{X: float64(x), Y: ymin}, {X: float64(x), Y: ymax}})
		l.Color = col
		l.Width = vg.Points(0.6)
		if dashed {
			l.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
		}
		return l
	}
	if ps := p.PageSize; tokenLike(c.Name) && ps > 0 {
		// Boundaries are counted in integers: a float step can be too
		// small to move its sum.
		first := xmin / ps * ps
		if first < xmin {
			first += ps
		}
		n := 0
		if first <= xmax {
			n = (xmax-first)/ps + 1
		}
		if n <= maxBoundaries {
			var pg *plotter.Line
			for k := 0; k < n; k++ {
				pg = vline(first+k*ps, colPage, true)
				pl.Add(pg)
			}
			if pg != nil {
				pl.Legend.Add(fmt.Sprintf("page boundary (P = %d)", ps), pg)
			}
		} else {
			notes = append(notes, fmt.Sprintf("%d page boundaries (P = %d) not drawn", n, ps))
		}
	}
	if tokenLike(c.Name) && len(p.SplitStarts) > 0 {
		if len(p.SplitStarts) <= maxBoundaries {
			var sp *plotter.Line
			for _, s := range p.SplitStarts {
				if s >= xmin && s <= xmax {
					sp = vline(s, colSplit, false)
					pl.Add(sp)
				}
			}
			if sp != nil {
				pl.Legend.Add("split-K split start", sp)
			}
		} else {
			notes = append(notes, fmt.Sprintf("%d split boundaries not drawn", len(p.SplitStarts)))
		}
	}
	if !p.Bitwise {
		tl := errs.line(plotter.XYs{{X: float64(xmin), Y: 1}, {X: float64(xmax), Y: 1}})
		tl.Color = colTol
		tl.Width = vg.Points(0.8)
		pl.Add(tl)
		pl.Legend.Add("tolerance (err/tol = 1)", tl)
	}
	ml, mp := errs.linePoints(maxXY)
	ml.Color, mp.Color = colErr, colErr
	mp.Shape = draw.CircleGlyph{}
	mp.Radius = vg.Points(1.5)
	pl.Add(ml, mp)
	if p.FromSignature {
		pl.Legend.Add("mean over the group", ml)
	} else {
		pl.Legend.Add("largest", ml)
	}
	if !p.Bitwise && !p.FromSignature {
		al := errs.line(meanXY)
		al.Color = colErr
		al.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
		pl.Add(al)
		pl.Legend.Add("mean", al)
	}
	if errs.err != nil {
		return nil, "", errs.err
	}
	pl.Legend.Top = true
	caption := fmt.Sprintf("%s of %s by %s (largest and mean over the elements sharing each value)", what, code(p.Tensor), code(c.Name))
	if p.FromSignature {
		pl.Title.Text = fmt.Sprintf("%s: mean err/tol of the signature's groups by %s", p.Tensor, c.Name)
		caption = fmt.Sprintf("mean err/tol of %s over the signature's reported groups of %s only (re-rendered from JSON, which keeps no per-element errors)", code(p.Tensor), code(c.Name))
	}
	if len(notes) > 0 {
		caption += "; " + strings.Join(notes, "; ")
	}
	if p.Sampled > 1 {
		caption += fmt.Sprintf("; counts from 1 element in %d, every failing element included", p.Sampled)
	}
	return pl, caption, nil
}

// gridValues adapts a Grid to plotter.GridXYZ on cell indices, the colour
// being log10 of the largest err/tol (infinite values clamp to the top).
type gridValues struct {
	g       *Grid
	bitwise bool
}

func (g gridValues) Dims() (c, r int)   { return len(g.g.XVals), len(g.g.YVals) }
func (g gridValues) X(c int) float64    { return float64(c) }
func (g gridValues) Y(r int) float64    { return float64(r) }
func (g gridValues) Z(c, r int) float64 { return zOf(float64(g.g.Max[r][c]), g.bitwise) }

const zSpan = 3 // colours run over err/tol from 1e-3 to 1e3

func zOf(v float64, bitwise bool) float64 {
	switch {
	case math.IsNaN(v):
		return math.NaN()
	case bitwise:
		if v > 0 {
			return zSpan
		}
		return -zSpan
	case v <= 0:
		return -zSpan
	}
	return math.Max(-zSpan, math.Min(zSpan, math.Log10(v)))
}

// mapPlot draws the largest err/tol over the profile's two map coordinates.
func mapPlot(p Profile) (*plot.Plot, string, error) {
	g := p.Map
	if g == nil || len(g.XVals) == 0 || len(g.YVals) == 0 {
		return nil, "", nil
	}
	if err := g.check(); err != nil {
		return nil, "", err
	}
	pal := moreland.SmoothBlueRed()
	pal.SetMin(-zSpan)
	pal.SetMax(zSpan)
	hm := plotter.NewHeatMap(gridValues{g, p.Bitwise}, pal.Palette(255))
	hm.Min, hm.Max = -zSpan, zSpan
	hm.NaN = color.RGBA{R: 220, G: 220, B: 220, A: 255}
	pl := plot.New()
	pl.Add(hm)
	pl.Title.Text = fmt.Sprintf("%s: largest err/tol by %s and %s", p.Tensor, g.Y, g.X)
	pl.X.Label.Text = axisLabel(g.X, g.XWidth)
	pl.Y.Label.Text = axisLabel(g.Y, g.YWidth)
	pl.X.Tick.Marker = indexTicks(g.XVals)
	pl.Y.Tick.Marker = indexTicks(g.YVals)
	pl.Legend = plot.NewLegend() // the colour bar beside it is the legend
	caption := fmt.Sprintf("largest err/tol of %s by %s (rows) and %s (columns); colour log10(err/tol) from -3 (blue) through 0 (white: at the tolerance) to +3 (red); grey: no element", code(p.Tensor), code(g.Y), code(g.X))
	if p.Bitwise {
		caption = fmt.Sprintf("elements of %s that differ, by %s (rows) and %s (columns): red where any differs, blue where all match; grey: no element", code(p.Tensor), code(g.Y), code(g.X))
	}
	return pl, caption, nil
}

func axisLabel(name string, width int) string {
	if width > 1 {
		return fmt.Sprintf("%s (bins of %d)", name, width)
	}
	return name
}

// indexTicks labels cell indices with their coordinate values, at most
// about 12 labels.
func indexTicks(vals []int) plot.ConstantTicks {
	step := max1((len(vals) + 11) / 12)
	var t plot.ConstantTicks
	for i := 0; i < len(vals); i += step {
		t = append(t, plot.Tick{Value: float64(i), Label: strconv.Itoa(vals[i])})
	}
	return t
}

// driftPlot draws the per-step error of a simulation against its noise
// floor, with prompt boundaries and the first step off the floor.
func driftPlot(d *Diagnosis) (*plot.Plot, string, error) {
	if d == nil || len(d.Steps) < 2 {
		return nil, "", nil
	}
	if err := d.check(); err != nil {
		return nil, "", err
	}
	errXY, floorXY := make(plotter.XYs, len(d.Steps)), make(plotter.XYs, len(d.Steps))
	var thrXY plotter.XYs
	minPos, maxV := math.Inf(1), 0.0
	for i, s := range d.Steps {
		errXY[i] = plotter.XY{X: float64(s.Step), Y: float64(s.Error)}
		floorXY[i] = plotter.XY{X: float64(s.Step), Y: float64(s.Floor)}
		if s.Threshold > 0 {
			thrXY = append(thrXY, plotter.XY{X: float64(s.Step), Y: float64(s.Threshold)})
		}
		for _, v := range []float64{float64(s.Error), float64(s.Floor), float64(s.Threshold)} {
			if v > 0 && !math.IsInf(v, 0) && !math.IsNaN(v) {
				minPos = math.Min(minPos, v)
				maxV = math.Max(maxV, v)
			}
		}
	}
	if maxV == 0 {
		return nil, "", nil
	}
	ymin, ymax := logRange(minPos, maxV, maxAxisExp, minAxisExp)
	if ymax <= ymin {
		ymax = ymin * 10
	}
	for _, xys := range []plotter.XYs{errXY, floorXY, thrXY} {
		for i := range xys {
			xys[i].Y = clampY(xys[i].Y, ymin, ymax)
		}
	}
	pl := plot.New()
	pl.Title.Text = "error per decode step against the noise floor"
	pl.X.Label.Text = "decode step"
	pl.Y.Label.Text = "error (log)"
	pl.Y.Scale = plot.LogScale{}
	pl.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	pl.Y.Min, pl.Y.Max = ymin, ymax*100 // headroom for the legend
	var errs plotErrs
	vline := func(x float64, col color.Color, dashed bool) *plotter.Line {
		l := errs.line(plotter.XYs{{X: x, Y: ymin}, {X: x, Y: ymax}})
		l.Color = col
		if dashed {
			l.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
		}
		return l
	}
	var pb *plotter.Line
	nb := 0
	for i := 1; i < len(d.Steps); i++ {
		if d.Steps[i].Prompt != d.Steps[i-1].Prompt {
			nb++
			if nb <= maxBoundaries {
				pb = vline(float64(d.Steps[i].Step)-0.5, colPage, true)
				pl.Add(pb)
			}
		}
	}
	if pb != nil {
		pl.Legend.Add("new prompt", pb)
	}
	if d.FirstStep != nil {
		fl := vline(float64(*d.FirstStep), colFirst, false)
		pl.Add(fl)
		pl.Legend.Add("first step off the floor", fl)
	}
	fline := errs.line(floorXY)
	fline.Color = colFloor
	fline.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
	eline, epts := errs.linePoints(errXY)
	eline.Color, epts.Color = colErr, colErr
	epts.Shape = draw.CircleGlyph{}
	epts.Radius = vg.Points(1.5)
	if len(thrXY) > 1 {
		tl := errs.line(thrXY)
		tl.Color = colFirst
		tl.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
		pl.Add(tl)
		pl.Legend.Add("off-floor threshold", tl)
	}
	if errs.err != nil {
		return nil, "", errs.err
	}
	pl.Add(fline, eline, epts)
	pl.Legend.Add("noise floor", fline)
	pl.Legend.Add("error", eline)
	pl.Legend.Top, pl.Legend.Left = true, true
	caption := "error per decode step (blue) against the reference-at-kernel-precision noise floor (green, dotted)"
	if len(thrXY) > 1 {
		caption += " and the off-floor threshold (red, dashed)"
	}
	return pl, caption + "; grey lines start a new prompt, the red line marks the first step off the floor", nil
}

// intTicks are gonum's default ticks labelled as integers (coordinates
// are integers; "250.00" would suggest otherwise).
type intTicks struct{}

func (intTicks) Ticks(min, max float64) []plot.Tick {
	var out []plot.Tick
	for _, t := range (plot.DefaultTicks{}).Ticks(min, max) {
		if t.Label != "" {
			if t.Value != math.Trunc(t.Value) {
				t.Label = ""
			} else {
				t.Label = strconv.FormatInt(int64(t.Value), 10)
			}
		}
		out = append(out, t)
	}
	return out
}

// mapPNG renders a heat map with its colour bar on the right.
func mapPNG(pl *plot.Plot, bitwise bool, w, h vg.Length) ([]byte, error) {
	img := vgimg.New(w, h)
	dc := draw.New(img)
	barW := vg.Inch
	pl.Draw(draw.Crop(dc, 0, -barW, 0, 0))
	pal := moreland.SmoothBlueRed()
	pal.SetMin(-zSpan)
	pal.SetMax(zSpan)
	bar := plot.New()
	bar.Add(&plotter.ColorBar{ColorMap: pal, Vertical: true})
	bar.HideX()
	bar.Y.Label.Text = "log10(err/tol)"
	if bitwise {
		bar.Y.Tick.Marker = plot.ConstantTicks{{Value: -zSpan, Label: "same"}, {Value: zSpan, Label: "differ"}}
		bar.Y.Label.Text = ""
	}
	bar.Title.Text = " "
	bar.Draw(draw.Crop(dc, w-barW, 0, vg.Points(30), 0))
	var buf bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// pngOf renders a plot.
func pngOf(pl *plot.Plot, w, h vg.Length) ([]byte, error) {
	wt, err := pl.WriterTo(w, h, "png")
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if _, err := wt.WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// sigCoord is the coordinate a check's signature names ("" for none).
func sigCoord(c compare.Check) string {
	if c.Signature == nil {
		return ""
	}
	return c.Signature.Coord
}

package compare

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/signature"
	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// unforkable reads Dense values through a Values kernel.Fork cannot share
// out, as an on-demand reference without Fork is: Bounds then runs its
// units on one goroutine.
type unforkable struct{ d kernel.Dense }

func (u unforkable) Len() int         { return len(u.d) }
func (u unforkable) At(i int) float64 { return u.d[i] }

// boundsBits is everything Bounds gives, bit for bit: the aggregate
// bounds, the explanation and every element's tolerance.
type boundsBits struct {
	agg         [4]uint64
	explanation string
	tol         []uint64
}

func boundsOf(o kernel.Output, exact, expected kernel.Dense) boundsBits {
	b := ThreeWay{}.Bounds(context.Background(), o, o.DType)
	a := b.Aggregate
	out := boundsBits{
		agg:         [4]uint64{math.Float64bits(a.RMSE), math.Float64bits(a.CosDiff), math.Float64bits(a.FloorRMSE), math.Float64bits(a.FloorCosDiff)},
		explanation: b.Explanation,
		tol:         make([]uint64, len(exact)),
	}
	for i := range exact {
		out.tol[i] = math.Float64bits(b.Tol(i, exact[i], expected[i]))
	}
	return out
}

// TestThreeWayBoundsDeterministic: Bounds' parallel passes add their
// units' sums in unit order, so its aggregates, its explanation and every
// tolerance are the same bits at GOMAXPROCS 1, 2 and 8, and on one
// goroutine over values that cannot be forked, for outputs of several
// units of rows, of one unit, and 1-D outputs of several units of
// elements, with NaN and Inf among the values.
func TestThreeWayBoundsDeterministic(t *testing.T) {
	for _, tc := range []struct {
		name  string
		shape []int
	}{
		{"rows, 5 units", []int{1100, 96}},
		{"wide rows, 3 units", []int{600, 3000}},
		{"one unit", []int{40, 64}},
		{"1-D, 5 units", []int{300001}},
		{"unit axes", []int{1, 700, 1, 48}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := tensor.NumElements(tc.shape)
			r := rand.New(rand.NewPCG(7, uint64(n)))
			exact, expected := make(kernel.Dense, n), make(kernel.Dense, n)
			for i := range exact {
				// values over several binades and a floor of their last
				// bits, so that a sum in another order gives other bits
				exact[i] = r.NormFloat64() * math.Exp2(float64(r.IntN(20)-10))
				expected[i] = exact[i] * (1 + r.NormFloat64()*0x1p-9)
			}
			exact[n/3], expected[n/2], exact[n-1] = math.NaN(), math.Inf(1), math.Inf(-1)
			o := kernel.Output{Name: "y", Shape: tc.shape, DType: tensor.BF16, Exact: exact, Expected: expected, Mode: kernel.Numeric, Reduction: 512}
			var want boundsBits
			for k, procs := range []int{1, 2, 8} {
				old := runtime.GOMAXPROCS(procs)
				got := boundsOf(o, exact, expected)
				runtime.GOMAXPROCS(old)
				if k == 0 {
					want = got
					continue
				}
				compareBounds(t, fmt.Sprintf("GOMAXPROCS %d", procs), got, want)
			}
			serial := o
			serial.Exact, serial.Expected = unforkable{exact}, unforkable{expected}
			compareBounds(t, "unforkable values", boundsOf(serial, exact, expected), want)
		})
	}
}

// TestTolRunIsTol: ThreeWay's tolerance of a run of elements is each
// element's Tol, bit for bit, whatever row and column the run starts and
// ends in: for outputs of rows, of unit axes and 1-D, with a kernel's own
// noise and without, with no floor (expected is exact), with NaN and
// infinities among the values.
func TestTolRunIsTol(t *testing.T) {
	for _, tc := range []struct {
		name             string
		shape            []int
		noise, floorless bool
	}{
		{"rows", []int{130, 96}, false, false},
		{"rows, noise", []int{130, 96}, true, false},
		{"rows, no floor", []int{130, 96}, false, true},
		{"unit axes", []int{1, 70, 1, 48}, false, false},
		{"1-D", []int{9001}, false, false},
		{"1-D, noise", []int{9001}, true, false},
		{"1-D, no floor", []int{9001}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := tensor.NumElements(tc.shape)
			r := rand.New(rand.NewPCG(8, uint64(n)))
			exact, expected, noise := make(kernel.Dense, n), make(kernel.Dense, n), make(kernel.Dense, n)
			for i := range exact {
				exact[i] = r.NormFloat64() * math.Exp2(float64(r.IntN(20)-10))
				expected[i] = exact[i] * (1 + r.NormFloat64()*0x1p-9)
				if tc.floorless {
					expected[i] = exact[i]
				}
				noise[i] = math.Abs(exact[i]) * 0x1p-10
			}
			exact[n/3], expected[n/2], exact[n-1] = math.NaN(), math.Inf(1), math.Inf(-1)
			o := kernel.Output{Name: "y", Shape: tc.shape, DType: tensor.BF16, Exact: exact, Expected: expected, Mode: kernel.Numeric, Reduction: 512}
			if tc.noise {
				o.Noise = noise
			}
			b := ThreeWay{}.Bounds(context.Background(), o, o.DType)
			if b.TolRun == nil {
				t.Fatal("ThreeWay gives no TolRun")
			}
			// runs of several lengths, from the first element on and from
			// an element inside a row
			for _, start := range []int{0, 37} {
				for lo, k := start, 0; lo < n; k++ {
					m := min([]int{1, 7, 95, 300, 4096}[k%5], n-lo)
					got := make([]float64, m)
					b.TolRun(lo, exact[lo:lo+m], expected[lo:lo+m], got)
					for q, v := range got {
						i := lo + q
						if want := b.Tol(i, exact[i], expected[i]); math.Float64bits(v) != math.Float64bits(want) {
							t.Fatalf("run [%d, %d): element %d's tolerance %v, Tol %v", lo, lo+m, i, v, want)
						}
					}
					lo += m
				}
			}
		})
	}
}

func compareBounds(t *testing.T, what string, got, want boundsBits) {
	t.Helper()
	if got.agg != want.agg {
		t.Errorf("%s: aggregate bits %x, at GOMAXPROCS 1 %x", what, got.agg, want.agg)
	}
	if got.explanation != want.explanation {
		t.Errorf("%s: explanation %q, at GOMAXPROCS 1 %q", what, got.explanation, want.explanation)
	}
	for i := range got.tol {
		if got.tol[i] != want.tol[i] {
			t.Errorf("%s: element %d's tolerance %v, at GOMAXPROCS 1 %v", what, i, math.Float64frombits(got.tol[i]), math.Float64frombits(want.tol[i]))
			return
		}
	}
}

// plainValues hides every capability of a Values but Len and At: no
// Settler, no Fork, no block reads.
type plainValues struct{ v kernel.Values }

func (p plainValues) Len() int         { return p.v.Len() }
func (p plainValues) At(i int) float64 { return p.v.At(i) }

// TestBoundsSettledRunsLikeValues: ThreeWay's passes over the runs a
// cache reference vouches for as bytes (kernel.Settler), read from the
// codes, give the bits the same passes give reading every value: the
// aggregates, the explanation and every element's tolerance, for every
// cache layout written or gathered, with the NaN, infinity, subnormals
// and -0 the test caches hold, at GOMAXPROCS 1 and 8.
func TestBoundsSettledRunsLikeValues(t *testing.T) {
	outs := map[string]func(*testing.T, *rand.Rand) kernel.Output{}
	for _, kind := range []string{"bf16", "fp16", "fp8_e4m3", "fp8_ds_mla", "fp8_ds_mla_model1"} {
		outs["write/"+kind+"/u8"] = func(t *testing.T, r *rand.Rand) kernel.Output { return cacheWriteOutput(t, r, kind, true) }
		if kind != "fp8_ds_mla_model1" { // no gather reads it
			outs["gather/"+kind] = func(t *testing.T, r *rand.Rand) kernel.Output { return cacheGatherOutput(t, r, kind, "", 0.02) }
		}
	}
	outs["write/fp8_e4m3/typed"] = func(t *testing.T, r *rand.Rand) kernel.Output { return cacheWriteOutput(t, r, "fp8_e4m3", false) }
	settledSeen := 0
	for name, mk := range outs {
		o := mk(t, rand.New(rand.NewPCG(5, uint64(len(name)))))
		for p := 0; p < o.Exact.Len(); {
			_, b, m := settledRun(o.Exact, o.Expected, p, o.Exact.Len()-p)
			if b != nil {
				settledSeen++
			}
			p += m
		}
		plain := o
		plain.Exact, plain.Expected = plainValues{o.Exact}, plainValues{o.Expected}
		exact := make(kernel.Dense, o.Exact.Len())
		expected := make(kernel.Dense, o.Exact.Len())
		for i := range exact {
			exact[i], expected[i] = o.Exact.At(i), o.Expected.At(i)
		}
		want := boundsOf(plain, exact, expected)
		for _, procs := range []int{1, 8} {
			prev := runtime.GOMAXPROCS(procs)
			got := boundsOf(o, exact, expected)
			runtime.GOMAXPROCS(prev)
			compareBounds(t, fmt.Sprintf("%s at GOMAXPROCS %d", name, procs), got, want)
		}
	}
	if settledSeen == 0 {
		t.Fatal("no output had a settled run: the test reads no codes")
	}
}

// halfSettled is Dense values of a [rows, cols] output that vouches for
// half of every row as the BF16 bytes b (kernel.Settler), the first half
// of even rows and the second of odd ones: every column mixes settled
// runs and values with a floor, which no cache kernel makes today but the
// passes must add alike.
type halfSettled struct {
	v    kernel.Dense
	b    []byte
	cols int
}

func (h halfSettled) Len() int         { return len(h.v) }
func (h halfSettled) At(i int) float64 { return h.v[i] }
func (h halfSettled) Settled(lo, n int) (tensor.DType, []byte, int) {
	c, half := lo%h.cols, h.cols/2
	end := half // the end of the run lo is in, within its row
	if c >= half {
		end = h.cols
	}
	m := min(n, end-c)
	if settledAt(lo, h.cols) {
		return tensor.BF16, h.b[2*lo : 2*(lo+m)], m
	}
	return "", nil, m
}

// settledAt: element i of a halfSettled output is vouched for as bytes.
func settledAt(i, cols int) bool { return (i%cols < cols/2) == ((i/cols)%2 == 0) }

// TestBoundsMixedSettledRuns: settled runs beside values with a floor in
// the same rows and columns give the bits of reading every value.
func TestBoundsMixedSettledRuns(t *testing.T) {
	const rows, cols = 700, 48
	r := rand.New(rand.NewPCG(9, 9))
	n := rows * cols
	exact, expected := make(kernel.Dense, n), make(kernel.Dense, n)
	codes := tensor.New(tensor.BF16, n)
	for i := range exact {
		codes.SetFloat64(i, r.NormFloat64()*math.Exp2(float64(r.IntN(12)-6)))
		exact[i] = codes.Float64At(i)
		expected[i] = exact[i]
		if !settledAt(i, cols) {
			expected[i] = exact[i] * (1 + r.NormFloat64()*0x1p-8)
		}
	}
	o := kernel.Output{Name: "y", Shape: []int{rows, cols}, DType: tensor.BF16, Reduction: 64,
		Exact: halfSettled{exact, codes.Data, cols}, Expected: halfSettled{expected, codes.Data, cols}}
	plain := o
	plain.Exact, plain.Expected = plainValues{o.Exact}, plainValues{o.Expected}
	want := boundsOf(plain, exact, expected)
	for _, procs := range []int{1, 8} {
		prev := runtime.GOMAXPROCS(procs)
		got := boundsOf(o, exact, expected)
		runtime.GOMAXPROCS(prev)
		compareBounds(t, fmt.Sprintf("GOMAXPROCS %d", procs), got, want)
	}
}

// TestSampledProfileFromTheRecord: an output big enough for the profile
// to sample (signature.SampleRate < 1), with bulk runs (halfSettled),
// judged elements, failures and a NaN, gets the same check, signature and
// profile, bit for bit, from the comparison's record of the sampled and
// failing elements' excess as from the element path, which judges every
// element again.
func TestSampledProfileFromTheRecord(t *testing.T) {
	if testing.Short() {
		t.Skip("2.6 M elements on the element path")
	}
	// With the profile asked for the record starts at element 0; without
	// it, at the first failing chunk (failures from row 2500 on).
	for _, tc := range []struct {
		profile  bool
		firstRow int
	}{{true, 0}, {false, 2500}} {
		t.Run(fmt.Sprintf("profile %v", tc.profile), func(t *testing.T) {
			sampledProfileFromTheRecord(t, tc.profile, tc.firstRow)
		})
	}
}

// recordedOutput is a [5000, 512] BF16 output, 2.6 M elements (the
// profile samples), half of each row in bulk runs (halfSettled), the
// other half judged, every 64th row's first 40 columns failing from row
// firstRow on, and one NaN at row 777.
func recordedOutput(firstRow int) (kernel.Output, *tensor.Tensor) {
	const rows, cols = 5000, 512
	n := rows * cols
	r := rand.New(rand.NewPCG(21, 3))
	exact, expected := make(kernel.Dense, n), make(kernel.Dense, n)
	codes := tensor.New(tensor.BF16, n)
	actual := tensor.New(tensor.BF16, rows, cols)
	for i := range exact {
		codes.SetFloat64(i, r.NormFloat64())
		exact[i] = codes.Float64At(i)
		expected[i] = exact[i]
		v := exact[i]
		if !settledAt(i, cols) {
			expected[i] = exact[i] * (1 + r.NormFloat64()*0x1p-9)
			v = expected[i]
		}
		if row := i / cols; row >= firstRow && row%64 == 0 && i%cols < 40 {
			v += 0.5 // every 64th row's first columns fail
		}
		actual.SetFloat64(i, v)
	}
	actual.SetFloat64(777*cols+300, math.NaN())
	o := kernel.Output{Name: "gathered", Shape: []int{rows, cols}, DType: tensor.BF16, Reduction: 1,
		Exact: halfSettled{exact, codes.Data, cols}, Expected: halfSettled{expected, codes.Data, cols},
		Coords: kernel.Coords{Axes: []kernel.CoordKind{kernel.KindRow, "dim"}, Derived: func(dst []kernel.Coord, idx []int) []kernel.Coord {
			return append(dst, kernel.Coord{Kind: kernel.KindPageOffset, Value: idx[0] % 64})
		}}}
	return o, actual
}

func sampledProfileFromTheRecord(t *testing.T, profile bool, firstRow int) {
	o, actual := recordedOutput(firstRow)
	n := actual.Len()
	want, got := onBothPaths(t, o, actual, Options{Profile: profile})
	if signature.SampleRate(n, signature.DefaultMaxElements) >= 1 || got.bulk == 0 {
		t.Fatalf("%d elements, %d in bulk: the test samples nothing or has no bulk run", n, got.bulk)
	}
	if want.Verdict != Fail || want.Signature == nil {
		t.Fatalf("verdict %s, signature %v: the planted failures are not seen", want.Verdict, want.Signature)
	}
	if diff := cmp.Diff(want.Signature, got.Signature); diff != "" {
		t.Errorf("signature from the record differs (-element path +record):\n%s", diff)
	}

	if profile {
		if diff := cmp.Diff(want.Profile.Coords(), got.Profile.Coords(), cmpopts.EquateNaNs()); diff != "" {
			t.Errorf("profile from the record differs (-element path +record):\n%s", diff)
		}
	}
	wj, _ := json.Marshal(want)
	gj, _ := json.Marshal(got)
	if string(wj) != string(gj) {
		t.Errorf("the check differs (its metrics, worst elements or reason):\n%s\n%s", gj, wj)
	}
}

// TestRecordHoldsTheJudgedExcess: every element the record answers for
// (failing, or in the sample, from the first failing chunk on) reads as
// the bits judging it again gives, and elements before the first failing
// chunk are judged, not read as 0.
func TestRecordHoldsTheJudgedExcess(t *testing.T) {
	if testing.Short() {
		t.Skip("2.6 M elements")
	}
	o, actual := recordedOutput(2500)
	n := actual.Len()
	ctx := context.Background()
	b := DefaultPolicy().Bounds(ctx, o, actual.DType)
	rate := signature.SampleRate(n, signature.DefaultMaxElements)
	tallied := func(o kernel.Output, actual *tensor.Tensor, b Bounds) (*judge, tally) {
		j := newJudge(&o, actual, b)
		j.worstK, j.band = 5, max(b.Band, 1)
		j.sample = signature.NewSample(rate)
		j.record, j.failSeen = true, new(atomic.Bool)
		var tl tally
		if err := j.tallyAll(n, &tl); err != nil {
			t.Fatal(err)
		}
		return j, tl
	}
	// The record reaches the output's end (it holds far less than its
	// cap), however the chunks of the first failing window raced to see
	// the failure: several tallies of an output failing in every chunk
	// from row 2500 on, on many cores.
	func() {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
		dense, denseActual := failingInEveryChunk(5000, 2500)
		db := DefaultPolicy().Bounds(ctx, dense, denseActual.DType)
		for range 8 {
			if _, tl := tallied(dense, denseActual, db); tl.recFrom == 0 || tl.recUpTo != n {
				t.Fatalf("failing in every chunk: record [%d, %d) of %d, %d elements: want it from after the first chunks, which pass, to the last", tl.recFrom, tl.recUpTo, n, len(tl.rec))
			}
		}
	}()
	j, tl := tallied(o, actual, b)
	if tl.recFrom == 0 || tl.recUpTo != n || len(tl.rec) == 0 {
		t.Fatalf("record [%d, %d) of %d, %d elements: want it from after the first chunks, which pass, to the last", tl.recFrom, tl.recUpTo, n, len(tl.rec))
	}
	x := newExcessValues(n, j, &tl)
	plain := newJudge(&o, actual, b)
	checked := 0
	for i := 0; i < n; i++ {
		want := plain.at(i).excess()
		if want <= 1 && !signature.InSample(i, rate) {
			continue
		}
		if got := x.At(i); math.Float64bits(got) != math.Float64bits(want) && !(math.IsNaN(got) && math.IsNaN(want)) {
			t.Fatalf("element %d: excess %v from the record, %v judged again", i, got, want)
		}
		checked++
	}
	clean := 0 // recorded for the sample, not for failing
	for _, r := range tl.rec {
		if r.exc <= 1 {
			clean++
		}
	}
	if clean == 0 {
		t.Fatalf("the record holds none of the sample's clean elements (%d recorded, all failing)", len(tl.rec))
	}
	t.Logf("%d elements read, %d recorded from element %d, %d of them clean", checked, len(tl.rec), tl.recFrom, clean)
}

// countingTol is ThreeWay with its tolerances counted: n, those of one
// element at a time (Bounds.Tol), what a judgement of one element asks
// for; runs, the elements of the runs TolRun gives them for.
type countingTol struct{ n, runs *atomic.Int64 }

func (countingTol) Name() string { return ThreeWay{}.Name() }
func (p countingTol) Bounds(ctx context.Context, o kernel.Output, d tensor.DType) Bounds {
	b := ThreeWay{}.Bounds(ctx, o, d)
	tol, tolRun := b.Tol, b.TolRun
	b.Tol = func(i int, x, e float64) float64 { p.n.Add(1); return tol(i, x, e) }
	b.TolRun = func(lo int, x, e, dst []float64) {
		if p.runs != nil {
			p.runs.Add(int64(len(dst)))
		}
		tolRun(lo, x, e, dst)
	}
	return b
}

// failingInEveryChunk is a [rows, 512] BF16 output (5000 rows: 2.6 M
// elements, which the profile samples) whose actual is its expected value
// but for the first 40 columns of every 8th row from row firstRow on: a
// failure in every chunk of 4096 elements from there.
func failingInEveryChunk(rows, firstRow int) (kernel.Output, *tensor.Tensor) {
	const cols = 512
	n := rows * cols
	r := rand.New(rand.NewPCG(4, 4))
	exact, expected := make(kernel.Dense, n), make(kernel.Dense, n)
	actual := tensor.New(tensor.BF16, rows, cols)
	for i := range exact {
		exact[i] = r.NormFloat64()
		expected[i] = formats.RoundBF16(exact[i])
		v := expected[i]
		if row := i / cols; row >= firstRow && row%8 == 0 && i%cols < 40 {
			v += 0.5
		}
		actual.SetFloat64(i, v)
	}
	return kernel.Output{Name: "y", Shape: []int{rows, cols}, DType: tensor.BF16, Reduction: 1, Exact: exact, Expected: expected}, actual
}

// TestProfilePastTheRecordReadsInWindows: once the record of the excess
// is full, the signature's passes judge the rest of a failing output a
// window at a time on every core, however the record served the reads
// before (it skips the window's last element), and not one element at a
// time: none is judged alone. The check is the element path's.
func TestProfilePastTheRecordReadsInWindows(t *testing.T) {
	if testing.Short() {
		t.Skip("2.6 M elements")
	}
	defer func(c int) { recordCap = c }(recordCap)
	recordCap = 1 << 14
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	o, actual := failingInEveryChunk(5000, 0)
	var alone atomic.Int64
	failsAsOnTheElementPath(t, o, actual, countingTol{n: &alone})
	if k := alone.Load(); k != 0 {
		t.Errorf("%d elements judged one at a time; want every one in a window", k)
	}
}

// failsAsOnTheElementPath checks o's actual with pol on the fast path,
// requires it to fail with a signature, and to give the check the
// element path gives with the default policy (which pol must judge as).
func failsAsOnTheElementPath(t *testing.T, o kernel.Output, actual *tensor.Tensor, pol Policy) {
	t.Helper()
	got, err := Compare(o, actual, pol, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Verdict != Fail || got.Signature == nil {
		t.Fatalf("verdict %s, signature %v: the planted failures are not seen", got.Verdict, got.Signature)
	}
	want, err := Compare(o, actual, nil, Options{ElementPath: true})
	if err != nil {
		t.Fatal(err)
	}
	wj, _ := json.Marshal(want)
	gj, _ := json.Marshal(got)
	if string(wj) != string(gj) {
		t.Errorf("the check differs from the element path's:\n%s\n%s", gj, wj)
	}
}

// TestUnsampledProfileFromTheRecord: an output the profile reads whole
// (under signature.DefaultMaxElements) records every element's excess
// from the window after its first failure, so the signature's passes
// judge no element again but those before: at most the comparison's
// elements and one window more are judged, and the check is the element
// path's.
func TestUnsampledProfileFromTheRecord(t *testing.T) {
	o, actual := failingInEveryChunk(1000, 0)
	n := actual.Len()
	if signature.SampleRate(n, signature.DefaultMaxElements) < 1 {
		t.Fatalf("%d elements: the profile samples them", n)
	}
	var alone, runs atomic.Int64
	failsAsOnTheElementPath(t, o, actual, countingTol{&alone, &runs})
	window := int64(runtime.GOMAXPROCS(0) * parallelChunk)
	if k := alone.Load() + runs.Load(); k > int64(n)+window {
		t.Errorf("%d elements judged for a %d-element output; want at most one window (%d) more", k, n, window)
	}
}

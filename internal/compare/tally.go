package compare

import (
	"bytes"
	"container/heap"
	"math"
	"sync"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/parallel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// tally is what a check's metrics are made of, over one chunk of
// parallelChunk elements (the last one shorter) or over the whole output.
// Every chunk's elements are tallied in index order into a tally of its
// own, and the chunks' tallies are added to the whole in chunk order: the
// sums are one fixed order of additions, whichever goroutine tallied a
// chunk and whatever GOMAXPROCS is, so the chunks can be tallied in
// parallel and still give the same bits.
type tally struct {
	sumErr2, sumRef2, sumA2, sumFloor2, sumE2, sumX2 float64
	// same holds the squares of the chunk's elements whose actual,
	// expected and exact values are the same finite bits (element i in
	// lane i%4): such an element's error and floor are 0, its square is
	// the one it adds to sumRef2, sumA2, sumE2 and sumX2 alike, so one
	// sum of them serves all four, and four lanes let the bulk of a
	// correct output be summed at the speed of its bytes. The element
	// path (Options.ElementPath) judges such elements in full and sums
	// their squares here all the same, so both paths add the same numbers
	// in the same order.
	same                                                         [4]float64
	nJudged, overElems, beyondBand, nanMis, infMis, ovf, excused int
	// bulk counts the elements accounted for in bulk (for the tests)
	bulk                                     int
	maxAbs, maxRel, maxULP, floorMax, maxExc float64
	// maxFinite is the largest finite excess (NaN left out), and fail
	// marks the chunk's elements whose excess is above 1, a bit each
	// (the element at offset k from the chunk's start at word k/64):
	// what the signature would otherwise judge every element again for
	// (signature.Judged). failSet is the whole output's, made from the
	// chunks' on merge once one of them fails.
	maxFinite float64
	fail      [parallelChunk / 64]uint64
	failSet   []uint64
	// rec is the excess of the chunk's elements a profile reads: the
	// failing ones and the clean ones in its sample (signature.InSample),
	// but those of bulk runs, whose excess is 0 (record). The whole
	// output's holds the chunks' from element recFrom up to recUpTo, in
	// index order: from the first chunk with a failing element on (a
	// passing check needs no signature, so it keeps none), or from the
	// start when the profile is asked for (judge.recordAll).
	rec              []recorded
	recFrom, recUpTo int
	// recording: this chunk recorded every element it should (tallyChunk);
	// started, recFull: the whole output's record has begun, has ended
	recording, started, recFull bool
	specials                    [len(specialValues)]Special
	firstSpecial                [len(specialValues)]item
	firstOverflow               item
	worst                       elemHeap
}

// reset empties t for the next chunk, keeping its heap's storage.
func (t *tally) reset() {
	w, r := t.worst.items[:0], t.rec[:0]
	*t = tally{}
	t.worst.items, t.rec = w, r
}

// recorded is one element's excess as the comparison judged it.
type recorded struct {
	i   int
	exc float64
}

// recordCap bounds the excess a comparison records (16 bytes each): past
// it, a profile judges the rest of the output's elements again. A
// variable only so that a test can reach it with a small output.
var recordCap = 1 << 22

// mergeRecord appends chunk c's record, the chunk ending at element hi,
// to t's (merged already: t.overElems counts c's failures) while t's stays
// within recordCap. It begins at the first chunk that recorded once a
// chunk has failed (or at the first with all set), and ends at a chunk
// that did not record or at the cap: the record is every element it
// should hold of [recFrom, recUpTo).
func (t *tally) mergeRecord(c *tally, hi, n int, all bool) {
	if t.recFull {
		return
	}
	if !t.started {
		if !c.recording || !(t.overElems > 0 || all) {
			t.recFrom, t.recUpTo = hi, hi
			return
		}
		t.started = true
		// the most it can hold, at once: no growth, no copies left behind
		t.rec = make([]recorded, 0, min(recordCap, n-t.recFrom))
	} else if !c.recording {
		t.recFull = true
		return
	}
	if len(t.rec)+len(c.rec) > recordCap {
		t.recFull = true
		return
	}
	t.rec = append(t.rec, c.rec...)
	t.recUpTo = hi
}

// sameSum is the chunk's sum of same-bits squares, its lanes added in a
// fixed order.
func (t *tally) sameSum() float64 {
	return (t.same[0] + t.same[1]) + (t.same[2] + t.same[3])
}

// merge adds chunk c's tally to t, the whole output's: called for the
// chunks in index order.
func (t *tally) merge(c *tally, k int) {
	s := c.sameSum()
	t.sumErr2 += c.sumErr2
	t.sumFloor2 += c.sumFloor2
	t.sumRef2 += c.sumRef2 + s
	t.sumA2 += c.sumA2 + s
	t.sumE2 += c.sumE2 + s
	t.sumX2 += c.sumX2 + s
	t.nJudged += c.nJudged
	t.overElems += c.overElems
	t.beyondBand += c.beyondBand
	t.nanMis += c.nanMis
	t.infMis += c.infMis
	if t.ovf == 0 && c.ovf > 0 {
		t.firstOverflow = c.firstOverflow
	}
	t.ovf += c.ovf
	t.excused += c.excused
	t.bulk += c.bulk
	// max propagates a NaN whichever side holds it, as the element-wise
	// updates do, so the chunks' maxima combine to the same value.
	t.maxAbs = max(t.maxAbs, c.maxAbs)
	t.maxRel = max(t.maxRel, c.maxRel)
	t.maxULP = max(t.maxULP, c.maxULP)
	t.floorMax = max(t.floorMax, c.floorMax)
	t.maxExc = max(t.maxExc, c.maxExc)
	t.maxFinite = max(t.maxFinite, c.maxFinite)
	for v := range t.specials {
		ts, cs := &t.specials[v], &c.specials[v]
		if ts.Mismatch == 0 && cs.Mismatch > 0 {
			t.firstSpecial[v] = c.firstSpecial[v]
		}
		ts.Actual += cs.Actual
		ts.Expected += cs.Expected
		ts.Mismatch += cs.Mismatch
	}
	for _, it := range c.worst.items {
		t.push(it, k)
	}
}

// mergeFailing copies chunk c's failing elements, the chunk starting at
// element lo of an output of n, into t's bitmap of the whole output.
func (t *tally) mergeFailing(c *tally, lo, n int) {
	if c.overElems == 0 {
		return
	}
	if t.failSet == nil {
		t.failSet = make([]uint64, (n+63)/64)
	}
	copy(t.failSet[lo>>6:], c.fail[:])
}

// push offers it to the k worst elements.
func (t *tally) push(it item, k int) {
	if k < 0 || (it.exc == 0 && it.err == 0) {
		return
	}
	w := &t.worst
	if w.Len() < k {
		heap.Push(w, it)
	} else if w.less(w.items[0], it) {
		w.items[0] = it
		heap.Fix(w, 0)
	}
}

// add tallies element i, judged (the equivalence rule applied).
func (t *tally) add(j *judge, i int, e *element) {
	if t.recording {
		if x := e.excess(); x > 1 || j.sample.Has(i) {
			t.rec = append(t.rec, recorded{i, x})
		}
	}
	av, ev, xv := e.av, e.ev, e.xv
	if e.special == same {
		// What the general path below adds for such an element: its
		// error, its floor, its ULP distance and its excess are 0 and it
		// is finite, so only its square enters the sums (see same).
		t.same[i&3] += av * av
		t.nJudged++
		return
	}
	// sb: the element path has judged a same-bits element in full, which
	// must come to the same (its square in same, nothing else changed).
	sb := j.elementPath && e.special == numbers && sameBits(av, ev, xv)
	if sb {
		t.same[i&3] += av * av
	}
	if finite(ev) && finite(xv) {
		t.floorMax = max(t.floorMax, math.Abs(ev-xv))
		if !sb {
			t.sumFloor2 += sq(ev - xv)
			t.sumE2 += ev * ev
			t.sumX2 += xv * xv
		}
	}
	if sa, se := specialOf(av), specialOf(ev); sa >= 0 || se >= 0 {
		for v := range t.specials {
			inA, inE := sa == v, se == v
			if inA {
				t.specials[v].Actual++
			}
			if inE {
				t.specials[v].Expected++
			}
			if inA != inE {
				if t.specials[v].Mismatch == 0 {
					t.firstSpecial[v] = item{i, av, ev, xv, math.Abs(av - ev), 0, math.Inf(1)}
				}
				t.specials[v].Mismatch++
			}
		}
	}
	switch e.special {
	case nanMatch, infMatch:
		return
	case nanMismatch, infMismatch, overflow:
		// Judged against expected: the error is NaN or +Inf, and it
		// enters every error metric below (an overflow's against the
		// exact answer, which is the one finite side).
		ref := ev
		switch e.special {
		case nanMismatch:
			t.nanMis++
		case infMismatch:
			t.infMis++
		default:
			ref = xv
			if t.ovf == 0 {
				t.firstOverflow = item{i, av, ev, xv, math.Abs(av - xv), 0, math.Inf(1)}
			}
			t.ovf++
		}
		e.ref, e.err, e.tol, e.exc = ref, math.Abs(av-ref), 0, math.Inf(1)
		if e.ulp, e.ulpOK = j.ulp(av, ev); !e.ulpOK {
			t.maxULP = math.NaN()
		}
	}
	ref, err, tol, exc := e.ref, e.err, e.tol, e.exc
	if e.ulpOK {
		t.maxULP = max(t.maxULP, float64(e.ulp))
	}
	if e.excused {
		t.excused++
	}
	if exc > 1 {
		t.overElems++
		if j.failSeen != nil && !j.failSeen.Load() {
			j.failSeen.Store(true) // from the next window on chunks record (judge.recording)
		}
		t.fail[(i&(parallelChunk-1))>>6] |= 1 << (i & 63)
	}
	if finite(exc) {
		t.maxFinite = max(t.maxFinite, exc)
	}
	if exc > j.band {
		t.beyondBand++
	}
	t.maxExc = max(t.maxExc, exc)
	// An element of smaller excess than the heap's least, once it is
	// full, is one push would refuse (less orders by excess first): most
	// elements of a large output, left without building their item.
	if w := t.worst.items; len(w) == 0 || len(w) < j.worstK || !(exc < w[0].exc) {
		t.push(item{i, av, ev, xv, err, tol, exc}, j.worstK)
	}

	t.maxAbs = max(t.maxAbs, err)
	switch {
	case math.IsNaN(err):
		t.maxRel = math.NaN()
	case ref != 0:
		t.maxRel = max(t.maxRel, err/math.Abs(ref))
	case err > 0:
		t.maxRel = math.Inf(1)
	}
	t.nJudged++
	if sb {
		return // its square is in same
	}
	t.sumErr2 += err * err
	t.sumRef2 += ref * ref
	t.sumA2 += av * av
}

// sameBits reports whether the three values are the same finite float64
// bits: what the fast path accounts for in bulk (rawOf's same).
func sameBits(av, ev, xv float64) bool {
	b := math.Float64bits(av)
	return b == math.Float64bits(ev) && b == math.Float64bits(xv) && finite(av)
}

// run is a stretch of a chunk: bulk when the actual's bytes equal the bytes
// both references vouch for (kernel.Settler) and encode finite values
// only, so that every element in it is the same bits on all three sides;
// otherwise its elements are judged one by one into the chunk's buffer.
type run struct {
	lo, n int
	bulk  bool
}

// chunk is one chunk's work: its elements judged up to the equivalence
// rule (buf, at their offset from lo; a bulk run's are left unjudged
// unless every element was asked for), its runs, and its tally.
type chunk struct {
	lo, hi int
	buf    []element
	runs   []run
	// differs: an element of a general run differs from the reference and
	// the output has an equivalence rule, which must run on the
	// comparison's goroutine; tallied: the chunk's tally is made;
	// record: its tally records (judge.recording), decided for a whole
	// window at once.
	differs, tallied, record bool
	t                        tally
}

// prepare judges chunk [lo, hi) up to the equivalence rule: the bulk runs
// found, the rest judged into c.buf. With elements set, a bulk run's
// elements are written into buf too (as same), for a reader of every
// element's excess (the signature's passes).
func (j *judge) prepare(c *chunk, lo, hi int, elements bool) {
	c.lo, c.hi, c.runs, c.differs, c.tallied = lo, hi, c.runs[:0], false, false
	if cap(c.buf) < hi-lo {
		c.buf = make([]element, hi-lo)
	}
	c.buf = c.buf[:hi-lo]
	for p := lo; p < hi; {
		m, bulk := j.settled(p, hi-p)
		if bulk {
			if elements {
				clear(c.buf[p-lo : p-lo+m])
				for k := range c.buf[p-lo : p-lo+m] {
					c.buf[p-lo+k].special = same
				}
			}
		} else {
			b := c.buf[p-lo : p-lo+m]
			j.rawRun(p, b)
			if j.o.Equivalent != nil {
				for k := range b {
					c.differs = c.differs || b[k].differs && b[k].special == numbers
				}
			}
		}
		if n := len(c.runs); n > 0 && c.runs[n-1].bulk == bulk {
			c.runs[n-1].n += m
		} else {
			c.runs = append(c.runs, run{p, m, bulk})
		}
		p += m
	}
}

// judgedBlock is how many elements prepareTallied judges before it
// tallies them: a block of judged elements (72 bytes each) stays in the
// core's nearest caches between the two, where a chunk's (4096 of them)
// went out to the L2 and came back.
const judgedBlock = 512

// prepareTallied is prepare and then tallyChunk, when nothing will read
// c's elements afterwards (the comparison's own tally) and j may apply
// the output's equivalence rule itself (it has none, it keeps no state,
// or j is the one goroutine): each run of elements is judged a block at
// a time and the block tallied at once, the same additions in the same
// order as tallyChunk makes of the whole chunk.
func (j *judge) prepareTallied(c *chunk, lo, hi int) {
	c.lo, c.hi, c.runs, c.differs = lo, hi, c.runs[:0], false
	if cap(c.buf) < judgedBlock {
		c.buf = make([]element, judgedBlock)
	}
	t := &c.t
	t.reset()
	t.recording = c.record
	for p := lo; p < hi; {
		m, bulk := j.settled(p, hi-p)
		if bulk {
			t.addBulk(j, p, m)
		} else {
			for q := p; q < p+m; q += judgedBlock {
				b := c.buf[:min(judgedBlock, p+m-q)]
				j.rawRun(q, b)
				t.tallyRun(j, q, b)
			}
		}
		p += m
	}
	c.tallied = true
}

// tallyChunk applies the equivalence rule to c's elements and tallies
// them, in index order: on the comparison's goroutine when c.differs.
func (j *judge) tallyChunk(c *chunk) {
	t := &c.t
	t.reset()
	t.recording = c.record
	for _, r := range c.runs {
		if r.bulk {
			t.addBulk(j, r.lo, r.n)
			continue
		}
		t.tallyRun(j, r.lo, c.buf[r.lo-c.lo:r.lo-c.lo+r.n])
	}
	c.tallied = true
}

// addBulk tallies a bulk run, elements lo to lo+n-1 (judge.settled):
// only their squares enter the sums.
func (t *tally) addBulk(j *judge, lo, n int) {
	sz := j.actual.DType.Size()
	bulkSquares(j.actual.DType, j.actual.Data[lo*sz:(lo+n)*sz], lo, &t.same)
	t.nJudged += n
	t.bulk += n
}

// tallyRun applies the equivalence rule to es, elements lo, lo+1, ...
// judged up to it, and tallies them in index order.
func (t *tally) tallyRun(j *judge, lo int, es []element) {
	if j.o.Equivalent != nil || j.elementPath {
		for k := range es {
			j.excuse(lo+k, &es[k])
			t.add(j, lo+k, &es[k])
		}
		return
	}
	t.addRun(j, lo, es)
}

// addRun tallies es, elements lo, lo+1, ... judged on the fast path of an
// output without an equivalence rule (nothing to excuse), as add does one
// by one: every other element goes to add itself, and each stretch of
// numbers elements between them (classify) is tallied by addNumbers.
func (t *tally) addRun(j *judge, lo int, es []element) {
	for a := 0; a < len(es); {
		if es[a].special != numbers {
			t.add(j, lo+a, &es[a])
			a++
			continue
		}
		b := a + 1
		for b < len(es) && es[b].special == numbers {
			b++
		}
		t.addNumbers(j, lo+a, es[a:b])
		a = b
	}
}

// addNumbers tallies es, numbers elements lo, lo+1, ..., as add does one
// by one (nothing is excused), in two passes over them: the six sums, each
// in index order as add makes it, then the maxima, counts, record and
// worst elements, in index order too. Each pass's values stay in
// registers: all of them in one loop were twice the registers there are,
// and the compiler kept most on the stack (issue 17).
func (t *tally) addNumbers(j *judge, lo int, es []element) {
	sumFloor2, sumE2, sumX2 := t.sumFloor2, t.sumE2, t.sumX2
	sumErr2, sumRef2, sumA2 := t.sumErr2, t.sumRef2, t.sumA2
	for k := range es {
		e := &es[k]
		if ev, xv := e.ev, e.xv; finite(xv) { // and ev, a number
			sumFloor2 += sq(ev - xv)
			sumE2 += ev * ev
			sumX2 += xv * xv
		}
		sumErr2 += e.err * e.err
		sumRef2 += e.ref * e.ref
		sumA2 += e.av * e.av
	}
	t.sumFloor2, t.sumE2, t.sumX2 = sumFloor2, sumE2, sumX2
	t.sumErr2, t.sumRef2, t.sumA2 = sumErr2, sumRef2, sumA2

	floorMax, maxULP, maxFinite, maxExc, maxAbs, maxRel := t.floorMax, t.maxULP, t.maxFinite, t.maxExc, t.maxAbs, t.maxRel
	overElems, beyondBand := t.overElems, t.beyondBand
	band, worstK := j.band, j.worstK
	for k := range es {
		e, i := &es[k], lo+k
		exc, err := e.exc, e.err
		if t.recording {
			if exc > 1 || j.sample.Has(i) {
				t.rec = append(t.rec, recorded{i, exc})
			}
		}
		if xv := e.xv; finite(xv) {
			floorMax = max(floorMax, math.Abs(e.ev-xv))
		}
		if e.ulpOK {
			maxULP = max(maxULP, float64(e.ulp))
		}
		if exc > 1 {
			overElems++
			if j.failSeen != nil && !j.failSeen.Load() {
				j.failSeen.Store(true)
			}
			t.fail[(i&(parallelChunk-1))>>6] |= 1 << (i & 63)
		}
		if finite(exc) {
			maxFinite = max(maxFinite, exc)
		}
		if exc > band {
			beyondBand++
		}
		maxExc = max(maxExc, exc)
		if w := t.worst.items; len(w) == 0 || len(w) < worstK || !(exc < w[0].exc) {
			t.push(item{i, e.av, e.ev, e.xv, err, e.tol, exc}, worstK)
		}
		maxAbs = max(maxAbs, err)
		switch ref := e.ref; {
		case math.IsNaN(err):
			maxRel = math.NaN()
		case ref != 0:
			maxRel = max(maxRel, err/math.Abs(ref))
		case err > 0:
			maxRel = math.Inf(1)
		}
	}
	t.floorMax, t.maxULP, t.maxFinite, t.maxExc, t.maxAbs, t.maxRel = floorMax, maxULP, maxFinite, maxExc, maxAbs, maxRel
	t.overElems, t.beyondBand = overElems, beyondBand
	t.nJudged += len(es)
}

// recording reports whether the chunks judged from now on record their
// excess: once some chunk has failed (or from the start, when the
// profile is asked for), so that a check that passes keeps no record and
// pays no hash an element for one. A window's chunks are tallied at once,
// so the window decides for all of them, before any is judged: were each
// to decide, a chunk that saw another's failure would record beside one
// that had not, and the record, which must be every element it should
// hold of a range, would end where it began (mergeRecord).
func (j *judge) recording() bool {
	return j.record && (j.recordAll || j.failSeen.Load())
}

// settled returns the run of elements from lo on (at most n) that settled
// reports on both references alike, and whether the actual's bytes equal
// theirs there and encode finite values only. The element path never
// takes it.
func (j *judge) settled(lo, n int) (int, bool) {
	if j.elementPath || j.sx == nil {
		return n, false
	}
	dx, bx, mx := j.sx.Settled(lo, n)
	de, be, me := j.se.Settled(lo, n)
	m := max(min(mx, me, n), 1)
	d := j.actual.DType
	if bx == nil || be == nil || dx != d || de != d {
		return m, false
	}
	sz := d.Size()
	if len(bx) < m*sz || len(be) < m*sz {
		return m, false // a Settler that breaks its contract vouches for nothing
	}
	a := j.actual.Data[lo*sz : (lo+m)*sz]
	bx, be = bx[:m*sz], be[:m*sz]
	if !bytes.Equal(a, bx) || (&bx[0] != &be[0] && !bytes.Equal(a, be)) {
		return m, false
	}
	return m, allFinite(d, a)
}

// bulkDTypes are the dtypes whose settled runs are accounted for in bulk:
// those of the caches (and of a gather of a 16-bit cache).
func bulkDType(d tensor.DType) bool {
	switch d {
	case tensor.BF16, tensor.F16, tensor.F8E4M3, tensor.U8:
		return true
	}
	return false
}

// allFinite reports whether every value b holds (dtype d) is finite.
func allFinite(d tensor.DType, b []byte) bool {
	switch d {
	case tensor.BF16:
		return finite16(b, bf16Exponent)
	case tensor.F16:
		return finite16(b, f16Exponent)
	case tensor.F8E4M3:
		for _, c := range b {
			if c&0x7F == 0x7F { // E4M3FN's NaN, its one special value
				return false
			}
		}
		return true
	case tensor.U8:
		return true
	}
	return false
}

// bulkSquares adds the square of every value b holds (dtype d, finite:
// allFinite), the first being element i0, to lanes[i%4] in index order,
// the same additions tally.add makes one element at a time.
func bulkSquares(d tensor.DType, b []byte, i0 int, lanes *[4]float64) {
	switch d {
	case tensor.BF16:
		n := len(b) / 2
		k := 0
		for ; k < n && (i0+k)&3 != 0; k++ {
			v := float64(math.Float32frombits(uint32(b[2*k])<<16 | uint32(b[2*k+1])<<24))
			lanes[(i0+k)&3] += v * v
		}
		l0, l1, l2, l3 := lanes[0], lanes[1], lanes[2], lanes[3]
		for ; k+4 <= n; k += 4 {
			q := b[2*k : 2*k+8]
			v0 := float64(math.Float32frombits(uint32(q[0])<<16 | uint32(q[1])<<24))
			v1 := float64(math.Float32frombits(uint32(q[2])<<16 | uint32(q[3])<<24))
			v2 := float64(math.Float32frombits(uint32(q[4])<<16 | uint32(q[5])<<24))
			v3 := float64(math.Float32frombits(uint32(q[6])<<16 | uint32(q[7])<<24))
			l0 += v0 * v0
			l1 += v1 * v1
			l2 += v2 * v2
			l3 += v3 * v3
		}
		lanes[0], lanes[1], lanes[2], lanes[3] = l0, l1, l2, l3
		for ; k < n; k++ {
			v := float64(math.Float32frombits(uint32(b[2*k])<<16 | uint32(b[2*k+1])<<24))
			lanes[(i0+k)&3] += v * v
		}
	case tensor.F16:
		tab := decodeTable(d)
		n := len(b) / 2
		for k := 0; k < n; k++ {
			v := tab[uint16(b[2*k])|uint16(b[2*k+1])<<8]
			lanes[(i0+k)&3] += v * v
		}
	default:
		tab := decodeTable(d)
		for k, c := range b {
			v := tab[c]
			lanes[(i0+k)&3] += v * v
		}
	}
}

var (
	decodeOnce   [2]sync.Once
	decodeTables [2][]float64 // F16 by code, F8E4M3 by code
)

// decodeTable is every code's value as tensor.Float64At decodes it, for
// F16, F8E4M3 and U8 (built once: the bulk path decodes each element by
// a lookup, to the same bits).
func decodeTable(d tensor.DType) []float64 {
	k, codes := 1, 1<<8
	switch d {
	case tensor.F16:
		k, codes = 0, 1<<16
	case tensor.U8:
		return u8Values[:]
	}
	decodeOnce[k].Do(func() {
		t := tensor.New(d, codes)
		for c := 0; c < codes; c++ {
			if codes == 1<<8 {
				t.Data[c] = byte(c)
			} else {
				t.Data[2*c], t.Data[2*c+1] = byte(c), byte(c>>8)
			}
		}
		tab := make([]float64, codes)
		for c := range tab {
			tab[c] = t.Float64At(c)
		}
		decodeTables[k] = tab
	})
	return decodeTables[k]
}

var u8Values = func() (v [256]float64) {
	for c := range v {
		v[c] = float64(c)
	}
	return
}()

// window is chunks of consecutive elements judged by several goroutines at
// once, one chunk a fork: elements [lo, hi).
type window struct {
	forks  []*judge
	chunks []chunk
	lo, hi int
	// full: every element of the window is judged into its chunk's
	// buffer (Compare's tally leaves a bulk run's unjudged)
	full bool
}

// fill judges the chunks from lo on, one for each fork, up to n, and
// tallies those that need no equivalence rule; with elements set, every
// element is judged into its chunk's buffer (for the signature's reads),
// and nothing is tallied.
func (w *window) fill(lo, n int, elements bool) {
	w.lo, w.hi, w.full = lo, min(n, lo+len(w.forks)*parallelChunk), elements
	for k := range w.chunks {
		w.chunks[k].lo, w.chunks[k].hi = 0, 0
	}
	// A fork's panic (a fault reading a capture that shrank) is raised
	// again by Wait, on the comparison's goroutine (reference/parallel).
	var forks parallel.Group
	record := w.forks[0].recording()
	for k, f := range w.forks {
		a := lo + k*parallelChunk
		if a >= w.hi {
			break
		}
		c := &w.chunks[k]
		c.record = record
		b := min(a+parallelChunk, w.hi)
		forks.Go(func() {
			if !elements && (f.o.Equivalent == nil || f.o.EquivalentConcurrent) {
				f.prepareTallied(c, a, b)
				return
			}
			f.prepare(c, a, b, elements)
			if !elements && !c.differs {
				f.tallyChunk(c)
			}
		})
	}
	forks.Wait()
}

// element returns element i of the window, judged up to the equivalence
// rule (fill with elements set).
func (w *window) element(i int) *element {
	k := (i - w.lo) / parallelChunk
	c := &w.chunks[k]
	return &c.buf[i-c.lo]
}

// tallyAll tallies every element of the output into t, a chunk at a time
// and in chunk order: on every core when the output's values can be read
// from several goroutines (kernel.Fork), the equivalence rule applied on
// this one. It stops between chunks once j.ctx is done and returns its
// error.
func (j *judge) tallyAll(n int, t *tally) error {
	w := j.window(n)
	if w == nil {
		var c chunk
		for lo := 0; lo < n; lo += parallelChunk {
			if err := j.ctx.Err(); err != nil {
				return err
			}
			c.record = j.recording()
			j.prepareTallied(&c, lo, min(lo+parallelChunk, n))
			t.merge(&c.t, j.worstK)
			t.mergeFailing(&c.t, lo, n)
			t.mergeRecord(&c.t, min(lo+parallelChunk, n), n, j.recordAll)
		}
		return nil
	}
	for lo := 0; lo < n; lo = w.hi {
		if err := j.ctx.Err(); err != nil {
			return err
		}
		w.fill(lo, n, false)
		for k := range w.chunks {
			c := &w.chunks[k]
			if c.hi == c.lo {
				break
			}
			if !c.tallied {
				j.tallyChunk(c) // with the equivalence rule, on this goroutine
			}
			t.merge(&c.t, j.worstK)
			t.mergeFailing(&c.t, c.lo, n)
			t.mergeRecord(&c.t, c.hi, n, j.recordAll)
		}
	}
	return nil
}

// settlers returns o's references as kernel.Settlers when both are one and
// the actual's dtype is one the bulk path decodes.
func settlers(o *kernel.Output, d tensor.DType) (kernel.Settler, kernel.Settler) {
	sx, ok1 := o.Exact.(kernel.Settler)
	se, ok2 := o.Expected.(kernel.Settler)
	if !ok1 || !ok2 || !bulkDType(d) {
		return nil, nil
	}
	return sx, se
}

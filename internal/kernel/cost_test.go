package kernel

import "testing"

// The closed forms of a run of default contexts agree with the same
// contexts as a list, summed one by one.
func TestContextRunSums(t *testing.T) {
	for first := int64(1); first <= 40; first += 3 {
		for n := int64(0); n <= 70; n += 7 {
			run := Contexts{First: first, N: n}
			list := Contexts{List: []int64{}}
			for i := int64(0); i < n; i++ {
				list.List = append(list.List, first+i)
			}
			for page := int64(1); page <= 17; page += 4 {
				rt, rm := run.Blocks(page)
				lt, lm := list.Blocks(page)
				if rt != lt || rm != lm {
					t.Errorf("first %d, n %d, page %d: blocks %d (most %d), want %d (most %d)", first, n, page, rt, rm, lt, lm)
				}
			}
			for _, capacity := range []int64{0, 1, first, first + n/2, first + n, Saturated} {
				rt, rl := run.Tokens(capacity)
				lt, ll := list.Tokens(capacity)
				if rt != lt || rl != ll {
					t.Errorf("first %d, n %d, capacity %d: tokens %d (longest %d), want %d (longest %d)", first, n, capacity, rt, rl, lt, ll)
				}
			}
			if run.Count() != list.Count() {
				t.Errorf("first %d, n %d: count %d, want %d", first, n, run.Count(), list.Count())
			}
		}
	}
}

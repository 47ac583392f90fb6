package bisect

import "testing"

func TestSearch(t *testing.T) {
	for _, tc := range []struct {
		lo, hi, first, want int
	}{
		{1, 10, 7, 7}, {1, 10, 1, 1}, {1, 10, 10, 10}, {1, 10, 11, 11}, {1, 1, 1, 1}, {1, 1, 2, 2},
	} {
		probes := 0
		got, err := Search(tc.lo, tc.hi, func(n int) (bool, error) { probes++; return n >= tc.first, nil })
		if err != nil || got != tc.want {
			t.Errorf("Search(%d, %d) with first bad %d = %d, %v; want %d", tc.lo, tc.hi, tc.first, got, err, tc.want)
		}
		if probes > 5 { // 1 + ceil(log2 10)
			t.Errorf("Search(%d, %d) probed %d times", tc.lo, tc.hi, probes)
		}
	}
}

package cuda

import "testing"

func TestMLASplits(t *testing.T) {
	tests := []struct {
		name             string
		base, wave, maxS int
		want             int
	}{
		// 2 CTAs a split on 132 SMs x 1: 66 splits fill the wave exactly,
		// but the cap is 5 (a 259-token context, 2 tiles a split).
		{"capped by the context", 2, 132, 5, 5},
		// 4 CTAs a split, 132 a wave, up to 64 splits: 33 splits fill one
		// wave (efficiency 1); 29 (116/132 = 88%) is the first within 85%.
		{"one full wave", 4, 132, 64, 29},
		// 64 CTAs a split on a 132-CTA wave: 2 splits are 128/132 = 97%.
		{"two splits nearly fill the wave", 64, 132, 64, 2},
		// base already fills 80% of a wave: no split.
		{"base fills the wave", 110, 132, 64, 1},
		{"one split allowed", 4, 132, 1, 1},
		// 3 CTAs a split, 8 a wave, up to 4: efficiencies 3/8, 6/8, 9/16, 12/16;
		// the best is 0.75 and 2 splits reach it first.
		{"partial waves", 3, 8, 4, 2},
	}
	for _, tc := range tests {
		if got := mlaSplits(tc.base, tc.wave, tc.maxS); got != tc.want {
			t.Errorf("%s: mlaSplits(%d, %d, %d) = %d, want %d", tc.name, tc.base, tc.wave, tc.maxS, got, tc.want)
		}
	}
	for base := 1; base < 300; base += 7 {
		for maxS := 1; maxS <= 64; maxS += 9 {
			if s := mlaSplits(base, 132, maxS); s < 1 || s > maxS {
				t.Fatalf("mlaSplits(%d, 132, %d) = %d, outside [1, %d]", base, maxS, s, maxS)
			}
		}
	}
}

package cuda

// Sizes shared by the launcher (tag cuda) and the tests (no tag).

const (
	mlaD, mlaL = 576, 512
	mlaBN      = 32  // tokens a tile (MLA_BN in mla_decode.cu)
	dsEntry    = 656 // bytes of an fp8_ds_mla token
)

// mlaSmemBytes mirrors MlaSmem<MT, STAGES, CACHE>::total of mla_decode.cu:
// padded Q rows, STAGES raw tiles (bf16: padded bf16 tiles), one converted
// bf16 tile for FP8 caches, the P tile, the max/sum partials and the
// token-validity table.
func mlaSmemBytes(mt, stages int, kind string) int {
	const stride = (mlaD + 8) * 2 // bytes of a padded bf16 row
	rows := 16 * mt
	kTile := mlaBN * stride
	raw, conv := kTile, 0
	switch kind {
	case "fp8_e4m3":
		raw, conv = mlaBN*mlaD, kTile
	case "fp8_ds_mla":
		raw, conv = mlaBN*dsEntry, kTile
	}
	return rows*stride + stages*raw + conv + rows*(mlaBN+8)*2 + 2*4*rows*4 + stages*mlaBN*4
}

// mlaSplits is the split count of an MLA decode launch of base CTAs a split
// on a device running wave CTAs at once, at most maxS splits. A launch
// whose last wave is partly empty wastes the rest of it, so the count is
// chosen by wave efficiency, total / (waves * wave): with base already
// filling most of a wave, no split; otherwise the smallest count whose
// efficiency is within 85% of the best count's (more splits cost the
// combine and the partials' traffic, so ties go to fewer).
func mlaSplits(base, wave, maxS int) int {
	if base < 1 || wave < 1 || maxS <= 1 || 5*base >= 4*wave {
		return 1
	}
	eff := func(s int) float64 {
		total := base * s
		waves := (total + wave - 1) / wave
		return float64(total) / float64(waves*wave)
	}
	best := 0.0
	for s := 1; s <= maxS; s++ {
		best = max(best, eff(s))
	}
	for s := 1; s <= maxS; s++ {
		if eff(s) >= 0.85*best {
			return s
		}
	}
	return maxS
}

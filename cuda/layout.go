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

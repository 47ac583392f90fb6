package kernel

// What the coordinates that name an element mean, for a reader of a
// report: "token -1" or "part 0" beside a failing element says nothing to
// someone who has not read the kernel's adapter. One meaning a name: the
// kernels use the names alike (internal/signature keys its patterns on
// them too). Names that say it all (request, head, page, block, latent,
// split...) have none.
var coordMeanings = map[string]string{
	"part":           "region of the cache entry, 0 latent, 1 fp8_ds_mla scales, 2 rope",
	"token":          "position in its request; -1: no token is written to the entry, which must keep cache_before",
	"row":            "output row (a gather's: the requests' tokens one after another)",
	"dim":            "value within the row, latent then rope",
	"q_pos":          "query token among the request's s_q",
	"context_len":    "the request's seq_len (sparse: the slots the query attends)",
	"visible":        "tokens the row attends (causal rows see fewer)",
	"last_page_fill": "visible mod page_size, 0 on a page boundary",
	"head_tile":      "(q_pos·H + head) / 64, the 64-row tile of the query block",
	"tile128":        "128-wide tile (of rows for NVFP4, of latent columns for attention)",
	"col_tile128":    "128-column tile",
	"block16":        "16-element block sharing one NVFP4 scale",
	"nibble":         "half of the byte the FP4 code is in, 0 low, 1 high",
	"padding":        "1 in the padding of the swizzled scale layout",
	"split_start":    "first token of the split",
	"split_len":      "tokens in the split",
	"splits_used":    "splits of the row that are not empty",
}

// CoordMeaning says what a coordinate name means ("" for a name that says
// it itself).
func CoordMeaning(name string) string { return coordMeanings[name] }

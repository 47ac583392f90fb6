package kernel

// CoordKind is what a coordinate of an output element is: a request, a
// head, a page offset, a split, a scale block... The kind is the
// coordinate's name in reports and JSON, and it is what internal/signature
// keys its patterns on (a concentration on a page_offset is a paged-lookup
// bug, one on a split a split-K bug), so that a name merely containing
// "split" (splits_used) is not taken for a split boundary. Every kind a
// kernel names must be one of the constants below (internal/check's
// TestCoordinatesExplained probes every kernel's outputs), so a new kind
// is declared here, once, with its meaning, and signature decides
// deliberately what it stands for.
type CoordKind string

// The coordinate kinds. Axis kinds name an output's dimensions; the rest
// are derived from an element's position (and the problem's geometry).
const (
	// generic positions
	KindRow    CoordKind = "row"
	KindColumn CoordKind = "column"
	KindCol    CoordKind = "col"
	KindDim    CoordKind = "dim"
	KindByte   CoordKind = "byte"
	KindRank   CoordKind = "rank"

	// requests and tokens
	KindRequest      CoordKind = "request"
	KindQPos         CoordKind = "q_pos"
	KindToken        CoordKind = "token"
	KindContextLen   CoordKind = "context_len"
	KindVisible      CoordKind = "visible"
	KindLastPageFill CoordKind = "last_page_fill"

	// heads and the latent dimension
	KindHead      CoordKind = "head"
	KindHeadGroup CoordKind = "head_group"
	KindHeadTile  CoordKind = "head_tile"
	KindLatent    CoordKind = "latent"

	// the paged cache
	KindBlock      CoordKind = "block"
	KindPage       CoordKind = "page"
	KindPageOffset CoordKind = "page_offset"
	KindPart       CoordKind = "part"

	// split-K
	KindSplit      CoordKind = "split"
	KindSplitStart CoordKind = "split_start"
	KindSplitLen   CoordKind = "split_len"
	KindSplitsUsed CoordKind = "splits_used"

	// NVFP4 layouts
	KindTile128    CoordKind = "tile128"
	KindColTile128 CoordKind = "col_tile128"
	KindScaleBlock CoordKind = "block16"
	KindNibble     CoordKind = "nibble"
	KindPadding    CoordKind = "padding"
	KindScaleRow   CoordKind = "sf_row"
	KindScaleCol   CoordKind = "sf_col"

	// KindParity is the parity of the index along an output's last axis,
	// which internal/signature adds itself (named "<axis>%2") where the
	// kernel names no nibble.
	KindParity CoordKind = "parity"
)

// coordMeanings says what each kind means, for a reader of a report:
// "token -1" or "part 0" beside a failing element says nothing to someone
// who has not read the kernel's adapter. "" for a kind whose name says it
// all. Its keys are the declared kinds.
var coordMeanings = map[CoordKind]string{
	KindRow:    "output row (a gather's: the requests' tokens one after another)",
	KindColumn: "",
	KindCol:    "",
	KindDim:    "value within the row, latent then rope",
	KindByte:   "",
	KindRank:   "",

	KindRequest:      "",
	KindQPos:         "query token among the request's s_q",
	KindToken:        "position in its request; -1: no token is written to the entry, which must keep cache_before",
	KindContextLen:   "the request's seq_len (sparse: the slots the query attends)",
	KindVisible:      "tokens the row attends (causal rows see fewer)",
	KindLastPageFill: "visible mod page_size, 0 on a page boundary",

	KindHead:      "",
	KindHeadGroup: "",
	KindHeadTile:  "(q_pos·H + head) / 64, the 64-row tile of the query block",
	KindLatent:    "",

	KindBlock:      "",
	KindPage:       "",
	KindPageOffset: "",
	KindPart:       "region of the cache entry, 0 latent, 1 fp8_ds_mla scales, 2 rope",

	KindSplit:      "",
	KindSplitStart: "first token of the split",
	KindSplitLen:   "tokens in the split",
	KindSplitsUsed: "splits of the row that are not empty",

	KindTile128:    "128-wide tile (of rows for NVFP4, of latent columns for attention)",
	KindColTile128: "128-column tile",
	KindScaleBlock: "16-element block sharing one NVFP4 scale",
	KindNibble:     "half of the byte the FP4 code is in, 0 low, 1 high",
	KindPadding:    "1 in the padding of the swizzled scale layout",
	KindScaleRow:   "",
	KindScaleCol:   "",

	KindParity: "",
}

// Declared reports whether k is one of the kinds above.
func (k CoordKind) Declared() bool {
	_, ok := coordMeanings[k]
	return ok
}

// Meaning says what a coordinate of kind k means ("" for a kind whose name
// says it, or one not declared).
func (k CoordKind) Meaning() string { return coordMeanings[k] }

// CoordMeaning says what a coordinate name means ("" for a name that says
// it itself): a report knows a coordinate by the name its JSON holds.
func CoordMeaning(name string) string { return coordMeanings[CoordKind(name)] }

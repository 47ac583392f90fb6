package kvcache

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/faults"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/kernels/paged"
	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// KV-cache faults (stage cache). Most live in the writer, where the
// simulated decoder meets them every step; the read-side ones also plant
// the gather.
//
// A write kernel that derives slots from the page table itself (FlashInfer's
// append_paged_kv_cache takes the page table, batch indices and positions
// rather than a slot mapping) gets those as extra tensors named
// engine.block_table, engine.batch_indices and engine.positions. The
// reference ignores them (the contract writes through slot_mapping); the
// simulated decoder passes them so that table-indexing bugs can be planted
// on the write side.

const (
	// engineBlockTable, engineBatch and enginePositions are the extra
	// inputs of a page-table-driven write (see above).
	engineBlockTable = "engine.block_table"
	engineBatch      = "engine.batch_indices"
	enginePositions  = "engine.positions"
	// int32LimitParam scales the int32 overflow threshold (bytes; default
	// 2^31) so that a small cache can show it. Only the fault reads it.
	int32LimitParam = "kcheck.fault.int32_limit"
)

var writeKernel = []string{"kv_cache_write"}

// kvCase is a quick cache case for triggers: two requests over pages of 16
// (L = 32, R = 16 unless the dtype fixes them).
func kvCase(kern, dtype string, params map[string]string) cases.Case {
	c := cases.Case{Name: "trigger/" + kern, Kernel: kern, KVCacheDType: dtype, PageSize: 16,
		SeqLens: []int{37, 20}, Seed: 102, Params: params}
	if dtype != "fp8_ds_mla" {
		c.Latent, c.Rope = 32, 16
	}
	return c
}

// f32Scalar is an F32 tensor of shape [].
func f32Scalar(v float64) *tensor.Tensor {
	return tensor.FromFloat64s(tensor.F32, []int{}, []float64{v})
}

// scalarOf reads the single value of a [] or [1] tensor, naming it on error.
func scalarOf(in map[string]*tensor.Tensor, name string) (float64, error) {
	t, ok := in[name]
	if !ok {
		return 0, fmt.Errorf("tensor %s is missing", name)
	}
	v, err := t.Scalar()
	if err != nil {
		return 0, fmt.Errorf("tensor %s: %v", name, err)
	}
	return v, nil
}

// withSlots replaces slot_mapping by slots. Where two tokens now aim at one
// slot, the later one wins and the earlier is dropped (a GPU race the last
// writer wins here; the reference writer refuses duplicates).
func withSlots(in map[string]*tensor.Tensor, slots []int64) {
	last := map[int64]int{}
	for i, s := range slots {
		if s >= 0 {
			last[s] = i
		}
	}
	out := make([]int64, len(slots))
	for i, s := range slots {
		out[i] = s
		if s >= 0 && last[s] != i {
			out[i] = -1
		}
	}
	in["slot_mapping"] = tensor.FromInt64s(tensor.I64, []int{len(out)}, out)
}

func init() {
	faults.Register(&faults.Fault{
		Name: "negative_slot_wraps", Stage: kernel.StageCache, Kernels: writeKernel,
		Needs:    "a padded token (a negative slot_mapping entry)",
		BugClass: "padded tokens' slot -1 written through PyTorch indexing (index_put wraps -1 to the last element) instead of being skipped",
		Doc: "Tokens with slot_mapping = -1 (CUDA-graph padding) are written to slot NB*P-1, the cache's last entry, as " +
			"`cache.view(-1, D)[slot_mapping] = kv` does: whichever sequence owns the last block loses its last token.",
		Inputs: func(in map[string]*tensor.Tensor, p kernel.Params) (map[string]*tensor.Tensor, error) {
			nb, page, _, err := paged.CacheGeometry(in["cache_before"], p, "cache_before")
			if err != nil {
				return nil, err
			}
			slots := faults.Ints(in["slot_mapping"])
			for i, s := range slots {
				if s < 0 && int64(nb*page)+s >= 0 {
					slots[i] = int64(nb*page) + s
				}
			}
			withSlots(in, slots)
			return in, nil
		},
		Trigger: &faults.Trigger{Case: kvCase("kv_cache_write", "bf16", nil)},
		Signatures: []faults.Expect{
			{Tensor: "cache_after", Pattern: "page_boundary", Coord: kernel.KindPageOffset, Why: "the padded token lands in the cache's last entry, offset P-1 of the last block"},
		},
	})
	faults.Register(&faults.Fault{
		Name: "page_boundary_off_by_one", Stage: kernel.StageCache, Kernels: []string{"kv_cache_write", "kv_cache_gather"},
		Needs:    "a token at the start of a page: for the gather a context longer than page_size, for the write a slot that is a multiple of page_size",
		BugClass: "page index computed as (t-1)/P (or block = (slot-1)/P): the token at each page start goes to the previous page",
		Doc: "The writer splits a slot as block = (slot-1)/P, offset = slot%P, so a token at offset 0 of a page lands on offset 0 " +
			"of the block before (overwriting it) and its own entry stays stale; the gather reads token t at block_table[(t-1)/P], " +
			"so every page-start token t >= P comes back as token t-P.",
		Inputs: func(in map[string]*tensor.Tensor, p kernel.Params) (map[string]*tensor.Tensor, error) {
			if _, ok := in["slot_mapping"]; !ok {
				return in, nil
			}
			_, page, _, err := paged.CacheGeometry(in["cache_before"], p, "cache_before")
			if err != nil {
				return nil, err
			}
			slots := faults.Ints(in["slot_mapping"])
			for i, s := range slots {
				if s > 0 && s%int64(page) == 0 {
					slots[i] = s - int64(page)
				}
			}
			withSlots(in, slots)
			return in, nil
		},
		Outputs: func(_ context.Context, in kernel.Inputs, out map[string]*tensor.Tensor) error {
			g, ok := out["gathered"]
			if !ok {
				return nil
			}
			_, page, _, err := paged.CacheGeometry(in.Tensors["cache"], in.Params, "cache")
			if err != nil {
				return err
			}
			g = g.Clone()
			row := g.Shape[1] * g.DType.Size()
			// Rows are chunk-local under seq_starts (block-aligned), so
			// page starts stay at multiples of P; a chunk's first row, whose
			// page before lies outside the gathered rows, is left correct.
			start := 0
			for _, n := range faults.Ints(in.Tensors["seq_lens"]) {
				for t := page; t < int(n); t += page {
					copy(g.Data[(start+t)*row:(start+t+1)*row], g.Data[(start+t-page)*row:(start+t-page+1)*row])
				}
				start += int(n)
			}
			out["gathered"] = g
			return nil
		},
		Trigger: &faults.Trigger{Case: kvCase("kv_cache_write", "bf16", nil)},
		Signatures: []faults.Expect{
			{Tensor: "cache_after", Pattern: "page_boundary", Coord: kernel.KindPageOffset},
			{On: &faults.Trigger{Case: kvCase("kv_cache_gather", "bf16", nil)}, Tensor: "gathered", Pattern: "page_boundary", Coord: kernel.KindPageOffset},
		},
	})
	faults.Register(&faults.Fault{
		Name: "neighbour_block_table_row", Stage: kernel.StageCache, Kernels: []string{"kv_cache_gather", "kv_cache_write"},
		Needs:    "for the gather, requests whose last pages are different blocks; for the write, a page-table-driven write (the engine.block_table, engine.batch_indices and engine.positions inputs)",
		BugClass: "block-table row stride slip: request b's last page looked up in row b+1",
		Doc: "The gather (and a write that derives its slots from the page table) takes request b's last page from the next " +
			"request's row (the last request wraps to row 0; an unused entry reads block 0): the last page's tokens are read " +
			"from, or written into, another sequence's page.",
		Inputs: func(in map[string]*tensor.Tensor, p kernel.Params) (map[string]*tensor.Tensor, error) {
			if bt, ok := in["block_table"]; ok && in["cache"] != nil { // gather
				nb, page, _, err := paged.CacheGeometry(in["cache"], p, "cache")
				if err != nil {
					return nil, err
				}
				lens := faults.Ints(in["seq_lens"])
				starts := make([]int64, len(lens)) // a chunked gather's
				if st, ok := in["seq_starts"]; ok && st.Len() == len(lens) {
					starts = faults.Ints(st)
				}
				tab := faults.Ints(bt)
				B, mb := bt.Shape[0], bt.Shape[1]
				out := append([]int64(nil), tab...)
				for b, n := range lens {
					if n <= 0 || (starts[b]+n-1)/int64(page) >= int64(mb) {
						continue
					}
					last := int(starts[b]+n-1) / page
					out[b*mb+last] = validBlock(tab[((b+1)%B)*mb+last], nb)
				}
				in["block_table"] = tensor.FromInt64s(bt.DType, bt.Shape, out)
				return in, nil
			}
			return neighbourWrite(in, p)
		},
		Trigger: &faults.Trigger{Case: kvCase("kv_cache_gather", "bf16", nil)},
		Signatures: []faults.Expect{
			{Tensor: "gathered", Pattern: "concentrated", Coord: kernel.KindRow, Why: "the last page of one request is read from another's row: rows of one request's last page"},
			{On: &faults.Trigger{Case: kvCase("kv_cache_write", "bf16", nil), Shape: pageTableDriven([]int{37, 20}, 16)}, Tensor: "cache_after", Pattern: "concentrated", Coord: kernel.KindPageOffset, Why: "the last pages' tokens (the first offsets of their pages) land in another request's block, and their own entries keep cache_before: the offsets the last pages fill, no named pattern"},
		},
	})
	faults.Register(&faults.Fault{
		Name: "int32_offset_overflow", Stage: kernel.StageCache, Kernels: writeKernel,
		Needs:    "a cache entry at byte offset 2^31 or beyond (a cache of more than 2 GiB), or a smaller limit in the parameter kcheck.fault.int32_limit",
		BugClass: "cache byte offset slot*entry_bytes computed in int32: it wraps negative past 2 GiB, i.e. at high block ids of a large cache",
		Doc: "A token whose entry starts at byte 2^31 or beyond gets a wrapped (negative) offset: its write lands outside the cache, " +
			"so its slot keeps stale content (an offset that wraps back inside would clobber another entry). Real caches reach " +
			"2^31 bytes at block 29127 (bf16, P = 64); the parameter kcheck.fault.int32_limit lowers the threshold so a small " +
			"cache shows it.",
		Outputs: func(_ context.Context, in kernel.Inputs, out map[string]*tensor.Tensor) error {
			limit, ok, err := in.Params.Float(int32LimitParam)
			if err != nil {
				return err
			}
			if !ok {
				limit = math.Ldexp(1, 31)
			}
			before, after := in.Tensors["cache_before"], out["cache_after"]
			e := int64(paged.EntryBytes(before))
			lim := int64(limit)
			if lim <= 0 {
				return fmt.Errorf("parameter %s = %v: want a positive byte count", int32LimitParam, limit)
			}
			ref := after
			after = after.Clone()
			type move struct{ from, to int64 }
			var moves []move
			for _, s := range faults.Ints(in.Tensors["slot_mapping"]) {
				off := s * e
				if s < 0 || off < lim {
					continue
				}
				copy(after.Data[off:off+e], before.Data[off:off+e]) // never written there
				w := (off+lim)%(2*lim) - lim                        // the narrow int's two's complement
				if w >= 0 && w+e <= int64(len(after.Data)) {
					moves = append(moves, move{off, w})
				}
			}
			for _, m := range moves {
				copy(after.Data[m.to:m.to+e], ref.Data[m.from:m.from+e])
			}
			out["cache_after"] = after
			return nil
		},
		// Entries are 96 bytes (bf16, D = 48) and the cache 5 blocks of 16:
		// a 3072-byte limit puts blocks 2 and up beyond it.
		Trigger:  &faults.Trigger{Case: kvCase("kv_cache_write", "bf16", map[string]string{int32LimitParam: "3072"})},
		Simulate: map[string]string{"set": int32LimitParam + "=65536"},
		Signatures: []faults.Expect{
			{Tensor: "cache_after", Pattern: "uniform", Why: "the wrapped writes land all over the cache"},
		},
	})
	faults.Register(&faults.Fault{
		Name: "fp8_scale_ignored", Stage: kernel.StageCache, Kernels: writeKernel,
		Needs:    "an fp8_e4m3 cache (kv_cache_dtype = fp8_e4m3) with a k_scale other than 1",
		BugClass: "fp8 KV cache written without its k_scale (e4m3(x) instead of e4m3(x / k_scale)), as when a calibrated scale is not loaded and defaults to 1 on the write path only",
		Doc:      "The fp8_e4m3 writer stores e4m3(x) saturating; readers multiply by k_scale, so every cached value comes back scaled by k_scale (or clipped at 448).",
		Inputs: func(in map[string]*tensor.Tensor, p kernel.Params) (map[string]*tensor.Tensor, error) {
			if _, ok := in["k_scale"]; ok && p.String("kv_cache_dtype", "bf16") == "fp8_e4m3" {
				in["k_scale"] = f32Scalar(1)
			}
			return in, nil
		},
		Trigger:  &faults.Trigger{Case: kvCase("kv_cache_write", "fp8_e4m3", nil)},
		Simulate: map[string]string{"kv-cache-dtype": "fp8_e4m3"},
		Signatures: []faults.Expect{
			{Tensor: "cache_after", Pattern: "uniform", Why: "as fp8_scale_applied_twice: every written code, alike"},
		},
	})
	faults.Register(&faults.Fault{
		Name: "fp8_scale_applied_twice", Stage: kernel.StageCache, Kernels: []string{"kv_cache_write", "kv_cache_gather"},
		Needs:    "an fp8_e4m3 cache (kv_cache_dtype = fp8_e4m3) with a k_scale other than 1",
		BugClass: "fp8 KV scale applied twice: a scale folded into the projection and applied again by the cache kernel (x / k_scale^2 stored, or e4m3 * k_scale^2 read)",
		Doc:      "The fp8_e4m3 writer divides by k_scale twice (and the gather multiplies twice), so cached values come back off by a factor k_scale.",
		Inputs: func(in map[string]*tensor.Tensor, p kernel.Params) (map[string]*tensor.Tensor, error) {
			if _, ok := in["k_scale"]; !ok || p.String("kv_cache_dtype", "bf16") != "fp8_e4m3" {
				return in, nil
			}
			k, err := scalarOf(in, "k_scale")
			if err != nil {
				return nil, err
			}
			in["k_scale"] = f32Scalar(float64(float32(k) * float32(k)))
			return in, nil
		},
		Trigger:  &faults.Trigger{Case: kvCase("kv_cache_write", "fp8_e4m3", nil)},
		Simulate: map[string]string{"kv-cache-dtype": "fp8_e4m3"},
		Signatures: []faults.Expect{
			{Tensor: "cache_after", Pattern: "uniform", Why: "every written value is stored with the wrong scale: fp8 codes, so no constant factor between codes"},
			{On: &faults.Trigger{Case: kvCase("kv_cache_gather", "fp8_e4m3", nil)}, Tensor: "gathered", Pattern: "constant_factor"},
		},
	})
	faults.Register(&faults.Fault{
		Name: "kpe_saturated_by_kvc_scale", Stage: kernel.StageCache, Kernels: writeKernel,
		Needs:    "an fp8_e4m3 cache (kv_cache_dtype = fp8_e4m3) and k_pe values beyond the amax of their token's kv_c",
		BugClass: "fp8_e4m3 cache scale derived from kv_c alone: the rope part k_pe, larger than the normalized latent, saturates",
		Doc: "The writer quantizes each token with a scale computed over kv_c only (amax(kv_c)/448), so k_pe values beyond kv_c's " +
			"amax clip at it: positions (rope) stop being encoded once they outgrow the latent.",
		Inputs: func(in map[string]*tensor.Tensor, p kernel.Params) (map[string]*tensor.Tensor, error) {
			if p.String("kv_cache_dtype", "bf16") != "fp8_e4m3" {
				return in, nil
			}
			kvc, kpe := in["kv_c"], in["k_pe"]
			if kvc == nil || kpe == nil || len(kvc.Shape) != 2 || len(kpe.Shape) != 2 {
				return in, nil
			}
			l, r := kvc.Shape[1], kpe.Shape[1]
			c := kpe.Clone()
			for t := 0; t < kvc.Shape[0] && t < kpe.Shape[0]; t++ {
				amax := 0.0
				for j := 0; j < l; j++ {
					amax = math.Max(amax, math.Abs(kvc.Float64At(t*l+j)))
				}
				for j := 0; j < r; j++ {
					if v := c.Float64At(t*r + j); math.Abs(v) > amax {
						c.SetFloat64(t*r+j, math.Copysign(amax, v))
					}
				}
			}
			in["k_pe"] = c
			return in, nil
		},
		Trigger:  &faults.Trigger{Case: kvCase("kv_cache_write", "fp8_e4m3", nil)},
		Simulate: map[string]string{"kv-cache-dtype": "fp8_e4m3"},
		Signatures: []faults.Expect{
			{Tensor: "cache_after", Pattern: "concentrated", Coord: kernel.KindPart, Why: "k_pe (part 2) saturates: a region of the entry"},
		},
	})
	faults.Register(&faults.Fault{
		Name: "ds_mla_scale_convention", Stage: kernel.StageCache, Kernels: writeKernel,
		Needs:    "an fp8_ds_mla cache (kv_cache_dtype = fp8_ds_mla)",
		BugClass: "fp8_ds_mla tile-scale convention mixed up: values quantized with vLLM's amax/448 scale, the scale stored in FlashMLA's power-of-two convention (or the reverse)",
		Doc: "The writer divides each 128-value tile by the scale of the declared ds_mla_scale convention but stores the other " +
			"convention's scale, so a reader (which multiplies by the stored F32) gets the tile back off by up to 2x.",
		Outputs: func(_ context.Context, in kernel.Inputs, out map[string]*tensor.Tensor) error {
			if in.Params.String("kv_cache_dtype", "bf16") != string(kvcache.FP8DSMLA) {
				return nil
			}
			other := kvcache.ScalePow2
			if in.Params.String("ds_mla_scale", string(kvcache.ScaleAmax)) == string(kvcache.ScalePow2) {
				other = kvcache.ScaleAmax
			}
			kvc := in.Tensors["kv_c"]
			after := out["cache_after"].Clone()
			for t, s := range faults.Ints(in.Tensors["slot_mapping"]) {
				if s < 0 {
					continue
				}
				for tile := 0; tile < kvcache.DSTiles; tile++ {
					amax := 0.0
					for j := tile * kvcache.DSTile; j < (tile+1)*kvcache.DSTile; j++ {
						amax = math.Max(amax, math.Abs(kvc.Float64At(t*kvcache.DSLatent+j)))
					}
					off := int(s)*kvcache.DSEntryBytes + kvcache.DSScaleOff + 4*tile
					binary.LittleEndian.PutUint32(after.Data[off:], math.Float32bits(kvcache.TileScale(amax, other)))
				}
			}
			out["cache_after"] = after
			return nil
		},
		Trigger:  &faults.Trigger{Case: kvCase("kv_cache_write", "fp8_ds_mla", nil)},
		Simulate: map[string]string{"kv-cache-dtype": "fp8_ds_mla"},
		Signatures: []faults.Expect{
			{Tensor: "cache_after", Pattern: "concentrated", Coord: kernel.KindPart, Why: "the tile scales (part 1) are stored in the other convention: a region of the entry, no named pattern"},
		},
	})
	faults.Register(&faults.Fault{
		Name: "stale_pages", Stage: kernel.StageCache, Kernels: writeKernel,
		Needs:    "a write over cache entries that are not all zero (recycled pages)",
		BugClass: "recycled pages taken as already holding the tokens (a prefix-cache hit on a freed block): the new sequence's tokens are not written over an earlier sequence's",
		Doc: "The writer skips every slot whose entry is not all zero, as if a populated entry were a cached prefix. A fresh " +
			"(zeroed) cache is written correctly; once a finished sequence's pages are freed and reused, the new sequence " +
			"reads the old one's keys and values.",
		Inputs: func(in map[string]*tensor.Tensor, _ kernel.Params) (map[string]*tensor.Tensor, error) {
			before := in["cache_before"]
			e := paged.EntryBytes(before)
			slots := faults.Ints(in["slot_mapping"])
			for i, s := range slots {
				if s < 0 || int(s+1)*e > len(before.Data) {
					continue
				}
				for _, b := range before.Data[int(s)*e : int(s+1)*e] {
					if b != 0 {
						slots[i] = -1
						break
					}
				}
			}
			withSlots(in, slots)
			return in, nil
		},
		Trigger: &faults.Trigger{Case: kvCase("kv_cache_write", "bf16", nil)},
		Signatures: []faults.Expect{
			{Tensor: "cache_after", Pattern: "unwritten"},
		},
	})
}

// validBlock returns blk when it names a block of the cache, else 0 (an
// unused block-table entry, which engines pad with 0).
func validBlock(blk int64, nb int) int64 {
	if blk < 0 || blk >= int64(nb) {
		return 0
	}
	return blk
}

// neighbourWrite plants the row slip in a page-table-driven write: each
// request's tokens on its last page (in this call) are written through the
// next request's row.
func neighbourWrite(in map[string]*tensor.Tensor, p kernel.Params) (map[string]*tensor.Tensor, error) {
	bt, bi, pos := in[engineBlockTable], in[engineBatch], in[enginePositions]
	if bt == nil || bi == nil || pos == nil {
		return in, nil // a slot-mapping write: nothing to slip on
	}
	nb, page, _, err := paged.CacheGeometry(in["cache_before"], p, "cache_before")
	if err != nil {
		return nil, err
	}
	if len(bt.Shape) != 2 || bi.Len() != pos.Len() {
		return nil, fmt.Errorf("tensors %s %v, %s %v and %s %v disagree", engineBlockTable, bt.Shape, engineBatch, bi.Shape, enginePositions, pos.Shape)
	}
	B, mb := bt.Shape[0], bt.Shape[1]
	tab, batch, at := faults.Ints(bt), faults.Ints(bi), faults.Ints(pos)
	slots := faults.Ints(in["slot_mapping"])
	last := map[int64]int64{}
	for i, b := range batch {
		if slots[i] >= 0 && at[i]/int64(page) > last[b] {
			last[b] = at[i] / int64(page)
		}
	}
	for i, b := range batch {
		pg := at[i] / int64(page)
		if slots[i] < 0 || pg != last[b] || b < 0 || int(b) >= B || int(pg) >= mb {
			continue
		}
		blk := validBlock(tab[((int(b)+1)%B)*mb+int(pg)], nb)
		slots[i] = blk*int64(page) + at[i]%int64(page)
	}
	withSlots(in, slots)
	return in, nil
}

// DeepSeek-V4.1's cache written in the order FlashMLA used before its
// 2026.09.30 release.
func init() {
	faults.Register(&faults.Fault{
		Name: "v41_written_block_split", Stage: kernel.StageCache, Kernels: writeKernel,
		Needs:    "a DeepSeek-V4.1 cache (kv_cache_dtype = fp8_ds_mla_v41) with pages of more than one token",
		BugClass: "DeepSeek-V4.1 cache written in FlashMLA's pre-2026.09.30 block-split order (a page's 512-byte data rows, then its 16-byte scale rows) for a reader of today's interleaved order: the same 528 bytes a token, so nothing refuses it",
		Doc: "The writer puts token t of a block at data offset 512t and scale offset 512P + 16t of its block, as V4.1 " +
			"was laid out before FlashMLA's 2026.09.30 release (vllm 0.33.0 vllm/third_party/flashmla/" +
			"flash_mla_interface.py:123-126: 'a cache written in the old layout is NOT rejected, it is misread').",
		Outputs: func(_ context.Context, in kernel.Inputs, out map[string]*tensor.Tensor) error {
			after, before := out["cache_after"], in.Tensors["cache_before"]
			if after == nil || before == nil || in.Params.String("kv_cache_dtype", "") != string(kvcache.FP8DSMLAV41) ||
				len(after.Shape) != 3 || after.Shape[2] != kvcache.V41EntryBytes || len(before.Data) != len(after.Data) {
				return nil
			}
			lay := kvcache.Layout{Kind: kvcache.FP8DSMLAV41, PageSize: after.Shape[1]}
			r := before.Clone()
			r.DType = after.DType
			for _, s := range faults.Ints(in.Tensors["slot_mapping"]) {
				if s < 0 || int(s) >= after.Shape[0]*after.Shape[1] {
					continue
				}
				for col := 0; col < kvcache.V41EntryBytes; col++ {
					r.Data[lay.OldV41Offset(int(s), col)] = after.Data[int(s)*kvcache.V41EntryBytes+col]
				}
			}
			out["cache_after"] = r
			return nil
		},
		Trigger: &faults.Trigger{Case: cases.Case{Name: "trigger/kv_cache_write/v41", Kernel: "kv_cache_write", Preset: "deepseek-v4",
			KVCacheDType: string(kvcache.FP8DSMLAV41), PageSize: 16, SeqLens: []int{37, 20}, Seed: 105}},
		NotSimulated: "the simulated decoder writes V3-shaped caches, which have no DeepSeek-V4.1 layout",
		Signatures: []faults.Expect{
			{Tensor: "cache_after", Pattern: "v41_written_block_split", Why: "the bytes are all there, in the other order: the kernel's suspect (the write in the old order) names it"},
		},
	})
}

// pageTableDriven adds what a page-table-driven writer reads
// (engine.block_table, engine.batch_indices, engine.positions) to a write
// case: the requests' tokens in order, each page's block read off the slot
// of a token written on it.
func pageTableDriven(seqLens []int, page int) func(in kernel.Inputs) (kernel.Inputs, error) {
	return func(in kernel.Inputs) (kernel.Inputs, error) {
		slots := faults.Ints(in.Tensors["slot_mapping"])
		maxPages := 0
		for _, n := range seqLens {
			maxPages = max(maxPages, (n+page-1)/page)
		}
		table := make([]int64, len(seqLens)*maxPages)
		var batch, pos []int64
		i := 0
		for b, n := range seqLens {
			for t := 0; t < n; t, i = t+1, i+1 {
				batch, pos = append(batch, int64(b)), append(pos, int64(t))
				if slots[i] >= 0 {
					table[b*maxPages+t/page] = slots[i] / int64(page)
				}
			}
		}
		in.Tensors[engineBlockTable] = tensor.FromInt64s(tensor.I32, []int{len(seqLens), maxPages}, table)
		in.Tensors[engineBatch] = tensor.FromInt64s(tensor.I32, []int{len(batch)}, batch)
		in.Tensors[enginePositions] = tensor.FromInt64s(tensor.I32, []int{len(pos)}, pos)
		return in, nil
	}
}

package cuda

import (
	"sort"
	"strconv"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Declared is what one CUDA kernel rounds where (reference/CONTRACTS.md §1.1): the EXPECTED
// reference a check uses for its output. The same facts are written in the
// kernel's .cu file as a `kcheck:precision NAME acc=.. p=.. kv_dequant=..
// fp8_saturate=.. [softmax_block=..]` line, and TestPrecisionMatchesSources
// keeps the two equal.
type Declared struct {
	// Precision is the metadata-visible part (acc_dtype, p_dtype,
	// kv_dequant_dtype, fp8_saturate, softmax_block).
	Precision kernel.Precision
	// UsesP and UsesKV say whether p_dtype and kv_dequant_dtype mean
	// anything for the kernel ("none" in the .cu line otherwise).
	UsesP, UsesKV bool
}

// Precisions lists every contract kernel the CUDA side implements.
var Precisions = map[string]Declared{
	"nvfp4_quantize":    {Precision: prec(tensor.F32, tensor.BF16, tensor.BF16, true)},
	"nvfp4_dequantize":  {Precision: prec(tensor.F32, tensor.BF16, tensor.BF16, true)},
	"nvfp4_gemm":        {Precision: prec(tensor.F32, tensor.BF16, tensor.BF16, true)},
	"kv_cache_write":    {Precision: prec(tensor.F32, tensor.BF16, tensor.BF16, true)},
	"kv_cache_gather":   {Precision: prec(tensor.F32, tensor.BF16, tensor.F32, true), UsesKV: true},
	"mla_decode":        {Precision: mlaPrec(), UsesP: true, UsesKV: true},
	"mla_decode_sparse": {Precision: mlaPrec(), UsesP: true, UsesKV: true},
	"splitk_combine":    {Precision: prec(tensor.F32, tensor.BF16, tensor.BF16, true)},
}

// NoKernel are the contract kernels the CUDA side will not implement,
// with why: a cuda run of one is refused with the reason, before any worker
// starts.
var NoKernel = map[string]string{
	"kv_cache_transfer": "a KV-cache transfer between a prefill and a decode node is a byte copy between their caches (vLLM's NIXL connector, SGLang's disaggregation move raw pages), not a kernel a GPU computes: capture the two caches and their block tables and run kcheck check on the capture",
}

func prec(acc, p, kv tensor.DType, sat bool) kernel.Precision {
	return kernel.Precision{Acc: acc, P: p, KVDequant: kv, FP8Saturate: sat}
}

// mlaSoftmaxBlock is mla_decode.cu's tile (MLA_BN): the kernel rounds P to
// bf16 against a running max it updates every 32 tokens, where FlashMLA
// (and the reference's default) does every 64.
const mlaSoftmaxBlock = 32

func mlaPrec() kernel.Precision {
	p := prec(tensor.F32, tensor.BF16, tensor.BF16, true)
	p.SoftmaxBlock = mlaSoftmaxBlock
	return p
}

// Kernels lists the implemented contract kernels, sorted.
func Kernels() []string {
	names := make([]string, 0, len(Precisions))
	for n := range Precisions {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// metaDType is how metadata spells a precision dtype (reference/CONTRACTS.md §1.1).
var metaDType = map[tensor.DType]string{tensor.F64: "f64", tensor.F32: "f32", tensor.BF16: "bf16", tensor.F16: "f16"}

// PrecisionMeta returns the metadata keys that declare kernel name's
// precision, as the worker writes them into its outputs. saturate is the
// FP8 mode the call ran with (the fp8_saturate parameter; kernels without
// FP8 stores ignore it). ok is false for a kernel the CUDA side lacks.
func PrecisionMeta(name string, saturate bool) (meta map[string]string, ok bool) {
	d, ok := Precisions[name]
	if !ok {
		return nil, false
	}
	meta = map[string]string{"acc_dtype": metaDType[d.Precision.Acc]}
	if d.UsesP {
		meta["p_dtype"] = metaDType[d.Precision.P]
	}
	if d.UsesKV {
		meta["kv_dequant_dtype"] = metaDType[d.Precision.KVDequant]
	}
	if d.Precision.SoftmaxBlock > 0 {
		meta["softmax_block"] = strconv.Itoa(d.Precision.SoftmaxBlock)
	}
	if saturate {
		meta["fp8_saturate"] = "true"
	} else {
		meta["fp8_saturate"] = "false"
	}
	return meta, true
}

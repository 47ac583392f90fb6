package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/mla"
	"github.com/kcheck-dev/kcheck/reference/nvfp4"
	"github.com/kcheck-dev/kcheck/reference/splitk"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Case is one benchmark: a computation at one size.
type Case struct {
	Name   string         // table row and child-process argument
	Kernel string         // numpy_ref.py's function; "" for Go-only rows
	Shape  string         // the size, for the table
	Flops  float64        // nominal floating-point operations of one answer
	Params map[string]any // what the numpy side needs besides the arrays
	Build  func() (*Prepared, error)
}

// Prepared is a case's inputs, generated in memory, and the Go reference
// call on them.
type Prepared struct {
	Inputs     map[string]Array // as the numpy side reads them
	InputBytes int64            // what the reference reads (the Go-side tensors)
	// Run calls the reference (both answers, as kcheck runs it) and returns
	// the exact outputs by name, with their shapes.
	Run func() (map[string]Output, error)
}

// Output is one float64 output of a reference.
type Output struct {
	V     []float64
	Shape []int
}

// bf16Bits returns a random bf16 bit pattern of magnitude in [2^-7, 2^1),
// either sign: cheap to generate in bulk and far from overflow.
func bf16Bits(u uint64) uint16 {
	return uint16(u&1)<<15 | uint16(120+(u>>1)&7)<<7 | uint16(u>>4)&0x7F
}

func fillBF16(rng *rand.Rand, b []byte) {
	for i := 0; i+8 <= len(b); i += 8 {
		u := rng.Uint64()
		binary.LittleEndian.PutUint16(b[i:], bf16Bits(u))
		binary.LittleEndian.PutUint16(b[i+2:], bf16Bits(u>>16))
		binary.LittleEndian.PutUint16(b[i+4:], bf16Bits(u>>32))
		binary.LittleEndian.PutUint16(b[i+6:], bf16Bits(u>>48))
	}
}

func bf16Value(bits uint16) float64 { return float64(math.Float32frombits(uint32(bits) << 16)) }

// MLADecode is a dense decode of b requests of n tokens, h heads, over a
// bf16 cache of 64-token pages in shuffled order (L = 512, R = 64: the
// DeepSeek-V3 / Kimi-K2 latent).
func MLADecode(name string, b, h, n int) Case {
	const l, r, p = 512, 64, 64
	d := l + r
	scale := 1 / math.Sqrt(192)
	return Case{
		Name: name, Kernel: "mla_decode",
		Shape:  fmt.Sprintf("B=%d H=%d ctx=%d bf16", b, h, n),
		Flops:  float64(b*h) * float64(n) * 2 * float64(d+l),
		Params: map[string]any{"scale": scale, "L": l},
		Build: func() (*Prepared, error) {
			rng := rand.New(rand.NewPCG(uint64(b), uint64(h*n)))
			perReq := (n + p - 1) / p
			nb := b * perReq
			lay, err := kvcache.NewLayout(kvcache.BF16, l, r, p)
			if err != nil {
				return nil, err
			}
			ct := tensor.New(tensor.BF16, nb, p, d)
			fillBF16(rng, ct.Data)
			cache, err := kvcache.New(ct, lay, 0)
			if err != nil {
				return nil, err
			}
			bt := make([]int64, nb)
			for i, v := range rng.Perm(nb) {
				bt[i] = int64(v)
			}
			sl := make([]int64, b)
			for i := range sl {
				sl[i] = int64(n)
			}
			pages, err := kvcache.NewPages(tensor.FromInt64s(tensor.I32, []int{b, perReq}, bt),
				tensor.FromInt64s(tensor.I32, []int{b}, sl), p, nb)
			if err != nil {
				return nil, err
			}
			q := mla.Query{B: b, SQ: 1, H: h, D: d, Data: make([]float64, b*h*d)}
			for i := range q.Data {
				q.Data[i] = bf16Value(bf16Bits(rng.Uint64()))
			}
			cfg := mla.Config{SoftmaxScale: scale, LSE: splitk.DefaultConvention()}
			dense := &mla.Dense{Q: q, Cache: cache, Pages: pages}
			return &Prepared{
				Inputs: map[string]Array{
					"q":           F64Array(q.Data, b, 1, h, d),
					"cache":       {Descr: "<u2", Shape: []int{nb, p, d}, Data: ct.Data},
					"block_table": I32Array(bt, b, perReq),
					"seq_lens":    I32Array(sl, b),
				},
				InputBytes: int64(len(ct.Data)) + int64(8*len(q.Data)) + int64(4*(len(bt)+len(sl))),
				Run: func() (map[string]Output, error) {
					ex, _, err := mla.Decode(context.Background(), dense, cfg, mla.DefaultPrecision())
					if err != nil {
						return nil, err
					}
					return map[string]Output{"out": Output{ex.Out, []int{b, 1, h, l}}, "lse": Output{ex.LSE, []int{b, h, 1}}}, nil
				},
			}, nil
		},
	}
}

// SplitKCombine combines n rows of s partials of length l (flash
// decoding's combine after a decode of n = B·H rows). The partials are fp32
// values held as float64, the form the reference takes them in (the
// splitk_combine adapter widens the F32 tensors first); numpy gets the same
// float64 arrays.
func SplitKCombine(name string, n, s, l int) Case {
	return Case{
		Name: name, Kernel: "splitk_combine",
		Shape: fmt.Sprintf("rows=%d S=%d L=%d", n, s, l),
		Flops: float64(n) * float64(s) * float64(2*l+4),
		Build: func() (*Prepared, error) {
			rng := rand.New(rand.NewPCG(uint64(n), uint64(s*l)))
			po := make([]float64, n*s*l)
			for i := range po {
				po[i] = float64(float32(rng.Float64()*4 - 2))
			}
			pl := make([]float64, n*s)
			for i := range pl {
				pl[i] = float64(float32(rng.Float64() * 8))
			}
			return &Prepared{
				Inputs:     map[string]Array{"partial_out": F64Array(po, n, s, l), "partial_lse": F64Array(pl, n, s)},
				InputBytes: int64(8 * (len(po) + len(pl))),
				Run: func() (map[string]Output, error) {
					ex, _, err := splitk.Combine(context.Background(), po, pl, n, s, l, splitk.DefaultConvention(), tensor.BF16, tensor.F32)
					if err != nil {
						return nil, err
					}
					return map[string]Output{"out": Output{ex.Out, []int{n, l}}, "lse": Output{ex.LSE, []int{n}}}, nil
				},
			}, nil
		},
	}
}

// randomNVFP4 is a rows x k matrix of random E2M1 codes with block scales
// of magnitude 2^-3..2^3 and a dequant-kind global scale.
func randomNVFP4(rng *rand.Rand, rows, k int, global float64) *nvfp4.Matrix {
	m := &nvfp4.Matrix{Rows: rows, K: k, Packed: make([]uint8, rows*k/2), Scales: make([]uint8, rows*k/nvfp4.BlockSize), Global: global, Kind: nvfp4.Dequant}
	for i := range m.Packed {
		m.Packed[i] = uint8(rng.Uint32())
	}
	for i := range m.Scales {
		// E4M3 exponent field 4..10 (2^-3..2^3), random mantissa
		m.Scales[i] = uint8(4+rng.IntN(7))<<3 | uint8(rng.IntN(8))
	}
	return m
}

func matrixArrays(prefix string, m *nvfp4.Matrix, into map[string]Array) {
	into[prefix+"_codes"] = Array{Descr: "|u1", Shape: []int{m.Rows, m.K / 2}, Data: m.Packed}
	into[prefix+"_scales"] = Array{Descr: "|u1", Shape: []int{m.Rows, m.K / nvfp4.BlockSize}, Data: m.Scales}
}

// NVFP4GEMM is out[M, N] = dequant(a) · dequant(b)ᵀ with K-long rows.
func NVFP4GEMM(name string, m, n, k int) Case {
	const ga, gb = 0.75 / 448, 1.5e-3
	return Case{
		Name: name, Kernel: "nvfp4_gemm",
		Shape:  fmt.Sprintf("M=%d N=%d K=%d", m, n, k),
		Flops:  2 * float64(m) * float64(n) * float64(k),
		Params: map[string]any{"a_global": ga, "b_global": gb},
		Build: func() (*Prepared, error) {
			rng := rand.New(rand.NewPCG(uint64(m), uint64(n*k)))
			a, b := randomNVFP4(rng, m, k, ga), randomNVFP4(rng, n, k, gb)
			in := map[string]Array{}
			matrixArrays("a", a, in)
			matrixArrays("b", b, in)
			return &Prepared{
				Inputs:     in,
				InputBytes: int64(len(a.Packed) + len(a.Scales) + len(b.Packed) + len(b.Scales)),
				Run: func() (map[string]Output, error) {
					ex, _, err := nvfp4.GEMM(context.Background(), a, b, tensor.BF16)
					if err != nil {
						return nil, err
					}
					return map[string]Output{"out": Output{ex, []int{m, n}}}, nil
				},
			}, nil
		},
	}
}

// NVFP4Dequantize dequantizes a rows x k weight (both answers, as the
// nvfp4_dequantize adapter does).
func NVFP4Dequantize(name string, rows, k int) Case {
	const g = 1.5e-3
	return Case{
		Name: name, Kernel: "nvfp4_dequantize",
		Shape:  fmt.Sprintf("%dx%d", rows, k),
		Flops:  2 * float64(rows) * float64(k),
		Params: map[string]any{"global": g},
		Build: func() (*Prepared, error) {
			rng := rand.New(rand.NewPCG(uint64(rows), uint64(k)))
			w := randomNVFP4(rng, rows, k, g)
			in := map[string]Array{}
			matrixArrays("w", w, in)
			return &Prepared{
				Inputs:     in,
				InputBytes: int64(len(w.Packed) + len(w.Scales)),
				Run: func() (map[string]Output, error) {
					ex, err := nvfp4.Dequantize(context.Background(), w)
					if err != nil {
						return nil, err
					}
					if _, err := nvfp4.DequantizeExpected(context.Background(), w, tensor.BF16); err != nil {
						return nil, err
					}
					return map[string]Output{"out": Output{ex, []int{rows, k}}}, nil
				},
			}, nil
		},
	}
}

// Cases returns the table's cases, full size or (quick) reduced.
func Cases(quick bool) []Case {
	if quick {
		return []Case{
			MLADecode("mla_decode kimi-k2 (quick)", 16, 64, 2048),
			MLADecode("mla_decode deepseek-v3 (quick)", 4, 128, 4096),
			SplitKCombine("splitk_combine (quick)", 256, 64, 512),
			NVFP4GEMM("nvfp4_gemm 7168->2048 (quick)", 64, 2048, 7168),
			NVFP4GEMM("nvfp4_gemm 2048->7168 (quick)", 64, 7168, 2048),
			NVFP4Dequantize("nvfp4_dequantize (quick)", 2048, 7168),
		}
	}
	return []Case{
		MLADecode("mla_decode kimi-k2", 16, 64, 32768),
		MLADecode("mla_decode deepseek-v3", 4, 128, 131072),
		SplitKCombine("splitk_combine", 16*64, 64, 512),
		NVFP4GEMM("nvfp4_gemm 7168->2048", 256, 2048, 7168),
		NVFP4GEMM("nvfp4_gemm 2048->7168", 256, 7168, 2048),
		NVFP4Dequantize("nvfp4_dequantize", 2048, 7168),
	}
}

// GrowthCases are Go-only decodes over context length (B = 1) and batch
// (16K tokens each), deepseek-v3's 128 heads, for the cost-growth table.
func GrowthCases(quick bool) []Case {
	ctx := []int{1024, 4096, 16384, 65536, 131072}
	batch := []int{1, 2, 4, 8}
	per := 16384
	if quick {
		ctx, batch, per = []int{1024, 2048, 4096, 8192}, []int{1, 2, 4}, 2048
	}
	var cs []Case
	for _, n := range ctx {
		c := MLADecode(fmt.Sprintf("growth ctx %d", n), 1, 128, n)
		c.Kernel = ""
		cs = append(cs, c)
	}
	for _, b := range batch {
		c := MLADecode(fmt.Sprintf("growth batch %d x %d", b, per), b, 128, per)
		c.Kernel = ""
		cs = append(cs, c)
	}
	return cs
}

// Lookup finds a case by name among the full, quick and growth cases.
func Lookup(name string) (Case, bool) {
	for _, quick := range []bool{false, true} {
		for _, c := range append(Cases(quick), GrowthCases(quick)...) {
			if c.Name == name {
				return c, true
			}
		}
	}
	return Case{}, false
}

package cuda

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// TestPrecisionMatchesSources reads the `kcheck:precision` line of every
// kernel in the .cu files (the source's own declaration, next to the code
// that does the rounding) and requires the Go table to say the same, so the
// worker never labels a kernel's output with a precision its code lacks.
func TestPrecisionMatchesSources(t *testing.T) {
	files, err := filepath.Glob("*.cu")
	if err != nil || len(files) == 0 {
		t.Fatalf("no .cu files found (err %v)", err)
	}
	fromSource := map[string]map[string]string{}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		for line := 1; sc.Scan(); line++ {
			_, rest, ok := strings.Cut(sc.Text(), "kcheck:precision ")
			if !ok {
				continue
			}
			fields := strings.Fields(rest)
			if len(fields) < 5 {
				t.Errorf("%s:%d: want `kcheck:precision NAME acc=.. p=.. kv_dequant=.. fp8_saturate=..`", f, line)
				continue
			}
			kv := map[string]string{}
			for _, fld := range fields[1:] {
				k, v, _ := strings.Cut(fld, "=")
				kv[k] = v
			}
			if _, dup := fromSource[fields[0]]; dup {
				t.Errorf("%s:%d: kernel %s declared twice", f, line, fields[0])
			}
			fromSource[fields[0]] = kv
		}
		fh.Close()
	}
	names := map[tensor.DType]string{tensor.F32: "f32", tensor.BF16: "bf16", tensor.F16: "f16", tensor.F64: "f64"}
	for name, d := range Precisions {
		src, ok := fromSource[name]
		if !ok {
			t.Errorf("kernel %s is in Precisions but no .cu file declares it", name)
			continue
		}
		want := map[string]string{
			"acc":          names[d.Precision.Acc],
			"p":            "none",
			"kv_dequant":   "none",
			"fp8_saturate": map[bool]string{true: "true", false: "false"}[d.Precision.FP8Saturate],
		}
		if d.UsesP {
			want["p"] = names[d.Precision.P]
		}
		if d.UsesKV {
			want["kv_dequant"] = names[d.Precision.KVDequant]
		}
		if d.Precision.SoftmaxBlock > 0 {
			want["softmax_block"] = strconv.Itoa(d.Precision.SoftmaxBlock)
		}
		for k, v := range want {
			if src[k] != v {
				t.Errorf("kernel %s: the .cu file declares %s=%s, Precisions says %s", name, k, src[k], v)
			}
		}
	}
	for name, kv := range fromSource {
		if _, known := kv["softmax_block"]; known && Precisions[name].Precision.SoftmaxBlock == 0 {
			t.Errorf("kernel %s: the .cu file declares softmax_block=%s, Precisions none", name, kv["softmax_block"])
		}
		if _, ok := Precisions[name]; !ok {
			t.Errorf("kernel %s is declared in a .cu file but missing from Precisions", name)
		}
	}
}

// TestSoftmaxBlockIsTheTile: the declared softmax block is the MLA decode's
// token tile, MLA_BN in mla_decode.cu, so retiling the kernel cannot leave
// the expected model on the old block.
func TestSoftmaxBlockIsTheTile(t *testing.T) {
	src, err := os.ReadFile("mla_decode.cu")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^#define MLA_BN (\d+)`).FindSubmatch(src)
	if m == nil {
		t.Fatal("mla_decode.cu has no #define MLA_BN")
	}
	bn, _ := strconv.Atoi(string(m[1]))
	for _, k := range []string{"mla_decode", "mla_decode_sparse"} {
		if got := Precisions[k].Precision.SoftmaxBlock; got != bn {
			t.Errorf("%s declares softmax_block %d, but mla_decode.cu tiles MLA_BN = %d tokens", k, got, bn)
		}
		meta, _ := PrecisionMeta(k, true)
		if meta["softmax_block"] != strconv.Itoa(bn) {
			t.Errorf("%s: the worker's metadata says softmax_block=%q, want %d", k, meta["softmax_block"], bn)
		}
	}
}

// TestKernelsAreContracts: every CUDA kernel implements a registered
// contract, so its outputs can be checked.
func TestKernelsAreContracts(t *testing.T) {
	for _, name := range Kernels() {
		if _, err := kernel.Lookup(name); err != nil {
			t.Errorf("CUDA kernel %s: %v", name, err)
		}
	}
}

// TestPrecisionMetaParses: the metadata the worker writes reads back, through
// the checker's own parser, as the declared precision.
func TestPrecisionMetaParses(t *testing.T) {
	for _, name := range Kernels() {
		for _, sat := range []bool{true, false} {
			meta, ok := PrecisionMeta(name, sat)
			if !ok {
				t.Fatalf("PrecisionMeta(%s) not found", name)
			}
			got, err := kernel.PrecisionFrom(kernel.Params(meta))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			want := Precisions[name].Precision
			want.FP8Saturate = sat
			def := kernel.DefaultPrecision()
			if !Precisions[name].UsesP {
				want.P = def.P
			}
			if !Precisions[name].UsesKV {
				want.KVDequant = def.KVDequant
			}
			if got != want {
				t.Errorf("%s sat=%v: metadata %v reads back as %+v, want %+v", name, sat, meta, got, want)
			}
		}
	}
	if _, ok := PrecisionMeta("no_such_kernel", true); ok {
		t.Error("PrecisionMeta of an unknown kernel reported ok")
	}
}

// TestMLASmemBytes: the launcher's copy of the MLA decode shared-memory
// layout, against sizes added up by hand from mla_decode.cu (padded rows of
// 584 bf16 = 1168 bytes; P rows of 40 bf16 = 80 bytes) and, where `make
// kernels` has run, against the sizes the compiled module itself declares.
func TestMLASmemBytes(t *testing.T) {
	hand := []struct {
		mt, stages int
		kind       string
		want       int
	}{
		// Q 16*1168 + 2 tiles 32*1168 + P 16*80 + max/sum 2*4*16*4 + valid 2*32*4
		{1, 2, "bf16", 18688 + 2*37376 + 1280 + 512 + 256},
		// raw tiles 32*576, one converted tile 32*1168
		{1, 2, "fp8_e4m3", 18688 + 2*18432 + 37376 + 1280 + 512 + 256},
		// raw tiles 32*656: must stay under sm_120's 101376 bytes
		{1, 2, "fp8_ds_mla", 18688 + 2*20992 + 37376 + 1280 + 512 + 256},
		{4, 3, "bf16", 74752 + 3*37376 + 5120 + 2048 + 384},
	}
	for _, h := range hand {
		if got := mlaSmemBytes(h.mt, h.stages, h.kind); got != h.want {
			t.Errorf("mlaSmemBytes(%d, %d, %s) = %d, want %d", h.mt, h.stages, h.kind, got, h.want)
		}
	}
	if got := mlaSmemBytes(1, 2, "fp8_ds_mla"); got > 101376 {
		t.Errorf("the 16-row ds_mla variant needs %d bytes, more than sm_120 allows (101376)", got)
	}
	ptx, err := os.ReadFile(filepath.Join("ptx", "mla_decode.ptx"))
	if err != nil {
		t.Skip("no ptx/mla_decode.ptx (run `make kernels`): checked against the hand sums only")
	}
	re := regexp.MustCompile(`mla_decode(?:_sparse)?_(bf16|fp8|ds_mla)_m(\d)_s(\d)_smem = (\d+);`)
	kinds := map[string]string{"bf16": "bf16", "fp8": "fp8_e4m3", "ds_mla": "fp8_ds_mla"}
	n := 0
	for _, m := range re.FindAllStringSubmatch(string(ptx), -1) {
		mt, _ := strconv.Atoi(m[2])
		st, _ := strconv.Atoi(m[3])
		want, _ := strconv.Atoi(m[4])
		if got := mlaSmemBytes(mt, st, kinds[m[1]]); got != want {
			t.Errorf("%s: the module declares %d bytes, mlaSmemBytes says %d", m[0], want, got)
		}
		n++
	}
	if n != 18 {
		t.Errorf("found %d MLA variants' sizes in the PTX, want 18", n)
	}
}

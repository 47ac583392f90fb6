package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/gpu"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/printable"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

func init() { extraCommands = append(extraCommands, newBenchCmd) }

// benchRow is one benchmarked case. Rates come from the bytes a kernel
// must move at least (its inputs read once, its outputs written once; for
// attention the KV pages of every request) and, for the GEMM, 2·M·N·K.
type benchRow struct {
	Case    string  `json:"case"`
	Kernel  string  `json:"kernel"`
	Backend string  `json:"backend"`
	MS      float64 `json:"ms"` // median device time (cuda) or best wall time (others)
	Bytes   int64   `json:"bytes"`
	GBps    float64 `json:"gb_per_s"`
	FLOPs   float64 `json:"flops,omitempty"`
	TFLOPs  float64 `json:"tflop_per_s,omitempty"`
	// CopyGBps is a device-to-device copy of Bytes timed in the same
	// worker process; CopyRatio = GBps / CopyGBps.
	CopyGBps  float64 `json:"copy_gb_per_s,omitempty"`
	CopyRatio float64 `json:"copy_ratio,omitempty"`
	Error     string  `json:"error,omitempty"`
}

func newBenchCmd(s *IO) *cobra.Command {
	var names []string
	var match, backendName, casesFile string
	var repeat int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Time kernels on a backend: bandwidth against a device copy, GEMM TFLOP/s",
		Long: `bench runs the cases tagged 'bench' (or those selected) on a backend, repeat
times, and reports the time, the bytes the kernel must move at least, the
achieved GB/s and, on the cuda backend, the same bytes copied device to device
in the same worker process: the ratio says how close a memory-bound kernel
(MLA decode, NVFP4 dequantize) comes to the memory system. GEMMs report
TFLOP/s. It is a benchmark, never a test: it passes or fails nothing.`,
		Example: `  kcheck bench --backend cuda
  kcheck bench --backend reference --case bench/nvfp4_gemm/gate_up_n2048_k7168/m16 --repeat 3`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			all, err := loadCases(cmd.Context(), casesFile)
			if err != nil {
				return exitWith(s, ExitUsage, false, err)
			}
			if len(names) == 0 && match == "" {
				match = "bench/*"
			}
			sel, err := selectCases(all, names, match, true)
			if err != nil {
				return exitWith(s, ExitUsage, false, err)
			}
			if repeat < 1 {
				return exitWith(s, ExitUsage, false, fmt.Errorf("--repeat %d: want at least 1", repeat))
			}
			be, err := backend.Parse(backendName)
			if err != nil {
				return exitWith(s, ExitUsage, false, err)
			}
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			enc := json.NewEncoder(s.Out)
			if !asJSON {
				fmt.Fprintf(s.Out, "%-52s %-9s %10s %10s %9s %10s %9s %s\n", "case", "backend", "ms", "MB", "GB/s", "copy GB/s", "of copy", "TFLOP/s")
			}
			for _, c := range sel {
				row := benchCase(ctx, c, be, repeat)
				if asJSON {
					if err := enc.Encode(row); err != nil {
						return err
					}
					continue
				}
				if row.Error != "" {
					fmt.Fprintf(s.Out, "%-52s %-9s error: %s\n", printable.Escape(row.Case), printable.Escape(row.Backend), printable.Escape(row.Error))
					continue
				}
				fmt.Fprintf(s.Out, "%-52s %-9s %10.3f %10.1f %9.1f %10s %9s %s\n", printable.Escape(row.Case), printable.Escape(row.Backend), row.MS,
					float64(row.Bytes)/1e6, row.GBps, optional(row.CopyGBps, "%.1f"), optional(100*row.CopyRatio, "%.0f%%"), optional(row.TFLOPs, "%.2f"))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&names, "case", nil, "case name (repeatable; default: every case tagged bench)")
	f.StringVar(&match, "match", "", "cases whose name matches this glob")
	f.StringVar(&casesFile, "cases", "", "read cases from this file instead of the built-in catalog")
	f.StringVar(&backendName, "backend", "cuda", "reference, cuda or faulty:NAME")
	f.IntVar(&repeat, "repeat", 20, "runs per case (cuda: median device time; others: best wall time)")
	f.BoolVar(&asJSON, "json", false, "one JSON object per case")
	return cmd
}

func optional(v float64, format string) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf(format, v)
}

// roofline is what kernel name must move and compute at least on in
// (the kernel's Roofliner).
func roofline(name string, in kernel.Inputs, outs map[string]*tensor.Tensor) (int64, float64) {
	k, err := kernel.Lookup(name)
	if err != nil {
		return kernel.StreamedBytes(in, outs), 0
	}
	return k.(kernel.Roofliner).Roofline(in, outs)
}

func benchCase(ctx context.Context, c cases.Case, be backend.Backend, repeat int) benchRow {
	row := benchRow{Case: c.Name, Kernel: c.Kernel, Backend: be.Name()}
	in, err := c.Inputs()
	if err != nil {
		row.Error = err.Error()
		return row
	}
	_, row.FLOPs = roofline(c.Kernel, in, nil)
	var outs map[string]*tensor.Tensor
	if g, ok := be.(*gpu.Backend); ok {
		// One worker run times the kernel repeat times and a copy of the
		// same byte count, so the ratio is measured side by side.
		w := *g.Worker
		w.Repeat = repeat
		probe, err := be.Run(ctx, c.Kernel, in) // learn the output sizes
		if err != nil {
			row.Error = err.Error()
			return row
		}
		w.CopyBytes, _ = roofline(c.Kernel, in, probe)
		var info gpu.RunInfo
		outs, info, err = w.Run(ctx, c.Kernel, in)
		if err != nil {
			row.Error = err.Error()
			return row
		}
		row.MS, _ = strconv.ParseFloat(info.Meta["kcheck.cuda.ms"], 64)
		if cms, _ := strconv.ParseFloat(info.Meta["kcheck.cuda.copy_ms"], 64); cms > 0 {
			row.CopyGBps = float64(w.CopyBytes) / cms / 1e6
		}
	} else {
		best := time.Duration(1<<63 - 1)
		for r := 0; r < repeat; r++ {
			start := time.Now()
			outs, err = be.Run(ctx, c.Kernel, in)
			if err != nil {
				row.Error = err.Error()
				return row
			}
			best = min(best, time.Since(start))
		}
		row.MS = float64(best.Microseconds()) / 1e3
	}
	row.Bytes, _ = roofline(c.Kernel, in, outs)
	if row.MS > 0 {
		row.GBps = float64(row.Bytes) / row.MS / 1e6
		row.TFLOPs = row.FLOPs / row.MS / 1e9
		if row.CopyGBps > 0 {
			row.CopyRatio = row.GBps / row.CopyGBps
		}
	}
	return row
}

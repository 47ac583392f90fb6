// Command kcheck verifies inference kernels numerically: it checks evidence
// files captured from engines or GPU runs against pure-Go references, runs
// the case catalog on a backend, and diagnoses which stage of a decode
// pipeline (quant, cache, attn, combine) is at fault. See README.md.
package main

import (
	"os"

	"github.com/kcheck-dev/kcheck/internal/cli"
	_ "github.com/kcheck-dev/kcheck/internal/gpu"    // registers --backend cuda (spawns kcheck-gpu; no CUDA import here)
	_ "github.com/kcheck-dev/kcheck/internal/worker" // registers --backend exec: and worker: (the open worker protocol)
)

func main() { os.Exit(int(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))) }

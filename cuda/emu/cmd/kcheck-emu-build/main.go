// Command kcheck-emu-build compiles the cuda/ kernels for the cuda-emu
// backend (make emu): kcheck-emu-build -src cuda -out build/emu [-asan].
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kcheck-dev/kcheck/cuda/emu"
)

func main() {
	src := flag.String("src", "cuda", "directory of the .cu and .cuh sources")
	root := flag.String("emu", "", "the emulator's directory (default SRC/emu)")
	out := flag.String("out", "build/emu", "output directory of the modules")
	asan := flag.Bool("asan", false, "build under AddressSanitizer")
	cxx := flag.String("cxx", os.Getenv("CXX"), "C++ compiler (default g++)")
	verbose := flag.Bool("v", false, "print the compiler commands")
	files := flag.String("files", "", "comma-separated kernel files to build (default: every .cu)")
	flag.Parse()
	if *root == "" {
		*root = filepath.Join(*src, "emu")
	}
	start := time.Now()
	o := emu.Options{Src: *src, EmuRoot: *root, Out: *out, CXX: *cxx, ASan: *asan}
	if *files != "" {
		o.Files = strings.Split(*files, ",")
	}
	if *verbose {
		o.Log = func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }
	}
	if err := emu.Build(o); err != nil {
		fmt.Fprintln(os.Stderr, "kcheck-emu-build:", err)
		os.Exit(1)
	}
	fmt.Printf("kcheck-emu-build: modules in %s (asan %v) in %.1f s\n", *out, *asan, time.Since(start).Seconds())
}

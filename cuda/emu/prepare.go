// Package emu builds the cuda-emu kernel modules: the unmodified .cu sources
// of cuda/ compiled for the CPU against include/kc_emu.h (the CUDA built-ins)
// and runtime/emu.cc (fibers, barriers, warp collectives, the PTX
// instructions the kernels use), one shared object a kernel file and
// architecture, which the cudaemu-tagged cuda package loads as the real
// launcher loads PTX.
//
// The one change made to the sources on the way is mechanical: each inline
// `asm` statement (PTX text that no CPU compiler can take) becomes a call
// kc_emu::ptx("the same template", file, line, {operands}) that interprets
// the template's instructions; everything else is copied byte for byte and
// every line keeps its number, so compiler messages and error reports point
// at the original files.
package emu

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// RewriteAsm returns src with every inline asm statement replaced by a call
// into the emulator; file names the source in the calls and in errors.
func RewriteAsm(src []byte, file string) ([]byte, int, error) {
	var out bytes.Buffer
	n, line := 0, 1
	i := 0
	for i < len(src) {
		c := src[i]
		switch {
		case c == '\n':
			line++
			out.WriteByte(c)
			i++
		case c == '/' && i+1 < len(src) && src[i+1] == '/':
			j := bytes.IndexByte(src[i:], '\n')
			if j < 0 {
				j = len(src) - i
			}
			out.Write(src[i : i+j])
			i += j
		case c == '/' && i+1 < len(src) && src[i+1] == '*':
			j := bytes.Index(src[i+2:], []byte("*/"))
			if j < 0 {
				return nil, 0, fmt.Errorf("%s:%d: unterminated comment", file, line)
			}
			seg := src[i : i+2+j+2]
			line += bytes.Count(seg, []byte("\n"))
			out.Write(seg)
			i += len(seg)
		case c == '"' || c == '\'':
			j, err := skipQuoted(src, i)
			if err != nil {
				return nil, 0, fmt.Errorf("%s:%d: %v", file, line, err)
			}
			out.Write(src[i:j])
			i = j
		case isIdentStart(c):
			j := i
			for j < len(src) && isIdent(src[j]) {
				j++
			}
			if string(src[i:j]) != "asm" {
				out.Write(src[i:j])
				i = j
				continue
			}
			end, call, err := rewriteOne(src, j, file, line)
			if err != nil {
				return nil, 0, err
			}
			out.WriteString(call)
			nl := bytes.Count(src[i:end], []byte("\n"))
			out.WriteString(strings.Repeat("\n", nl))
			line += nl
			n++
			i = end
		default:
			out.WriteByte(c)
			i++
		}
	}
	return out.Bytes(), n, nil
}

func isIdentStart(c byte) bool { return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
func isIdent(c byte) bool      { return isIdentStart(c) || c >= '0' && c <= '9' }

// skipQuoted returns the index just past the string or char literal at i.
func skipQuoted(src []byte, i int) (int, error) {
	q := src[i]
	for j := i + 1; j < len(src); j++ {
		switch src[j] {
		case '\\':
			j++
		case q:
			return j + 1, nil
		case '\n':
			return 0, fmt.Errorf("unterminated literal")
		}
	}
	return 0, fmt.Errorf("unterminated literal")
}

func skipSpace(src []byte, i int) int {
	for i < len(src) {
		switch {
		case src[i] == ' ' || src[i] == '\t' || src[i] == '\n' || src[i] == '\r':
			i++
		case src[i] == '/' && i+1 < len(src) && src[i+1] == '/':
			for i < len(src) && src[i] != '\n' {
				i++
			}
		case src[i] == '/' && i+1 < len(src) && src[i+1] == '*':
			j := bytes.Index(src[i+2:], []byte("*/"))
			if j < 0 {
				return len(src)
			}
			i += j + 4
		default:
			return i
		}
	}
	return i
}

// rewriteOne parses `[volatile] ( template [: outs [: ins [: clobbers]]] )`
// starting after the asm keyword at i, and returns the index after the
// closing parenthesis and the replacement call.
func rewriteOne(src []byte, i int, file string, line int) (int, string, error) {
	bad := func(msg string) (int, string, error) {
		return 0, "", fmt.Errorf("%s:%d: inline asm: %s", file, line, msg)
	}
	i = skipSpace(src, i)
	for _, kw := range []string{"volatile", "__volatile__"} {
		if bytes.HasPrefix(src[i:], []byte(kw)) && !isIdent(src[i+len(kw)]) {
			i = skipSpace(src, i+len(kw))
		}
	}
	if i >= len(src) || src[i] != '(' {
		return bad("expected (")
	}
	i++
	var tmpl []string
	for {
		i = skipSpace(src, i)
		if i >= len(src) || src[i] != '"' {
			break
		}
		j, err := skipQuoted(src, i)
		if err != nil {
			return bad(err.Error())
		}
		tmpl = append(tmpl, string(src[i:j]))
		i = j
	}
	if len(tmpl) == 0 {
		return bad("no template string")
	}
	section := 0 // 1 outputs, 2 inputs, 3 clobbers
	var ops []string
	for {
		i = skipSpace(src, i)
		if i >= len(src) {
			return bad("unterminated statement")
		}
		switch src[i] {
		case ')':
			call := fmt.Sprintf("kc_emu::ptx(%s, %q, %d, {%s})", strings.Join(tmpl, " "), file, line, strings.Join(ops, ", "))
			return i + 1, call, nil
		case ':':
			section++
			i++
			continue
		case ',':
			i++
			continue
		case '"':
			j, err := skipQuoted(src, i)
			if err != nil {
				return bad(err.Error())
			}
			cons := string(src[i:j])
			i = skipSpace(src, j)
			if section == 3 {
				continue // clobbers ("memory"): the emulator orders everything
			}
			if section == 0 || i >= len(src) || src[i] != '(' {
				return bad("operand " + cons + " without an expression")
			}
			k, err := matchParen(src, i)
			if err != nil {
				return bad(err.Error())
			}
			expr := string(src[i : k+1])
			uc, _ := strconv.Unquote(cons)
			if section == 1 {
				if !strings.HasPrefix(uc, "=") && !strings.HasPrefix(uc, "+") {
					return bad("output constraint " + cons)
				}
				ops = append(ops, fmt.Sprintf("kc_emu::op_out(%s, %s)", cons, expr))
			} else {
				ops = append(ops, fmt.Sprintf("kc_emu::op_in(%s, %s)", cons, expr))
			}
			i = k + 1
		default:
			return bad(fmt.Sprintf("unexpected %q", src[i]))
		}
	}
}

func matchParen(src []byte, i int) (int, error) {
	depth := 0
	for j := i; j < len(src); j++ {
		switch src[j] {
		case '"', '\'':
			k, err := skipQuoted(src, j)
			if err != nil {
				return 0, err
			}
			j = k - 1
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return j, nil
			}
		}
	}
	return 0, fmt.Errorf("unbalanced parentheses")
}

// Arch is one emulated build: the module file suffix the launcher looks
// for and the macros nvcc would define.
type Arch struct {
	Suffix string   // "" (the compute_80 build) or ".sm_120a"
	Defs   []string // -D flags
}

// Archs are the builds `make emu` produces: the compute_80 path every GPU
// runs by JIT, and sm_120a with the block-scaled FP4 MMA and the hardware
// e2m1 conversion (what nvcc defines for -arch sm_120a).
var Archs = []Arch{
	{Suffix: "", Defs: []string{"-D__CUDA_ARCH__=800"}},
	{Suffix: ".sm_120a", Defs: []string{"-D__CUDA_ARCH__=1200", "-D__CUDA_ARCH_FEAT_SM120_ALL=1"}},
}

// Options configure Build.
type Options struct {
	Src     string   // the directory of the .cu and .cuh files (cuda/)
	EmuRoot string   // cuda/emu (include/ and runtime/)
	Out     string   // where the modules go
	CXX     string   // default g++
	ASan    bool     // -fsanitize=address
	OptFlag string   // default -O2 (-O1 under ASan)
	Files   []string // kernel files without .cu (default: every .cu in Src)
	Archs   []Arch   // default Archs
	Log     func(format string, args ...any)
}

var kernelMark = regexp.MustCompile(`KC_EMU_GLOBAL_MARK\s+void\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(`)

// ModuleName is the file the emulated device loads for kernel file name.
func ModuleName(name, suffix string) string { return name + suffix + ".emu.so" }

// Build prepares the sources and compiles every module.
func Build(o Options) error {
	if o.CXX == "" {
		o.CXX = "g++"
	}
	if o.OptFlag == "" {
		o.OptFlag = "-O2"
		if o.ASan {
			o.OptFlag = "-O1"
		}
	}
	if o.Archs == nil {
		o.Archs = Archs
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	srcOut := filepath.Join(o.Out, "src")
	genOut := filepath.Join(o.Out, "gen")
	for _, d := range []string{srcOut, genOut} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(o.Src)
	if err != nil {
		return err
	}
	var files []string
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !(strings.HasSuffix(name, ".cu") || strings.HasSuffix(name, ".cuh")) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(o.Src, name))
		if err != nil {
			return err
		}
		rw, _, err := RewriteAsm(b, name)
		if err != nil {
			return err
		}
		if err := writeIfChanged(filepath.Join(srcOut, name), rw); err != nil {
			return err
		}
		if strings.HasSuffix(name, ".cu") {
			files = append(files, strings.TrimSuffix(name, ".cu"))
		}
	}
	sort.Strings(files)
	if o.Files != nil {
		files = o.Files
	}
	root, err := filepath.Abs(o.EmuRoot)
	if err != nil {
		return err
	}
	include := filepath.Join(root, "include")
	runtimeSrc := filepath.Join(root, "runtime", "emu.cc")
	type job struct {
		f string
		a Arch
	}
	var jobs []job
	for _, f := range files {
		for _, a := range o.Archs {
			jobs = append(jobs, job{f, a})
		}
	}
	// The modules compile in parallel, one a core.
	errs := make([]error, len(jobs))
	sem := make(chan struct{}, max(runtime.NumCPU(), 1))
	var wg sync.WaitGroup
	for ji, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[ji] = buildModule(o, include, srcOut, genOut, runtimeSrc, j.f, j.a)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// buildModule compiles kernel file f for architecture a.
func buildModule(o Options, include, srcOut, genOut, runtime, f string, a Arch) error {
	{
		{
			kernels, err := scanKernels(o, include, srcOut, f, a)
			if err != nil {
				return err
			}
			var g strings.Builder
			fmt.Fprintf(&g, "// Generated by cuda/emu: module %s%s (%d kernels).\n#include \"%s.cu\"\n#include \"%s\"\n", f, a.Suffix, len(kernels), f, runtime)
			g.WriteString("extern const kc_emu::KernelEntry kc_emu_kernels[] = {\n")
			for _, k := range kernels {
				fmt.Fprintf(&g, "    KC_EMU_KERNEL(%s)\n", k)
			}
			if len(kernels) == 0 {
				g.WriteString("    {nullptr, nullptr, 0, nullptr},\n")
			}
			fmt.Fprintf(&g, "};\nextern const int kc_emu_num_kernels = %d;\n", len(kernels))
			gen := filepath.Join(genOut, f+a.Suffix+".cc")
			if err := os.WriteFile(gen, []byte(g.String()), 0o644); err != nil {
				return err
			}
			out := filepath.Join(o.Out, ModuleName(f, a.Suffix))
			args := append(compileFlags(o, include, srcOut, a), "-shared", "-o", out+".tmp", gen)
			o.Log("%s %s", o.CXX, strings.Join(args, " "))
			cmd := exec.Command(o.CXX, args...)
			if b, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("compiling %s%s for emulation: %v\n%s", f, a.Suffix, err, b)
			}
			if err := os.Rename(out+".tmp", out); err != nil {
				return err
			}
		}
	}
	return nil
}

func compileFlags(o Options, include, src string, a Arch) []string {
	f := []string{"-std=c++17", o.OptFlag, "-g", "-fPIC", "-fno-strict-aliasing", "-fno-extern-tls-init", "-ffp-contract=off",
		"-Wall", "-Wno-unknown-pragmas", "-Wno-unused-function", "-Wno-unused-variable",
		"-I", include, "-I", src, "-include", "kc_emu.h"}
	if o.ASan {
		f = append(f, "-fsanitize=address", "-fno-omit-frame-pointer")
	}
	return append(f, a.Defs...)
}

// scanKernels lists the extern "C" __global__ functions of file f, read from
// its preprocessed text (kernels are often stamped out by macros).
func scanKernels(o Options, include, src, f string, a Arch) ([]string, error) {
	args := append(compileFlags(o, include, src, a), "-DKC_EMU_SCAN", "-E", "-P", "-x", "c++", filepath.Join(src, f+".cu"))
	cmd := exec.Command(o.CXX, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("preprocessing %s.cu: %v\n%s", f, err, stderr.String())
	}
	var names []string
	for _, m := range kernelMark.FindAllSubmatch(b, -1) {
		names = append(names, string(m[1]))
	}
	return names, nil
}

func writeIfChanged(path string, b []byte) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, b) {
		return nil
	}
	return os.WriteFile(path, b, 0o644)
}

package cli

import (
	"archive/zip"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kcheck-dev/kcheck/internal/safetensors"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// forged is what a crafted name writes to make a terminal show a PASS over
// a FAIL: return to the start of the line, erase it, write a passing line,
// hide what follows; a newline starts a line of its own.
const forged = "\r\x1b[2KPASS         good.safetensors  (nvfp4_dequantize)\x1b[8m"

// terminalSafe returns an error naming the first rune of out a terminal
// would act on instead of showing: a control character other than the
// newlines kcheck writes, DEL, a C1 control, a bidi override, bytes that
// are not UTF-8.
func terminalSafe(out string) error {
	for i, r := range out {
		if r == utf8.RuneError {
			return fmt.Errorf("byte %d: not UTF-8 (%q)", i, out[i:min(i+8, len(out))])
		}
		if r != '\n' && !strconv.IsPrint(r) {
			return fmt.Errorf("byte %d: %U reaches the terminal raw, in %q", i, r, out[max(i-40, 0):min(i+40, len(out))])
		}
	}
	return nil
}

// oneStagePipeline is the failing nvfp4_dequant_nibble_order capture as a
// pipeline of one stage named name (a small pipeline: the four-stage
// examples take seconds under the race detector).
func oneStagePipeline(t *testing.T, dir, name string) string {
	t.Helper()
	f, err := safetensors.Open(fx + "examples/nvfp4_dequant_nibble_order.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	meta := map[string]string{"kcheck.format": "1", "kcheck.kernel": "pipeline", "kcheck.stages": name}
	for k, v := range f.Metadata {
		switch {
		case k == "kcheck.kernel":
			meta["kcheck."+name+".kernel"] = v
		case !strings.HasPrefix(k, "kcheck."):
			meta[name+"."+k] = v
		}
	}
	ts := map[string]*tensor.Tensor{}
	for k, v := range f.Tensors {
		ts[name+"."+k] = v
	}
	path := filepath.Join(dir, "pipeline.safetensors")
	if err := safetensors.Write(path, meta, ts, safetensors.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	return path
}

// Crafted file, case, tensor, kernel, stage and npz member names reach no
// human-readable output raw: every command that prints them escapes them,
// so no terminal is made to show a verdict kcheck did not give. JSON output
// keeps them exact.
func TestNamesAreEscaped(t *testing.T) {
	copyTo := func(t *testing.T, src, dst string) string {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		return writeFile(t, dst, b)
	}
	caseFile := func(t *testing.T, dir string) string {
		name, _ := json.Marshal("bad\nPASS         fine" + forged)
		return writeFile(t, filepath.Join(dir, "cases.json"),
			[]byte(`{"cases":[{"name":`+string(name)+`,"kernel":"nvfp4_quantize","m":2,"k":32}]}`))
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string) []string
		code  ExitCode
		want  string // the escaped name, as printed
		// stderrOnly: the name is in a message on stderr, in no result
		stderrOnly bool
	}{
		{"file name (check)", func(t *testing.T, dir string) []string {
			return []string{"check", copyTo(t, fx+"examples/nvfp4_dequant_nibble_order.safetensors", filepath.Join(dir, "x"+forged+".safetensors"))}
		}, ExitFail, `x\r\x1b[2KPASS`, false},
		{"file name (check --quiet, directory walk)", func(t *testing.T, dir string) []string {
			copyTo(t, fx+"examples/nvfp4_dequant_nibble_order.safetensors", filepath.Join(dir, "x"+forged+".safetensors"))
			return []string{"check", "--quiet", dir}
		}, ExitFail, `x\r\x1b[2KPASS`, false},
		{"file name a directory walk skips", func(t *testing.T, dir string) []string {
			copyTo(t, fx+"examples/nvfp4_dequant_nibble_order.safetensors", filepath.Join(dir, "a.safetensors"))
			if err := os.Symlink(filepath.Join(dir, "nowhere"), filepath.Join(dir, "x"+forged+".safetensors")); err != nil {
				t.Fatal(err)
			}
			return []string{"check", "--quiet", dir}
		}, ExitFail, `x\r\x1b[2KPASS`, true},
		{"file name (diagnose)", func(t *testing.T, dir string) []string {
			return []string{"diagnose", copyTo(t, fx+"examples/nvfp4_dequant_nibble_order.safetensors", filepath.Join(dir, "x"+forged+".safetensors"))}
		}, ExitFail, `x\r\x1b[2KPASS`, false},
		{"file that does not exist", func(t *testing.T, dir string) []string {
			return []string{"check", filepath.Join(dir, "x"+forged)}
		}, ExitUsage, `x\r\x1b[2KPASS`, true},
		{"file name (report, Markdown on stdout)", func(t *testing.T, dir string) []string {
			file := copyTo(t, fx+"examples/nvfp4_dequant_nibble_order.safetensors", filepath.Join(dir, "x"+forged+".safetensors"))
			rep := filepath.Join(dir, "rep")
			if code, _, errs := run(t, "check", "--report", rep, file); code != ExitFail {
				t.Fatalf("check --report: exit %d: %s", code, errs)
			}
			return []string{"report", filepath.Join(rep, "report.json")}
		}, ExitPass, `x\r\x1b[2KPASS`, false},
		{"case name with a newline (run)", func(t *testing.T, dir string) []string {
			return []string{"run", "--cases", caseFile(t, dir), "--backend", "faulty:nibble_order"}
		}, ExitFail, `bad\nPASS         fine\r\x1b[2KPASS`, false},
		{"case name with a newline (cases)", func(t *testing.T, dir string) []string {
			return []string{"cases", "--cases", caseFile(t, dir)}
		}, ExitPass, `bad\nPASS         fine\r\x1b[2KPASS`, false},
		{"tensor name", func(t *testing.T, dir string) []string {
			return []string{"check", mutated(t, dir, "nvfp4_dequantize.safetensors", "t.safetensors", func(_ map[string]string, ts map[string]*tensor.Tensor) {
				ts["t"+forged] = tensor.New(tensor.F32, 1)
			})}
		}, ExitPass, `tensor t\r\x1b[2KPASS`, false},
		{"kernel name", func(t *testing.T, dir string) []string {
			return []string{"check", mutated(t, dir, "nvfp4_dequantize.safetensors", "k.safetensors", func(m map[string]string, _ map[string]*tensor.Tensor) {
				m["kcheck.kernel"] = "k" + forged
			})}
		}, ExitUsage, `k\r\x1b[2KPASS`, false},
		{"stage name (check)", func(t *testing.T, dir string) []string {
			return []string{"check", oneStagePipeline(t, dir, "c"+forged)}
		}, ExitFail, `c\r\x1b[2KPASS`, false},
		{"stage name (diagnose)", func(t *testing.T, dir string) []string {
			return []string{"diagnose", oneStagePipeline(t, dir, "c"+forged)}
		}, ExitFail, `c\r\x1b[2KPASS`, false},
		{"npz member name", func(t *testing.T, dir string) []string {
			// splitk_combine's tensors, all F32, and one more member.
			_, ts := goldenCapture(t, "splitk_combine.safetensors")
			ts["m"+forged] = tensor.New(tensor.F32, 1)
			path := filepath.Join(dir, "m.npz")
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			zw := zip.NewWriter(f)
			for name, x := range ts {
				w, err := zw.Create(name + ".npy")
				if err != nil {
					t.Fatal(err)
				}
				shape := ""
				for _, d := range x.Shape {
					shape += fmt.Sprintf("%d,", d)
				}
				h := "{'descr': '<f4', 'fortran_order': False, 'shape': (" + shape + "), }"
				h += strings.Repeat(" ", (64-(10+len(h)+1)%64)%64) + "\n"
				w.Write(append(append([]byte("\x93NUMPY\x01\x00"), byte(len(h)), 0), h...))
				for i := 0; i < x.Len(); i++ {
					w.Write(binary.LittleEndian.AppendUint32(nil, math.Float32bits(float32(x.Float64At(i)))))
				}
			}
			if err := zw.Close(); err != nil {
				t.Fatal(err)
			}
			f.Close()
			return []string{"check", "--set", "kcheck.kernel=splitk_combine", path}
		}, ExitFail, `tensor m\r\x1b[2KPASS`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.setup(t, t.TempDir())
			code, out, errs := run(t, args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d\nstdout %q\nstderr %q", code, tc.code, out, errs)
			}
			for stream, s := range map[string]string{"stdout": out, "stderr": errs} {
				if err := terminalSafe(s); err != nil {
					t.Errorf("%s: %v", stream, err)
				}
			}
			if !strings.Contains(out+errs, tc.want) {
				t.Errorf("output does not show the name escaped as %s\nstdout %q\nstderr %q", tc.want, out, errs)
			}
			for _, line := range strings.Split(out+errs, "\n") {
				if strings.HasPrefix(line, "PASS") && code != ExitPass {
					t.Errorf("a PASS line in a run that exits %d: %q", code, line)
				}
			}
			// JSON keeps the name exact.
			if (args[0] == "check" || args[0] == "run") && !tc.stderrOnly {
				_, js, _ := run(t, append([]string{args[0], "--json"}, args[1:]...)...)
				if err := terminalSafe(js); err != nil {
					t.Errorf("--json: %v", err)
				}
				if !strings.Contains(js, `\u001b[2KPASS`) {
					t.Errorf("--json does not hold the name exactly (ESC as \\u001b): %q", js)
				}
			}
		})
	}
}

// The interrupt message lists what finished by name: escaped too.
func TestInterruptMessageEscapesNames(t *testing.T) {
	var errw strings.Builder
	p := &progressLog{total: 2}
	p.add("bad\nPASS"+forged, "fail")
	p.interrupted(&IO{Err: &errw}, reportNote("rep"+forged))
	if err := terminalSafe(errw.String()); err != nil {
		t.Error(err)
	}
	if !strings.Contains(errw.String(), `bad\nPASS\r\x1b[2KPASS`) {
		t.Errorf("names not shown escaped: %q", errw.String())
	}
}

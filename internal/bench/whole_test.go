package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kcheck-dev/kcheck/internal/cli"
)

// asKcheck, set in a child's environment, makes the test binary run as the
// kcheck command (TestMain), so the whole-check tests drive `kcheck run`
// and `kcheck check` as processes without building a binary.
const asKcheck = "KCHECK_BENCH_TEST_AS_KCHECK"

func TestMain(m *testing.M) {
	if os.Getenv(asKcheck) == "1" {
		os.Exit(int(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)))
	}
	os.Exit(m.Run())
}

// kcheckSelf is the argv prefix and environment that run this test binary
// as kcheck.
func kcheckSelf(t *testing.T) (string, []string) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe, append(os.Environ(), asKcheck+"=1")
}

// naiveSum is the sum of b's bytes, one at a time.
func naiveSum(b []byte) uint64 {
	var s uint64
	for _, c := range b {
		s += uint64(c)
	}
	return s
}

// TestSumBytesReadsEveryByte: SumBytes equals the byte-by-byte sum at every
// alignment and at lengths around its 8-byte words and 256-word folds, on
// bytes of 255 (the lanes' worst case) and random bytes; a byte left out
// or read twice anywhere changes the sum.
func TestSumBytesReadsEveryByte(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 1))
	random := make([]byte, 3*2048+64)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	full := make([]byte, len(random))
	for i := range full {
		full[i] = 0xFF
	}
	lengths := []int{0, 1, 7, 8, 9, 15, 16, 17, 2047, 2048, 2049, 2056, 4096 + 3, 3 * 2048}
	for name, data := range map[string][]byte{"random": random, "0xFF": full} {
		for off := 0; off < 8; off++ {
			for _, n := range lengths {
				b := data[off : off+n]
				if got, want := SumBytes(b), naiveSum(b); got != want {
					t.Errorf("%s bytes, offset %d, length %d: SumBytes %d, want %d", name, off, n, got, want)
				}
			}
		}
	}
}

// TestSumFile: the mapped file's size and sum are those of the bytes
// written, and a file that cannot be summed is named with its problem.
func TestSumFile(t *testing.T) {
	dir := t.TempDir()
	b := make([]byte, 1<<20+13)
	for i := range b {
		b[i] = byte(i*7 + i>>9)
	}
	path := filepath.Join(dir, "f")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	n, sum, err := SumFile(path)
	if err != nil || n != int64(len(b)) || sum != naiveSum(b) {
		t.Errorf("SumFile = %d, %d, %v; want %d, %d", n, sum, err, len(b), naiveSum(b))
	}
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, nil, 0o644)
	if n, sum, err := SumFile(empty); n != 0 || sum != 0 || err != nil {
		t.Errorf("empty file: %d, %d, %v", n, sum, err)
	}
	for _, bad := range []struct{ path, want string }{{dir, "not a regular file"}, {filepath.Join(dir, "missing"), "no such file"}} {
		if _, _, err := SumFile(bad.path); err == nil || !strings.Contains(err.Error(), bad.want) || !strings.Contains(err.Error(), bad.path) {
			t.Errorf("SumFile(%s) = %v, want an error naming it and %q", bad.path, err, bad.want)
		}
	}
}

// numpyPython is the python the numpy checks run with in this test, or ""
// (and the reason) when it has no numpy.
func numpyPython() (string, string) {
	py := "/usr/bin/python3"
	if p := os.Getenv("KCHECK_BENCH_PYTHON"); p != "" {
		py = p
	}
	if out, err := exec.Command(py, "-c", "import numpy").CombinedOutput(); err != nil {
		return "", fmt.Sprintf("%s has no numpy (%v: %s); apt-get install python3-numpy or set KCHECK_BENCH_PYTHON", py, err, strings.TrimSpace(string(out)))
	}
	return py, ""
}

// TestNumpyChecksAgreeWithKcheck: on a tiny capture of every kernel of the
// whole-check table, passing and with its planted fault, the numpy check a
// user would write and `kcheck check` give the planted verdict. This is
// what gives the numpy column its meaning: a numpy check that passed
// everything (or failed everything) would be fast for nothing.
func TestNumpyChecksAgreeWithKcheck(t *testing.T) {
	py, why := numpyPython()
	if py == "" {
		t.Skip(why)
	}
	if out, err := exec.Command(py, "numpy_checks.py", "--selftest").CombinedOutput(); err != nil {
		t.Fatalf("numpy_checks.py --selftest: %v\n%s", err, out)
	}
	exe, env := kcheckSelf(t)
	dir := t.TempDir()
	cs := Captures(WholeSpecs(), Tiny)
	// One `kcheck run` a backend, every case of it at once.
	byBackend := map[string][]Capture{}
	for _, c := range cs {
		byBackend[c.Backend] = append(byBackend[c.Backend], c)
	}
	for backend, group := range byBackend {
		var all []json.RawMessage
		for _, c := range group {
			var f struct{ Cases []json.RawMessage }
			json.Unmarshal(c.CaseJSON(), &f)
			all = append(all, f.Cases...)
		}
		b, _ := json.Marshal(map[string]any{"cases": all})
		caseFile := filepath.Join(dir, strings.ReplaceAll(backend, ":", "_")+".json")
		os.WriteFile(caseFile, b, 0o644)
		cmd := exec.Command(exe, "run", "--cases", caseFile, "--backend", backend, "--out", filepath.Join(dir, "out"), "--quiet")
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); err != nil && !(ok && ee.ExitCode() == 1) {
			t.Fatalf("kcheck run --backend %s: %v\n%s", backend, err, out)
		}
	}
	var files []string
	want := map[string]string{}
	for _, c := range cs {
		f := filepath.Join(dir, "out", c.Name()+".safetensors")
		files = append(files, f)
		want[f] = c.Want
	}
	verdicts := func(name string, argv []string, env []string) map[string]string {
		cmd := exec.Command(argv[0], append(argv[1:], files...)...)
		cmd.Env = env
		out, err := cmd.Output()
		if ee, ok := err.(*exec.ExitError); err != nil && !(ok && ee.ExitCode() == 1) {
			t.Fatalf("%s: %v\n%s\n%s", name, err, out, ee.Stderr)
		}
		got := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			var r struct {
				File, Verdict string
				Error         *string
				Failing       map[string]int64
			}
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatalf("%s printed %q: %v", name, line, err)
			}
			got[r.File] = r.Verdict
			if r.Error != nil && *r.Error != "" {
				got[r.File] += " (" + *r.Error + ")"
			}
		}
		return got
	}
	kc := verdicts("kcheck check", []string{exe, "check", "--json"}, env)
	np := verdicts("numpy_checks.py", []string{py, "numpy_checks.py"}, os.Environ())
	for _, f := range files {
		if kc[f] != want[f] || np[f] != want[f] {
			t.Errorf("%s: kcheck %s, numpy %s; planted %s", filepath.Base(f), kc[f], np[f], want[f])
		}
	}
}

// TestStoreMakesOnceAndReuses: a capture is made with a manifest whose
// size and checksum are the file's, a second Ensure reuses it, and the read
// limit and kcheck sides read it and agree with the manifest and the
// planted verdict.
func TestStoreMakesOnceAndReuses(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("Measure needs Linux")
	}
	exe, env := kcheckSelf(t)
	var c Capture
	for _, x := range Captures(WholeSpecs(), Tiny) {
		if x.Spec.Name == "kv_cache_gather bf16" && x.Want == "fail" {
			c = x
		}
	}
	var log strings.Builder
	s := &Store{Dir: t.TempDir(), Kcheck: exe, Generator: "test", Env: env, Log: &log}
	cs := []Capture{c}
	if err := s.Ensure(cs); err != nil {
		t.Fatal(err)
	}
	m, ok := s.Lookup(cs[0])
	n, sum, err := SumFile(cs[0].Path)
	if !ok || err != nil || m.Bytes != n || m.Sum != sum {
		t.Fatalf("manifest %+v (found %v) for a file of %d bytes summing to %d (%v)", m, ok, n, sum, err)
	}
	info, _ := os.Stat(cs[0].Path)
	made := log.String()
	if err := s.Ensure(cs); err != nil {
		t.Fatal(err)
	}
	again, _ := os.Stat(cs[0].Path)
	if log.String() != made || !again.ModTime().Equal(info.ModTime()) {
		t.Errorf("the second Ensure made the capture again: %s", strings.TrimPrefix(log.String(), made))
	}
	// Another generator makes a new file and removes the old one.
	s.Generator = "test2"
	cs2 := []Capture{c}
	if err := s.Ensure(cs2); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cs[0].Path); err == nil || cs2[0].Path == cs[0].Path {
		t.Errorf("the old generator's capture %s is still there beside %s", cs[0].Path, cs2[0].Path)
	}
	readlimit := Side{Label: "read limit", Kind: ReadLimitSide, Argv: []string{exe, "-test.run=^TestReadLimitChild$", "--"}, Env: append(os.Environ(), "KCHECK_BENCH_READLIMIT_CHILD=1")}
	o, err := readlimit.Run(cs2[0].Path, time.Minute)
	if err != nil || o.Bytes != n || o.Sum != sum {
		t.Errorf("read limit side: %+v, %v; want %d bytes summing to %d", o, err, n, sum)
	}
	kc := Side{Label: "kcheck", Kind: KcheckSide, Argv: []string{exe, "check", "--json"}, Env: env}
	o, err = kc.Run(cs2[0].Path, time.Minute)
	if err != nil || o.Verdict != "fail" || o.VmHWM <= 0 {
		t.Errorf("kcheck side: verdict %q, VmHWM %d, %v; want fail and a peak RSS", o.Verdict, o.VmHWM, err)
	}
}

// TestStoreRefusesWhenTheDiskIsShort: a store asked to keep more free
// than the disk has refuses before writing anything, naming the directory.
func TestStoreRefusesWhenTheDiskIsShort(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("Statfs is Linux's here")
	}
	var c Capture
	for _, x := range Captures(WholeSpecs(), Tiny) {
		if x.Spec.Name == "kv_cache_gather bf16" {
			c = x
			break
		}
	}
	dir := t.TempDir()
	s := &Store{Dir: dir, Kcheck: "/nonexistent/kcheck", Generator: "test", Log: io.Discard, KeepFree: 1 << 62}
	err := s.Ensure([]Capture{c})
	if err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "kept free") {
		t.Fatalf("Ensure on a disk short of the space to keep free: %v", err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("the refused Ensure left %d files in %s", len(left), dir)
	}
}

// TestReadLimitChild is the read-limit side of TestStoreMakesOnceAndReuses
// when run as a child: cmd/readlimit's output for the file after "--".
func TestReadLimitChild(t *testing.T) {
	if os.Getenv("KCHECK_BENCH_READLIMIT_CHILD") != "1" {
		t.Skip("a child of TestStoreMakesOnceAndReuses")
	}
	path := os.Args[len(os.Args)-1]
	n, sum, err := SumFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("{\"file\":%q,\"bytes\":%d,\"sum\":%d,\"seconds\":0.001}\n", path, n, sum)
	os.Stdout.Sync()
}

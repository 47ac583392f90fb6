// Package bench measures the Go references on the real model sizes, side by
// side with a numpy float64 implementation of the same computation on the
// same inputs (numpy_ref.py, beside this file): wall time, agreement, GFLOP/s
// and peak memory. cmd/benchtable (`make bench`) drives it.
//
// Each case runs in a child process of its own, so the peak RSS it reports
// (VmHWM) is that of one reference call on one set of inputs: the inputs,
// generated in place from a fixed seed, plus whatever the reference holds.
// The child writes the inputs as .npy files, times the Go reference, and
// writes its exact (float64) outputs; the numpy script reads the same files,
// times its own computation and writes its outputs; the parent compares the
// two. Times are the minimum over repetitions, taken alternately (Go, numpy,
// Go, numpy) on a machine that other work may share.
//
// The whole-check table (whole.go, cmd/wholetable, issue 17) measures the
// kcheck check binary instead: each kernel's real-size capture checked end
// to end, beside the numpy check a user would write (numpy_checks.py) and
// the single-core read limit of the same file (cmd/readlimit).
package bench

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Array is one input or output as a .npy file holds it.
type Array struct {
	Descr string // numpy dtype string: '<f8', '<f4', '<u2', '|u1', '<i4'
	Shape []int
	Data  []byte // little-endian, C order
	// F64, when set, holds the values of a '<f8' array instead of Data,
	// encoded as the file is written (no second copy of a big input).
	F64 []float64
}

// Nbytes is the array's data size.
func (a Array) Nbytes() int64 {
	if a.F64 != nil {
		return int64(8 * len(a.F64))
	}
	return int64(len(a.Data))
}

// F64Array wraps float64 values (without copying them).
func F64Array(v []float64, shape ...int) Array {
	return Array{Descr: "<f8", Shape: shape, F64: v}
}

// I32Array wraps int values stored as int32.
func I32Array(v []int64, shape ...int) Array {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(int32(x)))
	}
	return Array{Descr: "<i4", Shape: shape, Data: b}
}

// WriteNPY writes a as a version 1.0 .npy file: magic, header length, a
// Python dict literal padded with spaces and a newline so the data starts
// at a multiple of 64 bytes, then the data.
func WriteNPY(path string, a Array) error {
	n := 1
	dims := make([]string, len(a.Shape))
	for i, d := range a.Shape {
		n *= d
		dims[i] = strconv.Itoa(d)
	}
	size := 0
	if len(a.Descr) > 2 {
		size, _ = strconv.Atoi(a.Descr[2:])
	}
	if size == 0 || int64(n*size) != a.Nbytes() || (a.F64 != nil && a.Descr != "<f8") {
		return fmt.Errorf("npy %s: %d bytes of %s do not fill shape %v", path, a.Nbytes(), a.Descr, a.Shape)
	}
	shape := strings.Join(dims, ", ")
	if len(a.Shape) == 1 {
		shape += ","
	}
	h := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", a.Descr, shape)
	total := 10 + len(h) + 1
	pad := (64 - total%64) % 64
	h += strings.Repeat(" ", pad) + "\n"
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	w.WriteString("\x93NUMPY\x01\x00")
	binary.Write(w, binary.LittleEndian, uint16(len(h)))
	w.WriteString(h)
	w.Write(a.Data)
	var buf [8]byte
	for _, x := range a.F64 {
		binary.LittleEndian.PutUint64(buf[:], math.Float64bits(x))
		w.Write(buf[:])
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// WriteAll writes every array of m into dir as NAME.npy.
func WriteAll(dir string, m map[string]Array) error {
	for name, a := range m {
		if err := WriteNPY(filepath.Join(dir, name+".npy"), a); err != nil {
			return err
		}
	}
	return nil
}

// PeakRSS is the process's peak resident set size in bytes: VmHWM from
// /proc/self/status, or getrusage's ru_maxrss where there is no /proc.
func PeakRSS() int64 {
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range bytes.Split(b, []byte("\n")) {
			if f := strings.Fields(string(line)); len(f) >= 2 && f[0] == "VmHWM:" {
				if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil {
					return kb << 10
				}
			}
		}
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		return int64(ru.Maxrss) << 10 // kilobytes on Linux
	}
	return 0
}

// CPUTime is the process's user plus system CPU time in seconds, all
// threads: on a machine shared with other work the wall time of a run
// depends on the neighbours, its CPU time much less.
func CPUTime() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// Agreement compares a (Go) with b (numpy): the largest elementwise
// relative difference |a-b| / max(|a|, |b|) (0 where both are 0; infinities
// and NaNs must sit at the same places), and the largest absolute
// difference relative to the largest |b| (normwise).
func Agreement(a, b []float64) (maxRel, normRel float64, err error) {
	if len(a) != len(b) {
		return 0, 0, fmt.Errorf("%d values against %d", len(a), len(b))
	}
	var maxAbs, maxB float64
	for i := range a {
		x, y := a[i], b[i]
		if math.IsNaN(x) || math.IsNaN(y) || math.IsInf(x, 0) || math.IsInf(y, 0) {
			if !(x == y || math.IsNaN(x) && math.IsNaN(y)) {
				return 0, 0, fmt.Errorf("element %d: %v against %v", i, x, y)
			}
			continue
		}
		d := math.Abs(x - y)
		if m := max(math.Abs(x), math.Abs(y)); m > 0 {
			maxRel = max(maxRel, d/m)
		}
		maxAbs = max(maxAbs, d)
		maxB = max(maxB, math.Abs(y))
	}
	if maxB > 0 {
		normRel = maxAbs / maxB
	}
	return maxRel, normRel, nil
}

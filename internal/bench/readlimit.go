package bench

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

// SumFile maps the file at path read-only and returns its size and
// SumBytes of its bytes: the page cache is read in place, nothing is
// copied.
func SumFile(path string) (n int64, sum uint64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	if !st.Mode().IsRegular() {
		return 0, 0, fmt.Errorf("%s: not a regular file", path)
	}
	if st.Size() == 0 {
		return 0, 0, nil
	}
	if int64(int(st.Size())) != st.Size() {
		return 0, 0, fmt.Errorf("%s: %d bytes do not fit in this process's address space", path, st.Size())
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return 0, 0, fmt.Errorf("%s: mmap: %v", path, err)
	}
	sum = SumBytes(data)
	if err := syscall.Munmap(data); err != nil {
		return 0, 0, fmt.Errorf("%s: munmap: %v", path, err)
	}
	return st.Size(), sum, nil
}

// byteLanes selects the even bytes of a 64-bit word into 16-bit lanes.
const byteLanes = 0x00FF00FF00FF00FF

// SumBytes returns the sum of the bytes of b, mod 2^64, reading each byte
// once: eight at a time as 64-bit words, the even and the odd bytes of
// each word added into 16-bit lanes (a lane takes at most 255 a word, so
// 256 words fit before the lanes are folded into the total). It is the
// work of cmd/readlimit, the read limit the whole-check table compares
// kcheck with, and its checksum shows that every byte was read.
func SumBytes(b []byte) uint64 {
	var total uint64
	head := min(int((8-uintptr(unsafe.Pointer(unsafe.SliceData(b)))%8)%8), len(b))
	for _, c := range b[:head] {
		total += uint64(c)
	}
	b = b[head:]
	words := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
	for len(words) > 0 {
		n := min(len(words), 256)
		var e0, o0, e1, o1 uint64
		i := 0
		for ; i+2 <= n; i += 2 {
			w0, w1 := words[i], words[i+1]
			e0 += w0 & byteLanes
			o0 += (w0 >> 8) & byteLanes
			e1 += w1 & byteLanes
			o1 += (w1 >> 8) & byteLanes
		}
		if i < n {
			e0 += words[i] & byteLanes
			o0 += (words[i] >> 8) & byteLanes
		}
		total += foldLanes(e0) + foldLanes(o0) + foldLanes(e1) + foldLanes(o1)
		words = words[n:]
	}
	for _, c := range b[len(b)/8*8:] {
		total += uint64(c)
	}
	return total
}

// foldLanes adds the four 16-bit lanes of a.
func foldLanes(a uint64) uint64 { return a&0xFFFF + a>>16&0xFFFF + a>>32&0xFFFF + a>>48 }

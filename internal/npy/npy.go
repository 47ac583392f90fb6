// Package npy reads NumPy .npy and .npz files into contract tensors, so a
// numpy user can hand kcheck arrays without installing safetensors.
//
// A .npy file is a magic string, a version, a header (a Python dict literal:
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }) and the raw
// array. A .npz file is a zip archive of .npy members, one per array, named
// after the array ("x.npy" holds x).
//
// The reader is kcheck's own rather than codeberg.org/sbinet/npyio's
// (which the tests use as an independent writer): npyio decodes into typed Go
// slices and trusts the header (it sizes buffers from it and can panic on a
// malformed one), while a contract tensor wants the raw little-endian bytes
// and a bad file must give an error. Here the header is parsed by a small
// Python-literal scanner and the data is read straight into the tensor.
//
// dtypes: '<f8' F64, '<f4' F32, '<f2' F16, '<i8'/'<i4'/'<i2'/'|i1' I64..I8,
// '<u8'/'<u4'/'<u2'/'|u1' U64..U8, '|b1' BOOL. Big-endian arrays are
// byte-swapped; Fortran-order arrays are reordered to C order.
//
// numpy has no bfloat16 or FP8 dtype. ml_dtypes' arrays are saved as raw
// records that say only their width (ml_dtypes 0.7.0 with numpy 2.4.6:
// bfloat16 as '<V2', float8_e4m3fn, float8_e8m0fnu and float4_e2m1fn as
// '<V1', float8_e5m2 as '<f1'), and arrays saved as their bits,
// x.view(np.uint16) or x.view(np.uint8), say even less. All of them arrive
// here as their bits, U16 or U8: this package does not guess what they
// were. Which dtype they hold is the caller's decision, by the contract of
// the tensor they are (internal/check: the one dtype of that width the
// contract accepts, or a declared one).
package npy

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strings"

	"github.com/kcheck-dev/kcheck/internal/bounded"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// MaxHeaderSize bounds a .npy header. numpy's own reader refuses headers over
// 10000 bytes by default; simple arrays need about 128.
const MaxHeaderSize = 1 << 20

var (
	npyMagic = []byte("\x93NUMPY")
	zipMagic = []byte("PK\x03\x04")
	zipEmpty = []byte("PK\x05\x06") // an archive with no members
)

// ReadFile reads a .npy file (one tensor, named after the file's stem:
// "q_nope.npy" gives "q_nope") or a .npz archive (one tensor per member). The
// kind is told by the file's first bytes, not its extension.
func ReadFile(path string) (map[string]*tensor.Tensor, error) { return ReadFileLimit(path, -1) }

// ErrTooLarge is wrapped by the error of ReadFileLimit when the arrays
// exceed its limit.
var ErrTooLarge = errors.New("over the read limit")

// ReadFileLimit is ReadFile refusing, before reading their data, arrays
// whose bytes add up to more than limit (limit < 0: no bound). A .npz member
// deflates a terabyte of zeros into a few megabytes, and the bytes "really
// arrive" from the decompressor, so only a bound on what headers ask for
// keeps a small archive from exhausting memory.
func ReadFileLimit(path string, limit int64) (map[string]*tensor.Tensor, error) {
	return ReadFileContext(context.Background(), path, limit)
}

// ReadFileContext is ReadFileLimit under ctx: opening the file (a named
// pipe waits for its writer) and every read give up when ctx is done.
func ReadFileContext(ctx context.Context, path string, limit int64) (map[string]*tensor.Tensor, error) {
	budget := &limit
	if limit < 0 {
		budget = nil
	}
	f, err := bounded.Open(ctx, path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st := f.Info()
	if st.IsDir() {
		return nil, fmt.Errorf("%s: is a directory, not a .npy or .npz file", path)
	}
	var magic [6]byte
	n, _ := io.ReadFull(f, magic[:])
	switch {
	case n == 6 && bytes.Equal(magic[:], npyMagic):
		size := st.Size()
		if f.Stream() {
			size = -1 // a pipe, a device, a /proc file: its size says nothing
		}
		t, err := read(io.MultiReader(bytes.NewReader(magic[:]), f), size, size >= 0, true, budget)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		name := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
		return map[string]*tensor.Tensor{name: t}, nil
	case n >= 4 && (bytes.Equal(magic[:4], zipMagic) || bytes.Equal(magic[:4], zipEmpty)):
		ts, err := readZip(f, st.Size(), budget)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return ts, nil
	}
	return nil, fmt.Errorf("%s: not a .npy or .npz file (it starts with %q, not %q or a zip header)", path, magic[:n], npyMagic)
}

// readZip reads every member of a .npz archive of size bytes, within
// budget bytes (nil: no bound). A member "x.npy" becomes tensor "x" (numpy's
// own naming; a member without the suffix keeps its name); every member
// must be a .npy array.
func readZip(r io.ReaderAt, size int64, budget *int64) (map[string]*tensor.Tensor, error) {
	zr, err := zip.NewReader(r, size)
	if err != nil {
		return nil, fmt.Errorf("not a readable .npz (zip) archive: %v", err)
	}
	out := map[string]*tensor.Tensor{}
	for _, zf := range zr.File {
		if strings.HasSuffix(zf.Name, "/") {
			continue // a directory entry
		}
		name := strings.TrimSuffix(zf.Name, ".npy")
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("member %q: the archive holds array %q twice", zf.Name, name)
		}
		rc, err := zf.Open()
		if err != nil {
			return nil, fmt.Errorf("member %q: %v", zf.Name, err)
		}
		declared := int64(-1)
		if zf.UncompressedSize64 <= math.MaxInt64 {
			declared = int64(zf.UncompressedSize64)
		}
		t, err := read(rc, declared, false, true, budget)
		rc.Close()
		if err != nil {
			return nil, fmt.Errorf("member %q: %w", zf.Name, err)
		}
		out[name] = t
	}
	return out, nil
}

// Read reads one .npy array from r, leaving any bytes after it unread (numpy
// can save several arrays to one stream).
func Read(r io.Reader) (*tensor.Tensor, error) { return read(r, -1, false, false, nil) }

// header is a parsed .npy header.
type header struct {
	descr     string
	dtype     tensor.DType
	bigEndian bool
	fortran   bool
	shape     []int
}

// read reads one array. size is the stream's total length when known (-1
// otherwise); sizeIsReal says it is a file's size rather than a claim (a zip
// member's declared size); exact requires the array to end the stream;
// budget, when set, is what the arrays may still take, charged before the
// data is read.
func read(r io.Reader, size int64, sizeIsReal, exact bool, budget *int64) (*tensor.Tensor, error) {
	h, hlen, err := readHeader(r)
	if err != nil {
		return nil, err
	}
	nbytes, ok := tensor.ByteSize(h.shape, h.dtype.Size())
	if !ok {
		return nil, fmt.Errorf("shape %v of %s is too large (its byte size overflows 63 bits)", h.shape, h.descr)
	}
	if budget != nil {
		if nbytes > uint64(*budget) {
			return nil, fmt.Errorf("shape %v of %s needs %d bytes, more than the %d bytes left under the limit: %w", h.shape, h.descr, nbytes, *budget, ErrTooLarge)
		}
		*budget -= int64(nbytes)
	}
	if size >= 0 {
		if size < hlen {
			return nil, fmt.Errorf("the stream is %d bytes, shorter than its %d-byte header", size, hlen)
		}
		avail := uint64(size - hlen)
		if nbytes > avail {
			return nil, fmt.Errorf("shape %v of %s needs %d bytes of data, the file has %d (truncated?)", h.shape, h.descr, nbytes, avail)
		}
		if exact && nbytes < avail {
			return nil, fmt.Errorf("%d bytes follow the %v %s array (several arrays saved to one .npy? save them with np.savez)", avail-nbytes, h.shape, h.descr)
		}
	}
	var data []byte
	if sizeIsReal {
		// The file holds these bytes (checked above): read them in one go.
		data = make([]byte, nbytes)
		n, err := io.ReadFull(r, data)
		if err != nil && err != io.ErrUnexpectedEOF {
			return nil, fmt.Errorf("reading the %v %s array: %v", h.shape, h.descr, err)
		}
		data = data[:n]
	} else {
		// Read through a limit so memory grows with the bytes that really
		// arrive, not with what a header (or a zip directory) claims.
		data, err = io.ReadAll(io.LimitReader(r, int64(nbytes)))
		if err != nil {
			return nil, fmt.Errorf("reading the %v %s array: %v", h.shape, h.descr, err)
		}
	}
	if uint64(len(data)) != nbytes {
		return nil, fmt.Errorf("shape %v of %s needs %d bytes of data, the file has %d (truncated?)", h.shape, h.descr, nbytes, len(data))
	}
	if exact {
		// Reading to the end also makes a zip member verify its checksum.
		var one [1]byte
		switch n, err := io.ReadFull(r, one[:]); {
		case n > 0:
			return nil, fmt.Errorf("bytes follow the %v %s array (several arrays saved to one .npy? save them with np.savez)", h.shape, h.descr)
		case err != io.EOF:
			return nil, fmt.Errorf("reading the %v %s array: %v", h.shape, h.descr, err)
		}
	}
	if h.bigEndian {
		swap(data, h.dtype.Size())
	}
	if h.fortran {
		data = fortranToC(data, h.shape, h.dtype.Size())
	}
	return &tensor.Tensor{DType: h.dtype, Shape: h.shape, Data: data}, nil
}

// readHeader reads the magic, version and header dict; hlen is the number of
// bytes consumed.
func readHeader(r io.Reader) (h header, hlen int64, err error) {
	var pre [8]byte
	if n, err := io.ReadFull(r, pre[:]); err != nil {
		return h, 0, fmt.Errorf("file is %d bytes, too short for a .npy header (truncated?)", n)
	}
	if !bytes.Equal(pre[:6], npyMagic) {
		return h, 0, fmt.Errorf("not a .npy array (it starts with %q, not %q)", pre[:6], npyMagic)
	}
	major, minor := pre[6], pre[7]
	var n uint64
	switch major {
	case 1:
		var b [2]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return h, 0, errors.New("file ends inside the .npy header length (truncated?)")
		}
		n, hlen = uint64(binary.LittleEndian.Uint16(b[:])), 10
	case 2, 3:
		var b [4]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return h, 0, errors.New("file ends inside the .npy header length (truncated?)")
		}
		n, hlen = uint64(binary.LittleEndian.Uint32(b[:])), 12
	default:
		return h, 0, fmt.Errorf(".npy format version %d.%d is not supported (1.0, 2.0 and 3.0 are)", major, minor)
	}
	if n > MaxHeaderSize {
		return h, 0, fmt.Errorf(".npy header length %d exceeds the %d-byte limit (corrupt?)", n, MaxHeaderSize)
	}
	text := make([]byte, n)
	if got, err := io.ReadFull(r, text); err != nil {
		return h, 0, fmt.Errorf(".npy header is %d bytes but the file ends after %d (truncated?)", n, got)
	}
	hlen += int64(n)
	h, err = parseHeader(string(text))
	return h, hlen, err
}

// parseHeader interprets the header dict.
func parseHeader(text string) (header, error) {
	var h header
	p := &parser{s: text}
	d, err := p.dict()
	if err != nil {
		return h, fmt.Errorf(".npy header %q: %v", strings.TrimSpace(text), err)
	}
	descr, ok := d["descr"]
	if !ok {
		return h, fmt.Errorf(".npy header %q has no 'descr'", strings.TrimSpace(text))
	}
	switch v := descr.(type) {
	case string:
		h.descr = v
	case list:
		return h, fmt.Errorf("structured dtype %s is not supported: save each field as its own array", v.text)
	default:
		return h, fmt.Errorf("'descr' is %v, not a dtype string", descr)
	}
	if h.dtype, h.bigEndian, err = parseDescr(h.descr); err != nil {
		return h, err
	}
	fo, ok := d["fortran_order"]
	if !ok {
		return h, fmt.Errorf(".npy header %q has no 'fortran_order'", strings.TrimSpace(text))
	}
	if h.fortran, ok = fo.(bool); !ok {
		return h, fmt.Errorf("'fortran_order' is %v, not True or False", fo)
	}
	sh, ok := d["shape"]
	if !ok {
		return h, fmt.Errorf(".npy header %q has no 'shape'", strings.TrimSpace(text))
	}
	dims, ok := sh.(tuple)
	if !ok {
		return h, fmt.Errorf("'shape' is %v, not a tuple", sh)
	}
	h.shape = make([]int, len(dims))
	for i, d := range dims {
		if d < 0 {
			return h, fmt.Errorf("shape[%d] = %d is negative", i, d)
		}
		h.shape[i] = int(d)
	}
	return h, nil
}

// parseDescr maps a numpy dtype string to a contract dtype.
func parseDescr(s string) (tensor.DType, bool, error) {
	if s == "" {
		return tensor.Invalid, false, errors.New("empty dtype string")
	}
	order, code := s[0], s
	switch order {
	case '<', '>', '|', '=':
		code = s[1:]
	default:
		order = '='
	}
	dt, ok := map[string]tensor.DType{
		"f8": tensor.F64, "f4": tensor.F32, "f2": tensor.F16,
		"i8": tensor.I64, "i4": tensor.I32, "i2": tensor.I16, "i1": tensor.I8,
		"u8": tensor.U64, "u4": tensor.U32, "u2": tensor.U16, "u1": tensor.U8,
		"b1": tensor.Bool, "?": tensor.Bool,
		// raw bits: ml_dtypes' bfloat16 ('<V2'), its one-byte formats
		// ('<V1'), its float8_e5m2 ('<f1', a numpy float code of no numpy
		// dtype)
		"V2": tensor.U16, "V1": tensor.U8, "f1": tensor.U8,
	}[code]
	if !ok {
		hint := ""
		switch {
		case strings.HasPrefix(code, "V"):
			hint = ": raw records of other than 1 or 2 bytes; save the array as a numeric dtype, or use safetensors"
		case strings.HasPrefix(code, "c"):
			hint = ": complex arrays are not supported"
		case strings.HasPrefix(code, "O"):
			hint = ": object arrays (pickled Python objects) are not supported"
		case strings.HasPrefix(code, "U"), strings.HasPrefix(code, "S"):
			hint = ": string arrays are not supported"
		case code == "f16" || code == "f12":
			hint = ": long double is not supported"
		}
		return tensor.Invalid, false, fmt.Errorf("unsupported dtype %q%s", s, hint)
	}
	// '=' is the writer's native order; every platform kcheck runs on is
	// little-endian, as numpy writes '<' there anyway.
	return dt, order == '>' && dt.Size() > 1, nil
}

// swap reverses the bytes of each size-byte element in place.
func swap(b []byte, size int) {
	for i := 0; i+size <= len(b); i += size {
		e := b[i : i+size]
		for j, k := 0, size-1; j < k; j, k = j+1, k-1 {
			e[j], e[k] = e[k], e[j]
		}
	}
}

// fortranToC reorders column-major data into row-major order. Element
// (i0, ..., in-1) sits at Fortran offset i0 + d0·(i1 + d1·(i2 + ...)).
func fortranToC(src []byte, shape []int, size int) []byte {
	if len(shape) < 2 || len(src) == 0 {
		return src // one dimension: the orders agree
	}
	nd := len(shape)
	fstride := make([]int, nd) // Fortran strides in elements
	s := 1
	for i := 0; i < nd; i++ {
		fstride[i] = s
		s *= shape[i]
	}
	dst := make([]byte, len(src))
	idx := make([]int, nd)
	off := 0 // Fortran element offset of idx
	for c := 0; c*size < len(dst); c++ {
		copy(dst[c*size:(c+1)*size], src[off*size:(off+1)*size])
		// Advance idx in C order (last index fastest).
		for d := nd - 1; d >= 0; d-- {
			idx[d]++
			off += fstride[d]
			if idx[d] < shape[d] {
				break
			}
			off -= idx[d] * fstride[d]
			idx[d] = 0
		}
	}
	return dst
}

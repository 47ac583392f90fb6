// Package safetensors reads and writes the Hugging Face safetensors format,
// kcheck's evidence file (reference/CONTRACTS.md §1):
//
//	8 bytes   N, the header length, little-endian uint64
//	N bytes   a JSON object: {"name": {"dtype": "F32", "shape": [2, 3],
//	          "data_offsets": [begin, end]}, ..., "__metadata__": {"k": "v"}}
//	rest      the data buffer; offsets are relative to its start
//
// kcheck has its own reader and writer because the existing Go safetensors
// packages reject the FP8 dtypes (F8_E4M3, F8_E5M2, F8_E8M0) that kernel
// captures are made of. Every dtype of reference/tensor is accepted; packed
// FP4 is U8.
//
// Reading is zero-copy: Open maps the file read-only and each tensor's Data
// is a slice of the mapping, so a multi-GB capture is never held in memory
// twice (the kernel pages it in as references read it). Validation follows
// the reference implementation (safetensors' Rust crate): the tensors must
// tile the data buffer exactly, with no overlap and no hole, and every
// tensor's byte size must match its dtype and shape; a key given twice, at
// the top of the header, inside __metadata__ or inside a tensor's entry, is
// refused (a JSON decoder would keep the last, silently). A malformed file
// gives an error naming the tensor and the problem, never a panic and never
// an allocation sized by an untrusted header. OpenContext also bounds what
// reading takes: the bytes of a stream, and the header's parse (HeaderCost).
//
// Writing is deterministic (names sorted, header padded with spaces so the
// data buffer starts 8-byte aligned, as the Hugging Face writer does) and
// atomic (a temporary file in the same directory, fsync, rename).
package safetensors

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"sort"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/kcheck-dev/kcheck/internal/bounded"
	"github.com/kcheck-dev/kcheck/internal/filelock"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// MaxHeaderSize bounds the JSON header (the limit of the Rust reference
// reader), so a corrupt length cannot make the reader parse gigabytes.
const MaxHeaderSize = 100_000_000

// metadataKey is the header entry that holds the string-to-string metadata.
const metadataKey = "__metadata__"

// File is a parsed safetensors file.
type File struct {
	// Metadata is the __metadata__ map (empty, never nil, when absent).
	Metadata map[string]string
	// Tensors maps each name to its tensor; Data is a view into the file's
	// bytes (the mapping for Open): read-only, valid until Close.
	Tensors map[string]*tensor.Tensor
	// Names lists the tensors in file order (by data offset): the JSON
	// header is an object, whose key order a decoder need not keep.
	Names []string
	// Path is the file's path ("" for Parse).
	Path string

	mapping []byte // the mmap'd file, nil when the file was read or parsed
}

// Open reads the safetensors file at path, as OpenContext does without a
// deadline or a memory bound: for files kcheck wrote itself (a worker's
// output). A file a user names is opened with OpenContext.
func Open(path string) (*File, error) {
	return OpenContext(context.Background(), path, bounded.Limit{})
}

// OpenContext reads the safetensors file at path under ctx (the open and
// every read give up when ctx is done: a named pipe with no writer). A
// regular file of known size is memory-mapped read-only and the tensors'
// Data slice the mapping (zero-copy); a file that cannot be mapped (a
// pipe, a device, a file that stats as 0 bytes) is read into memory, at
// most limit bytes of it. The header's parse is charged against what is
// left of limit (HeaderCost). Call Close to release the mapping; tensors
// must not be used after.
func OpenContext(ctx context.Context, path string, limit bounded.Limit) (*File, error) {
	fh, err := bounded.Open(ctx, path)
	if err != nil {
		return nil, err
	}
	defer fh.Close() // a mapping outlives its descriptor
	st := fh.Info()
	if st.IsDir() {
		return nil, fmt.Errorf("%s: is a directory, not a safetensors file", path)
	}
	var b, mapping []byte
	if size := st.Size(); !fh.Stream() && size <= math.MaxInt {
		if m, err := mmap(fh.OS(), int(size)); err == nil {
			b, mapping = m, m
		}
	}
	if mapping == nil {
		if b, err = bounded.ReadAll(fh, path, limit); err != nil {
			return nil, err // bounded's errors and the os package's name the file
		}
		limit = limit.Less(int64(len(b)))
	}
	f, err := parseMapped(b, limit)
	if err != nil {
		if mapping != nil {
			munmap(mapping)
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.Path = path
	f.mapping = mapping
	return f, nil
}

// ErrShrank is wrapped by the error of a file that shrank while it was
// being read (the mapping's pages past its new end fault).
var ErrShrank = errors.New("the file shrank while it was being read (re-captured into the same path?)")

// parseMapped is ParseLimit on bytes that may be a mapping of a file that
// shrinks while the header is parsed: the fault that reading past the
// file's new end raises is returned as ErrShrank, not the process's end.
func parseMapped(b []byte, limit bounded.Limit) (f *File, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			fault, ok := p.(interface{ Addr() uintptr })
			if !ok || len(b) == 0 {
				panic(p)
			}
			lo := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
			if a := fault.Addr(); a < lo || a >= lo+uintptr(len(b)) {
				panic(p)
			}
			f, err = nil, ErrShrank
		}
	}()
	return ParseLimit(b, limit)
}

// Close releases the file's mapping. The tensors' Data are set to nil, so a
// late read fails with an index error rather than a fault; a Data slice
// copied out before Close must not be read after it.
func (f *File) Close() error {
	for _, t := range f.Tensors {
		t.Data = nil
	}
	if f.mapping == nil {
		return nil
	}
	m := f.mapping
	f.mapping = nil
	if err := munmap(m); err != nil {
		return fmt.Errorf("%s: unmap: %w", f.Path, err)
	}
	return nil
}

// HeaderCost bounds the memory parsing a header takes, in bytes per header
// byte. Measured on the costliest headers (cost_test.go: a shape of a
// million dimensions, a million tiny metadata entries or tensors, one long
// value): the parse allocates at most 48 bytes a header byte in all (the
// shape's), and its peak RSS grows by at most 29.
const HeaderCost = 64

// Parse parses a whole safetensors file held in b, as ParseLimit does
// without a memory bound.
func Parse(b []byte) (*File, error) { return ParseLimit(b, bounded.Limit{}) }

// ParseLimit parses a whole safetensors file held in b, refusing a header
// whose parse could take more than limit (HeaderCost bytes a header byte)
// before parsing it. The tensors' Data slice b (zero-copy): b must not
// change while they are in use.
func ParseLimit(b []byte, limit bounded.Limit) (*File, error) {
	if len(b) < 8 {
		return nil, fmt.Errorf("file is %d bytes, too short for the 8-byte header length (truncated?)", len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > MaxHeaderSize {
		return nil, fmt.Errorf("header length %d exceeds the %d-byte limit (corrupt length, or not a safetensors file)", n, MaxHeaderSize)
	}
	if n > uint64(len(b)-8) {
		return nil, fmt.Errorf("header length %d runs past the end of the file (%d bytes after the length field; truncated?)", n, len(b)-8)
	}
	if cost := n * HeaderCost; limit.Bytes > 0 && cost > uint64(limit.Bytes) {
		return nil, limit.Refuse(fmt.Sprintf("its %d-byte header could take %s to parse (%d bytes a header byte)", n, bounded.FormatBytes(int64(cost)), HeaderCost))
	}
	header := b[8 : 8+n]
	buf := b[8+n:]
	buf = buf[:len(buf):len(buf)]

	entries, err := parseHeader(header)
	if err != nil {
		return nil, err
	}
	f := &File{Metadata: map[string]string{}, Tensors: map[string]*tensor.Tensor{}}
	type span struct {
		name       string
		begin, end uint64
	}
	spans := make([]span, 0, len(entries))
	for _, e := range entries {
		if e.key == metadataKey {
			if f.Metadata, err = parseMetadata(e.value); err != nil {
				return nil, err
			}
			continue
		}
		t, begin, end, err := parseEntry(e.key, e.value, uint64(len(buf)))
		if err != nil {
			return nil, err
		}
		t.Data = buf[begin:end:end]
		f.Tensors[e.key] = t
		spans = append(spans, span{e.key, begin, end})
	}

	// The tensors must tile the buffer: sorted by offset, each starts where
	// the previous one ended, and the last ends at the end of the file.
	sort.Slice(spans, func(i, j int) bool {
		a, b := spans[i], spans[j]
		if a.begin != b.begin {
			return a.begin < b.begin
		}
		if a.end != b.end {
			return a.end < b.end
		}
		return a.name < b.name
	})
	var pos uint64
	prev := ""
	for _, s := range spans {
		switch {
		case s.begin < pos:
			return nil, fmt.Errorf("tensor %q: data_offsets [%d, %d] overlap tensor %q, which ends at %d", s.name, s.begin, s.end, prev, pos)
		case s.begin > pos:
			where := "at the start of the data buffer"
			if prev != "" {
				where = fmt.Sprintf("after tensor %q", prev)
			}
			return nil, fmt.Errorf("tensor %q: data_offsets [%d, %d] leave a hole: bytes [%d, %d) %s belong to no tensor", s.name, s.begin, s.end, pos, s.begin, where)
		}
		pos = s.end
		prev = s.name
		f.Names = append(f.Names, s.name)
	}
	if pos != uint64(len(buf)) {
		after := "the header"
		if prev != "" {
			after = fmt.Sprintf("the last tensor %q", prev)
		}
		return nil, fmt.Errorf("%d bytes of data after %s belong to no tensor (the data buffer is %d bytes, tensors cover %d)", uint64(len(buf))-pos, after, len(buf), pos)
	}
	return f, nil
}

type rawEntry struct {
	key   string
	value []byte // a subslice of the header
}

// parseHeader splits the header object into its entries, keeping their order
// and rejecting repeated names (a JSON decoder would silently keep the last).
func parseHeader(h []byte) ([]rawEntry, error) {
	if !utf8.Valid(h) {
		return nil, errors.New("header is not valid UTF-8")
	}
	trimmed := bytes.TrimLeft(h, " \t\r\n")
	if len(trimmed) == 0 {
		return nil, errors.New("header is empty, not a JSON object")
	}
	if trimmed[0] != '{' {
		if json.Valid(bytes.TrimRight(trimmed, " \t\r\n")) {
			return nil, fmt.Errorf("header is JSON but not an object (it starts with %q)", trimmed[0])
		}
		return nil, fmt.Errorf("header is not JSON (it starts with %q)", snippet(trimmed))
	}
	if !json.Valid(h) {
		var e any
		err := json.Unmarshal(h, &e)
		return nil, fmt.Errorf("header is not JSON: %v", err)
	}
	var out []rawEntry
	seen := map[string]bool{}
	err := eachMember(h, func(key string, v []byte) error {
		if seen[key] {
			return fmt.Errorf("header names %q twice", key)
		}
		seen[key] = true
		out = append(out, rawEntry{key, v})
		return nil
	})
	return out, err
}

func snippet(b []byte) string {
	if len(b) > 16 {
		b = b[:16]
	}
	return string(b)
}

func parseMetadata(v []byte) (map[string]string, error) {
	meta := map[string]string{}
	if string(v) == "null" {
		return meta, nil
	}
	if v[0] != '{' {
		return nil, fmt.Errorf("%s is %s, not an object of strings", metadataKey, jsonKind(v))
	}
	err := eachMember(v, func(k string, rv []byte) error {
		// The format allows only strings (a decoder would take null too).
		if rv[0] != '"' {
			return fmt.Errorf("%s[%q] is %s, not a string (the format allows only string values; write numbers as strings)", metadataKey, k, jsonKind(rv))
		}
		if _, dup := meta[k]; dup {
			return fmt.Errorf("%s names %q twice", metadataKey, k)
		}
		meta[k] = unquote(rv)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return meta, nil
}

// jsonKind names the kind of a JSON value for error messages.
func jsonKind(v []byte) string {
	t := bytes.TrimSpace(v)
	if len(t) == 0 {
		return "empty"
	}
	switch t[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number (" + snippet(t) + ")"
}

// parseEntry validates one tensor's record against a data buffer of bufLen
// bytes and returns the tensor (without Data) and its byte range.
func parseEntry(name string, v []byte, bufLen uint64) (t *tensor.Tensor, begin, end uint64, err error) {
	fail := func(format string, args ...any) (*tensor.Tensor, uint64, uint64, error) {
		return nil, 0, 0, fmt.Errorf("tensor %q: %s", name, fmt.Sprintf(format, args...))
	}
	var e struct {
		DType       *string        `json:"dtype"`
		Shape       *[]json.Number `json:"shape"`
		DataOffsets *[]json.Number `json:"data_offsets"`
	}
	if t := bytes.TrimSpace(v); len(t) == 0 || t[0] != '{' {
		return fail("header entry is %s, not an object with dtype, shape and data_offsets", jsonKind(v))
	}
	if err := entryKeysOnce(v); err != nil {
		return fail("%v", err)
	}
	if err := json.Unmarshal(v, &e); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			want := "a string"
			if te.Type.Kind() == reflect.Slice {
				want = "an array of integers"
			}
			return fail("%s is a %s in the header, want %s", te.Field, te.Value, want)
		}
		return fail("bad header entry: %v", err)
	}
	switch {
	case e.DType == nil:
		return fail("header entry has no dtype")
	case e.Shape == nil:
		return fail("header entry has no shape (a scalar has shape [])")
	case e.DataOffsets == nil:
		return fail("header entry has no data_offsets")
	}
	dt, err := tensor.ParseDType(*e.DType)
	if err != nil {
		return fail("unknown dtype %q (want one of %s)", *e.DType, dtypeList())
	}
	shape := make([]int, len(*e.Shape))
	for i, d := range *e.Shape {
		n, err := d.Int64()
		if err != nil {
			return fail("shape[%d] = %s is not an integer", i, d)
		}
		if n < 0 {
			return fail("shape[%d] = %d is negative", i, n)
		}
		shape[i] = int(n)
	}
	offs := *e.DataOffsets
	if len(offs) != 2 {
		return fail("data_offsets has %d numbers, want 2 ([begin, end])", len(offs))
	}
	var be [2]uint64
	for i, o := range offs {
		n, err := o.Int64()
		if err != nil {
			return fail("data_offsets[%d] = %s is not an integer", i, o)
		}
		if n < 0 {
			return fail("data_offsets[%d] = %d is negative", i, n)
		}
		be[i] = uint64(n)
	}
	begin, end = be[0], be[1]
	if end < begin {
		return fail("data_offsets [%d, %d] are reversed (end before begin)", begin, end)
	}
	if end > bufLen {
		return fail("data_offsets [%d, %d] run past the end of the data buffer (%d bytes; truncated?)", begin, end, bufLen)
	}
	nbytes, ok := tensor.ByteSize(shape, dt.Size())
	if !ok {
		return fail("shape %v of %s is too large (2^63 bytes or more)", shape, dt)
	}
	if nbytes != end-begin {
		return fail("data_offsets [%d, %d] give %d bytes, but shape %v of %s needs %d", begin, end, end-begin, shape, dt, nbytes)
	}
	return &tensor.Tensor{DType: dt, Shape: shape}, begin, end, nil
}

// entryFields are the fields of a tensor's header entry.
var entryFields = [...]string{"dtype", "shape", "data_offsets"}

// entryKeysOnce refuses a tensor entry that names a key twice. The entry
// is decoded by encoding/json, which keeps the last of two members and
// matches field names regardless of case ("DType" is dtype), so a key that
// differs from a field's name only in case counts as that field.
func entryKeysOnce(v []byte) error {
	var seen [len(entryFields)]string // the key each field was given as
	var others []string
	return eachMember(v, func(key string, _ []byte) error {
		for i, f := range entryFields {
			if !strings.EqualFold(key, f) {
				continue
			}
			switch {
			case seen[i] == "":
				seen[i] = key
				return nil
			case seen[i] == key && key == f:
				return fmt.Errorf("header entry names %q twice", f)
			default:
				other := key
				if other == f {
					other = seen[i]
				}
				return fmt.Errorf("header entry names %q twice (once as %q)", f, other)
			}
		}
		for _, o := range others {
			if o == key {
				return fmt.Errorf("header entry names %q twice", key)
			}
		}
		others = append(others, key)
		return nil
	})
}

// dtypes is every dtype the reader accepts, in the spec's order.
var dtypes = []tensor.DType{
	tensor.F64, tensor.F32, tensor.F16, tensor.BF16,
	tensor.F8E4M3, tensor.F8E5M2, tensor.F8E8M0,
	tensor.I64, tensor.I32, tensor.I16, tensor.I8,
	tensor.U64, tensor.U32, tensor.U16, tensor.U8, tensor.Bool,
}

func dtypeList() string {
	s := make([]string, len(dtypes))
	for i, d := range dtypes {
		s[i] = string(d)
	}
	return strings.Join(s, ", ")
}

// Encode writes a safetensors file holding tensors and meta to w. The output
// is deterministic: tensors in name order (their data in the same order),
// metadata keys sorted, no insignificant whitespace except the spaces that
// pad the header to a multiple of 8 bytes so the data buffer is aligned.
// An empty or nil meta writes no __metadata__ entry.
func Encode(w io.Writer, meta map[string]string, tensors map[string]*tensor.Tensor) error {
	names := make([]string, 0, len(tensors))
	for name, t := range tensors {
		if name == metadataKey {
			return fmt.Errorf("tensor name %q is reserved for the metadata", name)
		}
		if !utf8.ValidString(name) {
			return fmt.Errorf("tensor name %q is not valid UTF-8 (JSON would change it)", name)
		}
		if t == nil {
			return fmt.Errorf("tensor %q is nil", name)
		}
		if err := t.Check(); err != nil {
			return fmt.Errorf("tensor %q: %v", name, err)
		}
		names = append(names, name)
	}
	sort.Strings(names)
	for k, v := range meta {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return fmt.Errorf("%s[%q] = %q is not valid UTF-8 (JSON would change it)", metadataKey, k, v)
		}
	}

	var h bytes.Buffer
	h.WriteByte('{')
	first := true
	comma := func() {
		if !first {
			h.WriteByte(',')
		}
		first = false
	}
	if len(meta) > 0 {
		keys := make([]string, 0, len(meta))
		for k := range meta {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		comma()
		writeJSONString(&h, metadataKey)
		h.WriteString(":{")
		for i, k := range keys {
			if i > 0 {
				h.WriteByte(',')
			}
			writeJSONString(&h, k)
			h.WriteByte(':')
			writeJSONString(&h, meta[k])
		}
		h.WriteByte('}')
	}
	var off uint64
	for _, name := range names {
		t := tensors[name]
		comma()
		writeJSONString(&h, name)
		fmt.Fprintf(&h, `:{"dtype":"%s","shape":[`, t.DType)
		for i, d := range t.Shape {
			if i > 0 {
				h.WriteByte(',')
			}
			fmt.Fprintf(&h, "%d", d)
		}
		end := off + uint64(len(t.Data))
		fmt.Fprintf(&h, `],"data_offsets":[%d,%d]}`, off, end)
		off = end
	}
	h.WriteByte('}')
	for (8+h.Len())%8 != 0 {
		h.WriteByte(' ')
	}
	if h.Len() > MaxHeaderSize {
		return fmt.Errorf("header would be %d bytes, over the %d-byte limit readers enforce", h.Len(), MaxHeaderSize)
	}

	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(h.Len()))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	if _, err := w.Write(h.Bytes()); err != nil {
		return err
	}
	for _, name := range names {
		if _, err := w.Write(tensors[name].Data); err != nil {
			return err
		}
	}
	return nil
}

// writeJSONString writes s as a JSON string without HTML escaping (names
// like "a<b" stay readable, as other writers leave them).
func writeJSONString(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)       // a string always encodes; bytes.Buffer never fails
	b.Truncate(b.Len() - 1) // Encode appends a newline
}

// WriteOptions control Write.
type WriteOptions struct {
	// Force replaces an existing file at the path; without it Write refuses.
	Force bool
}

// Write writes tensors and meta (as Encode does) to path atomically: into a
// temporary file in the same directory (".NAME.kcheck-tmp-*", locked while
// it is written; see RemoveStaleTemps), fsync'd, then moved into place, so a
// crash leaves the old file or the new one, never half of one. Without
// opts.Force an existing path is an error (checked atomically where the file
// system supports hard links).
//
// Writing over a file that is open through Open is safe: the new file
// replaces the directory entry and the old mapping keeps the old bytes.
func Write(path string, meta map[string]string, tensors map[string]*tensor.Tensor, opts WriteOptions) (err error) {
	if !opts.Force {
		if _, err := os.Lstat(path); err == nil {
			return fmt.Errorf("%s: file exists (refusing to overwrite it; use Force)", path)
		}
	}
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+tempMarker+"*")
	if err != nil {
		return err
	}
	// Held until the file is closed: a writer killed before its rename
	// leaves an unlocked file, which RemoveStaleTemps removes.
	if _, err := filelock.TryLock(tmp); err != nil && !errors.Is(err, filelock.ErrUnsupported) {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	tmpName := tmp.Name()
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmpName)
		}
	}()
	bw := bufio.NewWriterSize(tmp, 1<<20)
	if err := Encode(bw, meta, tensors); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("%s: fsync: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if opts.Force {
		err = os.Rename(tmpName, path)
	} else {
		// A hard link fails if path appeared since the check above;
		// rename would replace it.
		err = os.Link(tmpName, path)
		switch {
		case err == nil:
			os.Remove(tmpName)
		case errors.Is(err, fs.ErrExist):
			err = fmt.Errorf("%s: file exists (refusing to overwrite it; use Force)", path)
		default: // no hard links here: fall back to rename
			err = os.Rename(tmpName, path)
		}
	}
	if err != nil {
		return err
	}
	syncDir(dir)
	return nil
}

// syncDir makes a rename durable; failure only weakens durability, so it is
// not reported.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

package check

import (
	"context"
	"errors"
	"fmt"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/kcheck-dev/kcheck/internal/bounded"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/npy"
	"github.com/kcheck-dev/kcheck/internal/safetensors"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Load reads an evidence file into a Capture within the default memory
// bound; closeFn releases its mapping.
func Load(path string, extraMeta map[string]string) (c evidence.Capture, closeFn func(), err error) {
	return LoadContext(context.Background(), path, extraMeta, 0)
}

// LoadContext reads an evidence file into a Capture under ctx (opening it
// and every read give up when ctx is done: a named pipe with no writer)
// and within the memory bound maxMemory (0: DefaultMaxMemory(), negative:
// none): a .safetensors file of known size is mapped, not read, and its
// header's parse is charged against the bound; a stream, a file that stats
// as 0 bytes and the arrays of a .npy/.npz are read into memory, at most
// the bound of them. closeFn releases the mapping.
func LoadContext(ctx context.Context, path string, extraMeta map[string]string, maxMemory int64) (c evidence.Capture, closeFn func(), err error) {
	c = evidence.Capture{Name: path, Metadata: map[string]string{}}
	closeFn = func() {}
	limit := readLimit(maxMemory)
	switch strings.ToLower(filepath.Ext(path)) {
	case ".npy", ".npz":
		ts, err := npy.ReadFileContext(ctx, path, limit)
		if errors.Is(err, npy.ErrTooLarge) {
			err = fmt.Errorf("%w (the memory bound; raise it with --max-memory)", err)
		}
		if err != nil {
			return c, closeFn, err
		}
		for k, v := range extraMeta {
			c.Metadata[k] = v
		}
		if c.Notes, err = numpyDTypes(c.Metadata, ts); err != nil {
			return c, closeFn, fmt.Errorf("%s: %w", path, err)
		}
		c.Tensors = ts
	default:
		f, err := safetensors.OpenContext(ctx, path, bounded.Memory(limit))
		if err != nil {
			return c, closeFn, err
		}
		closeFn = func() { f.Close() }
		c.Tensors = f.Tensors
		for k, v := range f.Metadata {
			c.Metadata[k] = v
		}
	}
	for k, v := range extraMeta {
		c.Metadata[k] = v
	}
	return c, closeFn, nil
}

// DTypeKey prefixes the metadata key that declares the dtype of a numpy
// array of bits: kcheck.dtype.q = BF16 (--set kcheck.dtype.q=BF16).
const DTypeKey = "kcheck.dtype."

// numpyDTypes gives the arrays of a numpy file that hold bits, which is how
// numpy saves bfloat16 and float8 (internal/npy: U16 and U8), the dtype
// they hold: the one declared with kcheck.dtype.NAME, else, when the
// contract of the tensor does not take the bits' own dtype, the one dtype
// of that width it takes that numpy has no dtype for (q: BF16, as F16
// would be saved as '<f2'). It says what it decided, in notes.
func numpyDTypes(meta map[string]string, ts map[string]*tensor.Tensor) ([]string, error) {
	var notes []string
	var declared []string
	for key := range meta {
		if strings.HasPrefix(key, DTypeKey) {
			declared = append(declared, key)
		}
	}
	sort.Strings(declared)
	for _, key := range declared {
		name, v := strings.TrimPrefix(key, DTypeKey), meta[key]
		t, ok := ts[name]
		if !ok {
			return nil, fmt.Errorf("metadata %s = %s: the file holds no array %s", key, v, name)
		}
		d, err := tensor.ParseDType(v)
		if err != nil {
			return nil, fmt.Errorf("metadata %s: %v", key, err)
		}
		if t.DType != tensor.U16 && t.DType != tensor.U8 {
			return nil, fmt.Errorf("metadata %s = %s: array %s holds %s numbers, not bits (a dtype is declared for uint16 or uint8 arrays and ml_dtypes' raw records)", key, v, name, t.DType)
		}
		if d.Size() != t.DType.Size() {
			return nil, fmt.Errorf("metadata %s = %s: array %s holds %d-byte values, %s is %d bytes", key, v, name, t.DType.Size(), d, d.Size())
		}
		ts[name] = &tensor.Tensor{DType: d, Shape: t.Shape, Data: t.Data}
	}
	names := make([]string, 0, len(ts))
	for name := range ts {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t := ts[name]
		if _, ok := meta[DTypeKey+name]; ok || (t.DType != tensor.U16 && t.DType != tensor.U8) {
			continue
		}
		spec, ok := contractSpec(meta, name)
		if !ok || slices.Contains(spec.DTypes, t.DType) {
			continue // not a contract tensor, or it takes the bits as they are
		}
		// Bits stand for a dtype numpy lacks: a float16 array is saved
		// as '<f2', never as bits.
		var fits []tensor.DType
		for _, d := range spec.DTypes {
			if d.Size() == t.DType.Size() && !numpyHas[d] {
				fits = append(fits, d)
			}
		}
		switch len(fits) {
		case 0:
			continue // the contract's dtype check says what it wants
		case 1:
			ts[name] = &tensor.Tensor{DType: fits[0], Shape: t.Shape, Data: t.Data}
			notes = append(notes, fmt.Sprintf("numpy array %s holds %d-byte bits (uint%d, or ml_dtypes' raw records): read as %s, the contract's %d-byte dtype for it (declare another with --set %s%s=DTYPE)",
				name, t.DType.Size(), 8*t.DType.Size(), fits[0], t.DType.Size(), DTypeKey, name))
		default:
			return nil, fmt.Errorf("numpy array %s holds %d-byte bits (uint%d, or ml_dtypes' raw records), which the contract takes as %s: say which with --set %s%s=%s",
				name, t.DType.Size(), 8*t.DType.Size(), joinDTypes(fits), DTypeKey, name, fits[0])
		}
	}
	return notes, nil
}

// numpyHas are the contract dtypes numpy has a dtype of its own for.
var numpyHas = map[tensor.DType]bool{tensor.F64: true, tensor.F32: true, tensor.F16: true,
	tensor.I64: true, tensor.I32: true, tensor.I16: true, tensor.I8: true,
	tensor.U64: true, tensor.U32: true, tensor.U16: true, tensor.U8: true, tensor.Bool: true}

// contractSpec is the contract's spec of tensor name in a capture of the
// kernel meta names (a pipeline's "<stage>.<tensor>" by its stage's).
func contractSpec(meta map[string]string, name string) (kernel.TensorSpec, bool) {
	kname := meta["kcheck.kernel"]
	if kname == "pipeline" {
		prefix, rest, ok := strings.Cut(name, ".")
		if !ok {
			return kernel.TensorSpec{}, false
		}
		kname, name = meta["kcheck."+prefix+".kernel"], rest
	}
	k, err := kernel.Lookup(kname)
	if err != nil {
		return kernel.TensorSpec{}, false
	}
	for _, s := range append(append([]kernel.TensorSpec(nil), k.Spec().Inputs...), k.Spec().Outputs...) {
		if s.Name == name {
			return s, true
		}
	}
	return kernel.TensorSpec{}, false
}

func joinDTypes(ds []tensor.DType) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = string(d)
	}
	return strings.Join(s, " or ")
}

// Expand turns the command line's FILE|DIR arguments into evidence files:
// a directory contributes every *.safetensors, *.npy and *.npz regular
// file under it (a symlink counts as what it points to), recursively, in
// lexical order. Anything else there under such a name (a named pipe, a
// device, a socket, a dangling symlink) is skipped with a note: opening a
// pipe waits for a writer, a device may never end, and nobody put them in
// a capture directory to be checked. A file named on the command line is
// read whatever it is (`kcheck check <(python dump.py)`), within the
// memory bound and the deadline.
func Expand(args []string) (files, notes []string, err error) {
	for _, a := range args {
		st, err := os.Stat(a)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %v", a, err)
		}
		if !st.IsDir() {
			files = append(files, a)
			continue
		}
		var found []string
		skippedBefore := len(notes)
		err = filepath.WalkDir(a, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			switch strings.ToLower(filepath.Ext(path)) {
			case ".safetensors", ".npy", ".npz":
			default:
				return nil
			}
			if d.IsDir() {
				return nil
			}
			mode := d.Type()
			if mode&fs.ModeSymlink != 0 {
				target, err := os.Stat(path)
				if err != nil {
					notes = append(notes, fmt.Sprintf("%s: skipped: %v", path, err))
					return nil
				}
				if target.IsDir() {
					return nil // a directory under a capture's name: not walked into, as WalkDir does not follow links
				}
				mode = target.Mode().Type()
			}
			if mode.IsRegular() {
				found = append(found, path)
			} else {
				notes = append(notes, fmt.Sprintf("%s: %s, not a regular file: skipped", path, fileKind(mode)))
			}
			return nil
		})
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %v", a, err)
		}
		sort.Strings(found)
		if len(found) == 0 {
			if skipped := notes[skippedBefore:]; len(skipped) > 0 {
				return nil, nil, fmt.Errorf("%s: directory holds no regular .safetensors, .npy or .npz file (%s)", a, strings.Join(skipped, "; "))
			}
			return nil, nil, fmt.Errorf("%s: directory holds no .safetensors, .npy or .npz file", a)
		}
		files = append(files, found...)
	}
	return files, notes, nil
}

// fileKind names a file mode that is not a regular file's.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m&fs.ModeIrregular != 0:
		return "an irregular file"
	}
	return "a special file"
}

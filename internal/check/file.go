package check

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kcheck-dev/kcheck/internal/bounded"
	"github.com/kcheck-dev/kcheck/internal/npy"
	"github.com/kcheck-dev/kcheck/internal/safetensors"
)

// File checks one evidence file (.safetensors, or .npy/.npz with the
// metadata given in extraMeta since numpy files carry none).
func File(path string, extraMeta map[string]string, opts Options) Result {
	return FileContext(context.Background(), path, extraMeta, opts)
}

// Load reads an evidence file into a Capture within the default memory
// bound; closeFn releases its mapping.
func Load(path string, extraMeta map[string]string) (c Capture, closeFn func(), err error) {
	return LoadContext(context.Background(), path, extraMeta, 0)
}

// LoadContext reads an evidence file into a Capture under ctx (opening it
// and every read give up when ctx is done: a named pipe with no writer)
// and within the memory bound maxMemory (0: DefaultMaxMemory(), negative:
// none): a .safetensors file of known size is mapped, not read, and its
// header's parse is charged against the bound; a stream, a file that stats
// as 0 bytes and the arrays of a .npy/.npz are read into memory, at most
// the bound of them. closeFn releases the mapping.
func LoadContext(ctx context.Context, path string, extraMeta map[string]string, maxMemory int64) (c Capture, closeFn func(), err error) {
	c = Capture{Name: path, Metadata: map[string]string{}}
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

package check

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kcheck-dev/kcheck/internal/npy"
)

// File checks one evidence file (.safetensors, or .npy/.npz with the
// metadata given in extraMeta since numpy files carry none).
func File(path string, extraMeta map[string]string, opts Options) Result {
	c, closeFn, err := loadBounded(path, extraMeta, readLimit(opts.MaxMemory))
	if err != nil {
		return errorResult(path, "", err)
	}
	defer closeFn()
	return Run(c, opts)
}

// Load reads an evidence file into a Capture; closeFn releases its mapping.
func Load(path string, extraMeta map[string]string) (c Capture, closeFn func(), err error) {
	return loadBounded(path, extraMeta, -1)
}

// loadBounded is Load reading at most limit bytes of numpy arrays (limit < 0: no
// bound; a .safetensors file is mapped, not read).
func loadBounded(path string, extraMeta map[string]string, limit int64) (c Capture, closeFn func(), err error) {
	c = Capture{Name: path, Metadata: map[string]string{}}
	closeFn = func() {}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".npy", ".npz":
		ts, err := npy.ReadFileLimit(path, limit)
		if errors.Is(err, npy.ErrTooLarge) {
			err = fmt.Errorf("%w (the memory bound; raise it with --max-memory)", err)
		}
		if err != nil {
			return c, closeFn, err
		}
		c.Tensors = ts
	default:
		f, err := openSafetensors(path, limit)
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
// a directory contributes every *.safetensors, *.npy and *.npz file under it,
// recursively, in lexical order.
func Expand(args []string) ([]string, error) {
	var files []string
	for _, a := range args {
		st, err := os.Stat(a)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", a, err)
		}
		if !st.IsDir() {
			files = append(files, a)
			continue
		}
		var found []string
		err = filepath.WalkDir(a, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			switch strings.ToLower(filepath.Ext(path)) {
			case ".safetensors", ".npy", ".npz":
				if !d.IsDir() {
					found = append(found, path)
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %v", a, err)
		}
		sort.Strings(found)
		if len(found) == 0 {
			return nil, fmt.Errorf("%s: directory holds no .safetensors, .npy or .npz file", a)
		}
		files = append(files, found...)
	}
	return files, nil
}

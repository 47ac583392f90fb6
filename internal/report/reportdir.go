package report

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/kcheck-dev/kcheck/internal/filelock"
)

// How a report directory is written. A report is report.md, report.json
// and plots/, and it is written whole or not at all:
//
//   - Every access goes through an os.Root of the directory, so no symbolic
//     link inside it (plots/ pointing elsewhere) leads a write out of it;
//     plots/ must be a real directory, and is refused before any check runs
//     when it is a link.
//   - A writer holds an advisory lock on the directory itself (flock of its
//     descriptor, which leaves nothing in it) from its first look at the
//     directory to its last rename, so two kcheck processes given one
//     directory take turns rather than mix their files (the second then
//     finds the first one's report: refused without --force, replaced whole
//     with it). Where locks are not supported (NFS locks only files open
//     for writing) writers are not kept apart.
//   - The files are written into a staging directory DIR/.kcheck-report-tmp-*
//     and renamed into place, plots/ first and report.md last, so a reader
//     who sees report.md sees everything it links. A staging directory that
//     a killed writer left (the lock says nobody is writing) is removed by
//     the next writer, as are the .report.md.tmp-* files older versions left.
//   - With --force the previous plots/ is replaced as a whole, so no stale
//     PNG of an earlier report stays beside the new one; a plots/ holding
//     anything kcheck does not write is refused rather than deleted.

const stagingPrefix = ".kcheck-report-tmp-"

// lockWait bounds how long a writer waits for another to finish (a writer
// holds the lock only while it checks and renames, well under a second).
// A variable for the tests.
var lockWait = 30 * time.Second

// plotName matches the files kcheck writes into plots/.
var plotName = regexp.MustCompile(`^(\d+-[A-Za-z0-9_.-]*-(along|map)|drift)\.png$`)

// legacyTemp matches the temporary files of writers before the staging
// directory: "." + name + ".tmp-" + CreateTemp's digits.
var legacyTemp = regexp.MustCompile(`^\.(report\.md|report\.json|[^/]+\.png)\.tmp-\d+$`)

// reportDir is an open, locked report directory.
type reportDir struct {
	path string
	root *os.Root
	lock *os.File
}

// openReportDir creates dir if needed, opens it as a root and takes its
// lock (waiting up to lockWait for another writer).
func openReportDir(dir string) (*reportDir, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	d := &reportDir{path: dir, root: root}
	if d.lock, err = root.Open("."); err != nil {
		root.Close()
		return nil, fmt.Errorf("%s: %v", dir, err)
	}
	deadline := time.Now().Add(lockWait)
	for {
		ok, err := filelock.TryLock(d.lock)
		if ok || errors.Is(err, filelock.ErrUnsupported) {
			return d, nil // without locks, writers are not kept apart
		}
		if err == nil && time.Now().After(deadline) {
			err = fmt.Errorf("another kcheck has been writing a report into %s for %v (it holds the directory's lock)", dir, lockWait)
		}
		if err != nil {
			d.close()
			return nil, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (d *reportDir) close() {
	d.lock.Close() // releases the lock
	d.root.Close()
}

// rel is a name inside the directory as the user knows it.
func (d *reportDir) rel(name string) string { return filepath.Join(d.path, filepath.FromSlash(name)) }

// removeStale deletes what killed writers left: staging directories (no
// writer is in one while the lock is ours) and old-style temporary files.
func (d *reportDir) removeStale() error {
	for _, sub := range []string{".", PlotDir} {
		f, err := d.root.Open(sub)
		if err != nil {
			continue // no plots/ yet
		}
		names, _ := f.Readdirnames(-1)
		f.Close()
		for _, n := range names {
			name := path.Join(sub, n)
			if sub == "." && strings.HasPrefix(n, stagingPrefix) || legacyTemp.MatchString(n) {
				if err := d.root.RemoveAll(name); err != nil {
					return fmt.Errorf("removing %s, left by a kcheck that was killed: %v", d.rel(name), err)
				}
			}
		}
	}
	return nil
}

// check reports what would stop a report being written here: without
// force, any part of a report that exists; with it, a report.md or
// report.json that is a directory, and a plots/ holding files kcheck does
// not write. plots/ must be a directory, never a symbolic link.
func (d *reportDir) check(force bool) error {
	for _, n := range []string{MarkdownFile, JSONFile, PlotDir} {
		fi, err := d.root.Lstat(n)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		switch {
		case n == PlotDir && fi.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("%s is a symbolic link: kcheck writes no report through a link (remove it or choose another directory)", d.rel(n))
		case n == PlotDir && !fi.IsDir():
			return fmt.Errorf("%s is not a directory", d.rel(n))
		case !force:
			return fmt.Errorf("%s exists: not overwriting it (use --force)", d.rel(n))
		case n != PlotDir && fi.IsDir():
			return fmt.Errorf("%s is a directory: not replacing it", d.rel(n))
		case n == PlotDir:
			if err := d.checkPlots(); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkPlots refuses to replace a plots/ that holds anything but kcheck's
// own plots (and the temporary files of its killed writers).
func (d *reportDir) checkPlots() error {
	f, err := d.root.Open(PlotDir)
	if err != nil {
		return err
	}
	defer f.Close()
	entries, err := f.ReadDir(-1)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || !plotName.MatchString(e.Name()) && !legacyTemp.MatchString(e.Name()) {
			return fmt.Errorf("%s was not written by kcheck: not replacing %s (move it, or choose another directory)", d.rel(path.Join(PlotDir, e.Name())), d.rel(PlotDir))
		}
	}
	return nil
}

// stage makes an empty staging directory and returns its name.
func (d *reportDir) stage() (string, error) {
	for {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", err
		}
		name := stagingPrefix + hex.EncodeToString(b[:])
		err := d.root.Mkdir(name, 0o755)
		if err == nil {
			return name, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("%s: %v", d.path, err)
		}
	}
}

// install writes files (names relative to the directory, slash-separated)
// into a staging directory and renames them into place: plots/ first,
// replacing the old one whole with force, then report.json, then report.md.
// Without force a hard link puts each file in place, which fails if the
// name appeared meanwhile. It returns the paths written.
func (d *reportDir) install(files map[string][]byte, force bool) ([]string, error) {
	staging, err := d.stage()
	if err != nil {
		return nil, err
	}
	defer d.root.RemoveAll(staging)
	names := make([]string, 0, len(files))
	hasPlots := false
	for n := range files {
		names = append(names, n)
		hasPlots = hasPlots || strings.HasPrefix(n, PlotDir+"/")
	}
	sort.Strings(names)
	if hasPlots {
		if err := d.root.Mkdir(path.Join(staging, PlotDir), 0o755); err != nil {
			return nil, err
		}
	}
	for _, n := range names {
		if err := d.writeFile(path.Join(staging, n), files[n]); err != nil {
			return nil, fmt.Errorf("%s: %v", d.rel(n), err)
		}
	}
	if _, err := d.root.Lstat(PlotDir); err == nil {
		if !force {
			return nil, fmt.Errorf("%s exists: not overwriting it (use --force)", d.rel(PlotDir))
		}
		if err := d.root.Rename(PlotDir, path.Join(staging, "old-"+PlotDir)); err != nil {
			return nil, err
		}
	}
	if hasPlots {
		if err := d.root.Rename(path.Join(staging, PlotDir), PlotDir); err != nil {
			return nil, err
		}
	}
	for _, n := range []string{JSONFile, MarkdownFile} {
		if _, ok := files[n]; ok {
			if err := d.place(path.Join(staging, n), n, force); err != nil {
				return nil, err
			}
		}
	}
	if f, err := d.root.Open("."); err == nil {
		f.Sync() // the renames survive a crash; failing only weakens that
		f.Close()
	}
	written := make([]string, len(names))
	for i, n := range names {
		written[i] = d.rel(n)
	}
	return written, nil
}

// writeFile writes a new file, fsync'd, mode 0644.
func (d *reportDir) writeFile(name string, data []byte) error {
	f, err := d.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(0o644)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// place moves a staged file to name: a rename with force (replacing the
// entry, never writing through a link there), a hard link without it.
func (d *reportDir) place(staged, name string, force bool) error {
	if force {
		return d.root.Rename(staged, name)
	}
	err := d.root.Link(staged, name)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("%s exists: not overwriting it (use --force)", d.rel(name))
	}
	// A file system without hard links: check, then rename.
	if _, serr := d.root.Lstat(name); serr == nil {
		return fmt.Errorf("%s exists: not overwriting it (use --force)", d.rel(name))
	}
	return d.root.Rename(staged, name)
}

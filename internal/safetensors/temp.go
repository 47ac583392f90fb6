package safetensors

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"time"

	"github.com/kcheck-dev/kcheck/internal/filelock"
)

// Write's temporary files are named "." + NAME + tempMarker + digits and
// locked (internal/filelock) while they are written, so that what a killed
// writer left can be told from a file being written: the kernel drops the
// lock of a killed process. RemoveStaleTemps removes them.
const tempMarker = ".kcheck-tmp-"

var (
	tempName = regexp.MustCompile(`^\..+\.kcheck-tmp-\d+$`)
	// legacyTempName: what Write named them before (".NAME.tmp-digits"),
	// never locked; only captures (.safetensors) are taken for ours.
	legacyTempName = regexp.MustCompile(`^\..+\.safetensors\.tmp-\d+$`)
)

// staleAge is how long a temporary file must have gone unwritten before it
// counts as left behind: it covers the moments between creating a file and
// locking it, and between closing it and renaming it. A variable for the
// tests.
var staleAge = time.Minute

// RemoveStaleTemps removes from dir the temporary files of Write that no
// live writer holds (their writer was killed, SIGKILL or a crash) and that
// have not been written for staleAge, and returns their paths. Nothing is
// removed where the file system has no locks: a live writer could not be
// told from a dead one.
func RemoveStaleTemps(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, e := range entries {
		if !e.Type().IsRegular() || !tempName.MatchString(e.Name()) && !legacyTempName.MatchString(e.Name()) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		ok, err := removeIfStale(p)
		if errors.Is(err, filelock.ErrUnsupported) {
			return removed, nil
		}
		if ok {
			removed = append(removed, p)
		}
	}
	sort.Strings(removed)
	return removed, nil
}

// removeIfStale removes the temporary file p when no one holds it and it
// has not been written for staleAge (an error: gone meanwhile, or not ours
// to judge).
func removeIfStale(p string) (bool, error) {
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		return false, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || time.Since(fi.ModTime()) < staleAge {
		return false, err
	}
	if ok, err := filelock.TryLock(f); !ok || err != nil {
		return false, err
	}
	return os.Remove(p) == nil, nil // under the lock: no writer starts on it
}

// Package filelock takes advisory locks on open files, so that two kcheck
// processes writing into one directory (two runs given the same --report
// directory, shards sharing an --out directory) can tell whether a file is
// in use by a live writer: the kernel drops a lock when its holder exits,
// SIGKILL included, so a file nobody holds a lock on belongs to no one.
package filelock

import (
	"errors"
	"os"
)

// ErrUnsupported is returned where the platform or file system has no
// advisory locks for f (NFS, for one, locks only files open for writing);
// callers then go on without one.
var ErrUnsupported = errors.New("advisory file locks are not supported here")

// TryLock takes an exclusive lock on f without waiting. It returns false
// when another open file description holds one (another process, or
// another os.File in this one).
func TryLock(f *os.File) (bool, error) { return tryLock(f) }

// Unlock releases f's lock (closing f releases it too).
func Unlock(f *os.File) error { return unlock(f) }

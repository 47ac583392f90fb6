//go:build !unix

package bounded

import "io/fs"

// releaseOpen waits for an open still pending in the background: without
// FIFOs there is nothing to release.
func releaseOpen(path string, mode fs.FileMode, done <-chan opened) opened { return <-done }

//go:build !unix || aix

package filelock

import "os"

func tryLock(*os.File) (bool, error) { return false, ErrUnsupported }

func unlock(*os.File) error { return nil }

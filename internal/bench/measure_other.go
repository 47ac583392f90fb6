//go:build !linux

package bench

import (
	"errors"
	"time"
)

// Proc is what Measure saw of one child process.
type Proc struct {
	Wall, CPU float64
	VmHWM     int64
	Exit      int
	Stdout    []byte
	Stderr    string
}

// Measure needs Linux: the peak RSS is the child's VmHWM, read through
// ptrace's exit stop and /proc.
func Measure(argv, env []string, timeout time.Duration) (Proc, error) {
	return Proc{}, errors.New("the whole-check benchmark needs Linux (ptrace and /proc for each child's peak RSS)")
}

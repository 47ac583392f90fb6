package check

import (
	"errors"
	"fmt"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"runtime/debug"
	"sort"
	"unsafe"

	"github.com/kcheck-dev/kcheck/reference/parallel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// A capture's tensors are views into a read-only mapping of its file. If
// the file shrinks while it is checked (re-capturing into the same path:
// safetensors' save_file opens it with truncation, then writes), reading
// a page past its new end raises SIGBUS. With panic-on-fault on (Run, the
// workers of reference/parallel, Guard) the runtime panics instead of
// ending the process, with a value whose Addr is the faulting address;
// if that address lies in one of the capture's tensors, the file shrank.

// ErrFileShrank is wrapped by the error of a check whose file shrank
// while it was being checked.
var ErrFileShrank = errors.New("the file shrank while it was being checked")

// faultAddr returns the address of a memory fault that p (a recovered
// value, or a worker's *parallel.Panic) reports, if it is one.
func faultAddr(p any) (uintptr, bool) {
	if wp, ok := p.(*parallel.Panic); ok {
		p = wp.Value
	}
	f, ok := p.(interface{ Addr() uintptr })
	if !ok {
		return 0, false
	}
	return f.Addr(), true
}

// faultedTensor names the tensor of ts whose bytes hold addr ("" if none).
func faultedTensor(ts map[string]*tensor.Tensor, addr uintptr) string {
	names := make([]string, 0, len(ts))
	for name := range ts {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		d := ts[name].Data
		if len(d) == 0 {
			continue
		}
		if lo := uintptr(unsafe.Pointer(unsafe.SliceData(d))); addr >= lo && addr < lo+uintptr(len(d)) {
			return name
		}
	}
	return ""
}

// panicError turns a panic recovered while checking a capture whose tensors
// are ts into the result's error: the file shrinking when the fault is in
// one of them, else an internal error (a kcheck bug) at site.
func panicError(p any, ts map[string]*tensor.Tensor, site string) error {
	if addr, ok := faultAddr(p); ok {
		if name := faultedTensor(ts, addr); name != "" {
			return fmt.Errorf("tensor %s could no longer be read: %w (a re-capture into the same path truncates it first); check it again once it is written", name, ErrFileShrank)
		}
	}
	if wp, ok := p.(*parallel.Panic); ok {
		p, site = wp.Value, wp.Site
	}
	return fmt.Errorf("%s%v at %s (a kcheck bug: please report it with this file)", InternalErrorPrefix, p, site)
}

// Guard runs fn, which reads c's tensors outside Run (a shrink, the
// context lengths a diagnosis reports), with panic-on-fault on, and
// returns the error of a fault in c's tensors (ErrFileShrank) instead of
// the process ending; any other panic goes on.
func Guard(c evidence.Capture, fn func()) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			if addr, ok := faultAddr(p); ok {
				if name := faultedTensor(c.Tensors, addr); name != "" {
					err = fmt.Errorf("%s: tensor %s could no longer be read: %w (a re-capture into the same path truncates it first)", c.Name, name, ErrFileShrank)
					return
				}
			}
			panic(p)
		}
	}()
	fn()
	return nil
}

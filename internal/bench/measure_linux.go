package bench

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Proc is what Measure saw of one child process.
type Proc struct {
	Wall   float64 // seconds from the start to the exit
	CPU    float64 // user + system seconds, all threads (rusage)
	VmHWM  int64   // peak resident set size in bytes, read from /proc at the exit
	Exit   int     // exit status; -1 when killed by a signal
	Stdout []byte
	Stderr string // its tail
}

const (
	ptraceOTraceExit = 0x40     // PTRACE_O_TRACEEXIT: stop the child as it exits
	ptraceOExitKill  = 0x100000 // PTRACE_O_EXITKILL: kill it if we die first
	ptraceEventExit  = 6        // PTRACE_EVENT_EXIT
)

// Measure runs argv with env and returns its wall and CPU time and its peak
// RSS. The peak is the child's own VmHWM, read from /proc/PID/status while
// the child is stopped at its exit (ptrace's exit event), when its memory
// is still mapped. Not getrusage's ru_maxrss: Go starts children with
// vfork, and exec records the parent's high-water mark as the child's
// maxrss (see internal/cli/rss_test.go), so a child of a large parent would
// read at least the parent's size. Only the exec and the exit stop the
// child, and signals to its main thread, which are passed on at once.
func Measure(argv, env []string, timeout time.Duration) (Proc, error) {
	// Every ptrace request must come from the thread that started the child.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var p Proc
	stdout, err := os.CreateTemp("", "kcheck-bench-stdout-")
	if err != nil {
		return p, err
	}
	defer os.Remove(stdout.Name())
	defer stdout.Close()
	stderr, err := os.CreateTemp("", "kcheck-bench-stderr-")
	if err != nil {
		return p, err
	}
	defer os.Remove(stderr.Name())
	defer stderr.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Ptrace: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return p, err
	}
	defer cmd.Process.Release()
	pid := cmd.Process.Pid
	var ws syscall.WaitStatus
	var ru syscall.Rusage
	if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil || !ws.Stopped() {
		cmd.Process.Kill()
		return p, fmt.Errorf("%s: not stopped at its exec (%v, %v)", argv[0], err, ws)
	}
	if err := syscall.PtraceSetOptions(pid, ptraceOTraceExit|ptraceOExitKill); err != nil {
		cmd.Process.Kill()
		return p, fmt.Errorf("ptrace %s: %v", argv[0], err)
	}
	timer := time.AfterFunc(timeout, func() { syscall.Kill(pid, syscall.SIGKILL) })
	defer timer.Stop()
	if err := syscall.PtraceCont(pid, 0); err != nil {
		cmd.Process.Kill()
		return p, fmt.Errorf("ptrace %s: %v", argv[0], err)
	}
	for {
		if _, err := syscall.Wait4(pid, &ws, 0, &ru); err != nil {
			return p, fmt.Errorf("waiting for %s: %v", argv[0], err)
		}
		if ws.Exited() || ws.Signaled() {
			break
		}
		sig := 0
		switch {
		case ws.TrapCause() == ptraceEventExit:
			p.VmHWM = vmHWMOf(pid)
		case ws.StopSignal() != syscall.SIGTRAP:
			sig = int(ws.StopSignal()) // the child's own signal: deliver it
		}
		syscall.PtraceCont(pid, sig)
	}
	p.Wall = time.Since(start).Seconds()
	p.CPU = float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	p.Exit = ws.ExitStatus()
	if ws.Signaled() {
		p.Exit = -1
	}
	p.Stdout, _ = os.ReadFile(stdout.Name())
	e, _ := os.ReadFile(stderr.Name())
	p.Stderr = string(e[max(0, len(e)-2000):])
	if ws.Signaled() && time.Since(start) >= timeout {
		return p, fmt.Errorf("%s: killed after %v: %s", strings.Join(argv, " "), timeout, p.Stderr)
	}
	return p, nil
}

// vmHWMOf is process pid's VmHWM in bytes (0 if /proc does not say).
func vmHWMOf(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if f := strings.Fields(string(line)); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

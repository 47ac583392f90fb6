package filelock

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// A lock excludes a second holder, is released by Unlock, and is dropped
// by the kernel when its holder is killed.
func TestTryLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	a, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if ok, err := TryLock(a); err == ErrUnsupported {
		t.Skip(err)
	} else if !ok || err != nil {
		t.Fatalf("first lock: %v, %v", ok, err)
	}
	if ok, err := TryLock(b); ok || err != nil {
		t.Fatalf("second lock while the first is held: %v, %v", ok, err)
	}
	if err := Unlock(a); err != nil {
		t.Fatal(err)
	}
	if ok, err := TryLock(b); !ok || err != nil {
		t.Fatalf("lock after Unlock: %v, %v", ok, err)
	}
	Unlock(b)

	// Another process (this test binary, see TestMain) holds it; SIGKILL
	// drops it.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "FILELOCK_HOLD="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "locked\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("holder: %q, %v", line, err)
	}
	if ok, err := TryLock(b); ok || err != nil {
		t.Errorf("lock held by another process taken: %v, %v", ok, err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if ok, err := TryLock(b); !ok || err != nil {
		t.Fatalf("lock after its holder was killed: %v, %v", ok, err)
	}
}

// TestMain lets the test binary hold a lock for TestTryLock.
func TestMain(m *testing.M) {
	if path := os.Getenv("FILELOCK_HOLD"); path != "" {
		f, err := os.Open(path)
		if err != nil {
			os.Exit(2)
		}
		if ok, err := TryLock(f); !ok || err != nil {
			os.Exit(3)
		}
		fmt.Println("locked")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

package safetensors

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/bounded"
)

// costlyHeaders are the headers that cost the most memory per byte to
// parse, each about size bytes: what HeaderCost must cover.
func costlyHeaders(size int) map[string]string {
	var b strings.Builder
	dims := func() string {
		b.Reset()
		b.WriteString(`{"t":{"dtype":"U8","shape":[`)
		for i := 0; b.Len() < size; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteByte('0')
		}
		b.WriteString(`],"data_offsets":[0,0]}}`)
		return b.String()
	}
	entries := func(open, close string, entry func(i int) string) string {
		b.Reset()
		b.WriteString(open)
		for i := 0; b.Len() < size; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(entry(i))
		}
		b.WriteString(close)
		return b.String()
	}
	return map[string]string{
		"a shape of a million dimensions": dims(),
		"tiny metadata entries": entries(`{"__metadata__":{`, `}}`, func(i int) string {
			return `"` + strconv.FormatInt(int64(i), 36) + `":""`
		}),
		"tiny tensors": entries(`{`, `}`, func(i int) string {
			return `"` + strconv.FormatInt(int64(i), 36) + `":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}`
		}),
		"one long metadata value": `{"__metadata__":{"v":"` + strings.Repeat("x", size) + `"}}`,
	}
}

func headerFile(h string) []byte {
	return append(binary.LittleEndian.AppendUint64(nil, uint64(len(h))), h...)
}

// The memory bound on the header (issue 11 item 12): a header whose parse
// could take more than the limit is refused before it is parsed, and the
// refusal says so.
func TestParseLimitRefusesCostlyHeader(t *testing.T) {
	for name, h := range costlyHeaders(256 << 10) {
		t.Run(name, func(t *testing.T) {
			_, err := ParseLimit(headerFile(h), bounded.Memory(4<<20))
			if !errors.Is(err, bounded.ErrTooLarge) || !strings.Contains(err.Error(), "header could take") || !strings.Contains(err.Error(), "--max-memory") {
				t.Fatalf("err = %v, want the header refused under 4 MiB", err)
			}
			if _, err := ParseLimit(headerFile(h), bounded.Memory(int64(len(h))*HeaderCost)); err != nil {
				t.Fatalf("refused under a limit of HeaderCost bytes a header byte: %v", err)
			}
		})
	}
}

// HeaderCost is measured, not guessed: what parsing each costly header
// allocates in all (an upper bound of its peak live heap) stays under
// HeaderCost bytes a header byte.
func TestHeaderCostCoversAllocation(t *testing.T) {
	for name, h := range costlyHeaders(256 << 10) {
		t.Run(name, func(t *testing.T) {
			b := headerFile(h)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			f, err := Parse(b)
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatal(err)
			}
			runtime.KeepAlive(f)
			perByte := float64(after.TotalAlloc-before.TotalAlloc) / float64(len(h))
			t.Logf("%s: %.1f bytes allocated a header byte", name, perByte)
			if perByte > HeaderCost {
				t.Errorf("%s: parsing allocates %.1f bytes a header byte, more than HeaderCost = %d", name, perByte, HeaderCost)
			}
		})
	}
}

const headerChildEnv = "KCHECK_HEADER_COST_CHILD"

// TestMain lets the test binary parse one file as a child process, so
// that its peak RSS is the parse's (TestHeaderCostRSS).
func TestMain(m *testing.M) {
	if path := os.Getenv(headerChildEnv); path != "" {
		if path != "-" {
			f, err := Open(path)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			f.Close()
		}
		fmt.Println(peakRSS())
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// peakRSS is this process's peak resident set (VmHWM) in bytes, 0 where
// /proc/self/status does not say. A child's rusage would not do: its
// ru_maxrss starts at the parent's resident set when it was started.
func peakRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// The same bound on what the operating system sees: a child process that
// opens a file with a costly 4 MiB header peaks at no more than HeaderCost
// bytes a header byte above a child that opens nothing.
func TestHeaderCostRSS(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's shadow memory is counted in RSS; TestHeaderCostCoversAllocation covers this under -race")
	}
	if peakRSS() == 0 {
		t.Skip("no VmHWM in /proc/self/status: peak RSS is unreadable here")
	}
	peak := func(path string) int64 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), headerChildEnv+"="+path)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
		if err != nil {
			t.Fatalf("child printed %q", out)
		}
		return n
	}
	base := peak("-")
	for name, h := range costlyHeaders(4 << 20) {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "h.safetensors")
			if err := os.WriteFile(path, headerFile(h), 0o644); err != nil {
				t.Fatal(err)
			}
			grew := peak(path) - base
			t.Logf("%s: RSS %.1f MiB above an idle child, %.1f bytes a header byte", name, float64(grew)/(1<<20), float64(grew)/float64(len(h)))
			if grew > int64(len(h))*HeaderCost {
				t.Errorf("%s: RSS grew %d bytes for a %d-byte header, more than HeaderCost = %d bytes a byte", name, grew, len(h), HeaderCost)
			}
		})
	}
}

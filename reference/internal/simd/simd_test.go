package simd

import (
	"runtime"
	"testing"

	"golang.org/x/sys/cpu"
)

// TestSupportedIsWhatTheCPUSays: the levels follow the CPU's feature bits
// (read here independently, feature by feature), narrowest first, and
// Best is the last of them.
func TestSupportedIsWhatTheCPUSays(t *testing.T) {
	want := []Level{Generic}
	avx2 := cpu.X86.HasAVX2 && cpu.X86.HasFMA && cpu.X86.HasPOPCNT // the exp2f kernels count lanes with POPCNT
	if avx2 {
		want = append(want, AVX2)
	}
	if avx2 && cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL {
		want = append(want, AVX512)
	}
	got := Supported()
	if len(got) != len(want) {
		t.Fatalf("Supported() = %v on %s with AVX2 %v, FMA %v, POPCNT %v, AVX-512F %v, VL %v; want %v",
			got, runtime.GOARCH, cpu.X86.HasAVX2, cpu.X86.HasFMA, cpu.X86.HasPOPCNT, cpu.X86.HasAVX512F, cpu.X86.HasAVX512VL, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("Supported() = %v; want %v", got, want)
		}
	}
	if Best() != want[len(want)-1] {
		t.Fatalf("Best() = %v; want %v", Best(), want[len(want)-1])
	}
	if runtime.GOARCH != "amd64" && len(got) != 1 {
		t.Fatalf("Supported() = %v on %s; want only generic", got, runtime.GOARCH)
	}
	t.Logf("this CPU: %v", got)
}

func TestLevelNames(t *testing.T) {
	for _, c := range []struct {
		l    Level
		want string
	}{{Generic, "generic"}, {AVX2, "avx2"}, {AVX512, "avx512"}, {Level(9), "generic"}} {
		if got := c.l.String(); got != c.want {
			t.Errorf("Level(%d).String() = %q; want %q", int(c.l), got, c.want)
		}
	}
}

// TestAtEachLevel: f runs once a level, in order, as a subtest named after
// it, with the level set while it runs, and the level is restored after.
func TestAtEachLevel(t *testing.T) {
	level := AVX2
	var seen []string
	AtEachLevel(t, &level, []Level{Generic, AVX512}, func(t *testing.T) {
		seen = append(seen, t.Name()+"="+level.String())
	})
	want := []string{"TestAtEachLevel/generic=generic", "TestAtEachLevel/avx512=avx512"}
	if len(seen) != len(want) || seen[0] != want[0] || seen[1] != want[1] {
		t.Fatalf("ran %v; want %v", seen, want)
	}
	if level != AVX2 {
		t.Fatalf("level is %v after AtEachLevel; want it restored to avx2", level)
	}
}

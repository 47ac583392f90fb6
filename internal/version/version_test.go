package version

import (
	"runtime/debug"
	"testing"
)

// The build info's revision wins; the -ldflags one stands in where the
// toolchain stamped none; with neither, "unknown".
func TestFrom(t *testing.T) {
	stamped := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "92d3f11715ea8ea601b4bac66a2aee4be9bfaa98"}, {Key: "vcs.time", Value: "2026-11-30T17:28:19Z"},
		{Key: "vcs.modified", Value: "true"}}}
	tagged := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.3"}}
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		rev  string
		want string
	}{
		{"stamped", stamped, "", "kcheck (devel), revision 92d3f11715ea (modified), 2026-11-30T17:28:19Z, go1.26.8"},
		{"stamped beats -ldflags", stamped, "0123456789abcdef", "kcheck (devel), revision 92d3f11715ea (modified), 2026-11-30T17:28:19Z, go1.26.8"},
		{"go install of a tag, nothing stamped", tagged, "", "kcheck v1.2.3, revision unknown, go1.26.8"},
		{"-ldflags stands in", tagged, "0123456789abcdef", "kcheck v1.2.3, revision 0123456789ab, go1.26.8"},
	} {
		if got := from(tc.bi, tc.rev, false, "").String(); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	if i := from(nil, "", false, ""); i.Version != "(devel)" || i.Short() != "unknown" || i.Go == "" {
		t.Errorf("no build info: %+v", i)
	}
}

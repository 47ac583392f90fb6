// Package version says which kcheck this is, for `kcheck --version` and
// the environment of a report: the module version and the VCS revision
// the Go toolchain stamps into a binary built in a checkout
// (runtime/debug.ReadBuildInfo), or, where it stamps none (a git worktree,
// GOFLAGS=-buildvcs=false, go run), the revision `make build` passes with
// -ldflags -X (the Makefile's LDFLAGS).
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set with -ldflags "-X github.com/kcheck-dev/kcheck/internal/version.revision=...
// -X ...version.modified=true" where the toolchain stamps no revision.
var revision, modified, revisionTime string

// Info is a build's identity.
type Info struct {
	// Version is the module version ("(devel)" for a build from a checkout).
	Version string
	// Revision is the VCS commit, "" when unknown; Modified says the
	// working tree had changes; Time is the commit's time when known.
	Revision string
	Modified bool
	Time     string
	// Go is the toolchain that built it.
	Go string
}

// Current is this binary's identity.
func Current() Info {
	bi, _ := debug.ReadBuildInfo()
	return from(bi, revision, modified == "true", revisionTime)
}

// from reads a build's identity from its build info, the -ldflags values
// standing in for a revision it lacks.
func from(bi *debug.BuildInfo, rev string, mod bool, at string) Info {
	i := Info{Version: "(devel)", Go: runtime.Version()}
	if bi != nil {
		if bi.Main.Version != "" {
			i.Version = bi.Main.Version
		}
		if bi.GoVersion != "" {
			i.Go = bi.GoVersion
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				i.Revision = s.Value
			case "vcs.modified":
				i.Modified = s.Value == "true"
			case "vcs.time":
				i.Time = s.Value
			}
		}
	}
	if i.Revision == "" && rev != "" {
		i.Revision, i.Modified, i.Time = rev, mod, at
	}
	return i
}

// Short is the revision cut to 12 characters, "unknown" when there is none,
// with " (modified)" for a tree with changes.
func (i Info) Short() string {
	r := i.Revision
	switch {
	case r == "":
		r = "unknown"
	case len(r) > 12:
		r = r[:12]
	}
	if i.Modified {
		r += " (modified)"
	}
	return r
}

// String is the line `kcheck --version` prints.
func (i Info) String() string {
	s := fmt.Sprintf("kcheck %s, revision %s", i.Version, i.Short())
	if i.Time != "" {
		s += ", " + i.Time
	}
	return s + ", " + i.Go
}

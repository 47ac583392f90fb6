//go:build race

package docs

// raceEnabled: the documented examples are whole kcheck runs over real
// captures, which the race detector slows about fifteenfold (over four
// minutes on two cores). make test runs them in its pass without the
// detector; the race detector has the packages' own tests.
const raceEnabled = true

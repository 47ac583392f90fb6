//go:build race

package sim

// raceEnabled: the race detector slows the simulation about fifteenfold, so
// the fault table runs one fault a stage under it (the full table runs in
// the plain test).
const raceEnabled = true

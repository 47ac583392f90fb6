//go:build race

package faults_test

// raceEnabled: the race detector slows each trigger's whole check about
// tenfold, so the fault tables run a sample under it (one row a kernel for
// the signatures, one fault a stage for the triggers), which still takes
// every check path through the detector; the plain test (make test's second
// pass) runs every row.
const raceEnabled = true

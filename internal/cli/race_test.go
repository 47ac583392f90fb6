//go:build race

package cli

// raceEnabled: under the race detector a child process's RSS includes the
// detector's shadow memory (several times the program's own) and runs
// about fifteen times slower, so the tests that measure a process's real
// memory against an estimate run only in the plain build.
const raceEnabled = true

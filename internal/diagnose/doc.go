// Package diagnose is `kcheck diagnose`'s answer, the Report, from either
// of its two sources: a pipeline capture, whose per-stage attribution by
// the checker (local and propagated error per stage, the culprit, its
// worst elements and signature) it lays out, or a simulation
// (internal/sim), whose drift curve and stage swaps it takes as they are.
// It writes a Report for a person (WriteText); --json is the Report
// itself.
package diagnose

// Package sim is the decoder simulation: a small MLA decoder (Sim: a
// preset's real head count after TP and latent sizes, random weights, an
// NVFP4 projection, a paged cache with a block allocator that recycles
// pages, split-K decode and combine, the output fed forward) run over
// several prompts on a backend, beside the reference at kernel precision
// and the exact chain. It records the error per step against the noise
// floor, swaps each stage for its reference to find the one whose swap
// removes the drift (Diagnose), and finds the first step off the floor by
// binary search (BisectSteps).
//
// It answers in data (Diagnosis, bisect.Result); laying a diagnosis out for
// a person, beside a pipeline capture's stage attribution, is
// internal/diagnose's.
package sim

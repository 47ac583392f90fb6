// Package diagnose answers "is it the quantization, the KV cache, the
// attention kernel or the split-K reduction?" two ways.
//
// On a pipeline capture it lays out the checker's stage attribution (local
// and propagated error per stage, the culprit, its worst elements and
// signature) for a human.
//
// As a simulation it runs a small MLA decoder (Sim: a preset's real head
// count after TP and latent sizes, random weights, an NVFP4 projection, a
// paged cache with a block allocator that recycles pages, split-K decode
// and combine, the output fed forward) over several prompts on a backend,
// beside the reference at kernel precision and the exact chain, records the
// error per step against the noise floor, and swaps each stage for its
// reference to find the one whose swap removes the drift.
package diagnose

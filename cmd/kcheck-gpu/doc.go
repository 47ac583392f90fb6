// Command kcheck-gpu is the GPU worker of kcheck's cuda backend: it runs one
// CUDA kernel on the inputs of an evidence file and writes the inputs and the
// kernel's outputs as a new evidence file, so every GPU result is itself a
// capture that `kcheck check` can judge on any machine.
//
//	kcheck-gpu run --kernel NAME --in inputs.safetensors --out outputs.safetensors \
//	    [--ptx-dir DIR] [--ptx-only] [--repeat N] [--force]
//	kcheck-gpu info      # the device and the kernel modules, as JSON
//	kcheck-gpu kernels   # the contract kernels the CUDA side implements
//
// The kernel's parameters are the input file's metadata (reference/CONTRACTS.md §1.2);
// --kernel may be omitted when the file names it in kcheck.kernel. Where the
// input file already holds a tensor named like an output (a capture being
// re-run), the output is written in that tensor's dtype.
//
// The output's metadata adds: kcheck.kernel; the declared precision
// (acc_dtype, p_dtype, kv_dequant_dtype, fp8_saturate); device, driver;
// kernel_build (sha256 of the PTX or cubin that ran) and source; the median
// device time kcheck.cuda.ms over --repeat runs; the launch configuration
// kcheck.cuda.launch; any parameter the run chose (num_splits).
//
// Exit status (the table in package internal/gpu): 0 ok; 2 usage or unusable
// input; 3 a CUDA error (its name, e.g. CUDA_ERROR_ILLEGAL_ADDRESS, is on
// stderr); 4 the kernel or shape is not implemented by the CUDA kernels;
// 5 built without the cuda tag; 7 a kernel image the driver cannot load
// (CUDA_ERROR_INVALID_PTX, UNSUPPORTED_PTX_VERSION, NO_BINARY_FOR_GPU...: a
// build or driver mismatch, no kernel ran); 1 anything else. gorgonia.org/cu itself exits
// 1 with "Error in initialization" on stdout when the machine has no GPU.
//
// Test hook: with $KCHECK_GPU_FAULT = oob, trap or hang, `run` launches that
// deliberately broken kernel (cuda/faults.cu) instead of the real one, so the
// backend's handling of a crashing or hanging kernel can be tested on a GPU.
//
// Built only with -tags cuda (it links libcuda); without the tag it is a stub
// that explains this and exits 5.
package main

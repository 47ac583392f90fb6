package cuda

import "fmt"

// LoadError is a kernel image (PTX or cubin) that the driver refused to
// load: the PTX JIT failed or does not know the PTX's ISA version, or no
// code in the image is for this GPU. No kernel ran, so it is a build or
// driver mismatch to report as such, never a kernel crash: the worker
// exits with its own status (internal/gpu.ExitLoad) for it.
type LoadError struct {
	File      string // the image's path
	CUDAError string // CUDA_ERROR_INVALID_PTX, CUDA_ERROR_UNSUPPORTED_PTX_VERSION...
	Err       error  // the driver's error, with the JIT log when there is one
}

func (e *LoadError) Error() string {
	return fmt.Sprintf("loading %s: %v", e.File, e.Err)
}

func (e *LoadError) Unwrap() error { return e.Err }

// imageErrors are the results of cuModuleLoadDataEx that say the image
// itself cannot run here (cuda.h's descriptions). Anything else at load
// time (a sticky CUDA_ERROR_ILLEGAL_ADDRESS left by an earlier launch of
// the same run, CUDA_ERROR_OUT_OF_MEMORY) is not about the image and stays
// a CUDA error.
var imageErrors = map[string]bool{
	"CUDA_ERROR_INVALID_IMAGE":             true, // 200: not a valid kernel image
	"CUDA_ERROR_NO_BINARY_FOR_GPU":         true, // 209: no kernel image for this device
	"CUDA_ERROR_INVALID_PTX":               true, // 218: the PTX JIT failed
	"CUDA_ERROR_JIT_COMPILER_NOT_FOUND":    true, // 221: no PTX JIT in this driver
	"CUDA_ERROR_UNSUPPORTED_PTX_VERSION":   true, // 222: PTX newer than the driver's JIT
	"CUDA_ERROR_JIT_COMPILATION_DISABLED":  true, // 223: JIT disabled (CUDA_DISABLE_JIT...)
	"CUDA_ERROR_SHARED_OBJECT_INIT_FAILED": true, // 303: module initialization failed
}

// IsImageError reports whether a CUDA error name returned by a module load
// says that the image cannot be loaded on this device.
func IsImageError(name string) bool { return imageErrors[name] }

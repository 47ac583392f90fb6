//go:build cuda && !cudaemu

package cuda

// The few driver calls gorgonia.org/cu does not wrap: loading a module with
// the JIT's error log, raising a function's dynamic shared memory limit,
// the opt-in shared memory of a device, and CUDA's own error names
// (CUDA_ERROR_ILLEGAL_ADDRESS, which the worker prints and the CLI matches).

/*
#cgo LDFLAGS: -lcuda
#cgo linux CFLAGS: -I/usr/local/cuda/include
#cgo linux LDFLAGS: -L/usr/local/cuda/lib64 -L/usr/local/cuda/lib64/stubs -L/usr/lib/x86_64-linux-gnu/stubs
#include <cuda.h>
#include <stdlib.h>
#include <string.h>

static CUresult kc_module_load(const void* image, CUmodule* mod, char* log, unsigned int log_size) {
	CUjit_option opts[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
	void* vals[2] = {(void*)log, (void*)(size_t)log_size};
	if (log_size > 0) log[0] = 0;
	return cuModuleLoadDataEx(mod, image, 2, opts, vals);
}

static CUresult kc_set_max_dynamic_smem(CUfunction f, int bytes) {
	return cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes);
}

static CUresult kc_smem_optin(CUdevice d, int* v) {
	return cuDeviceGetAttribute(v, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, d);
}

static const char* kc_error_name(CUresult r) {
	const char* s = NULL;
	if (cuGetErrorName(r, &s) != CUDA_SUCCESS) return NULL;
	return s;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"unsafe"

	"gorgonia.org/cu"
)

// loadModule loads a PTX or cubin image; a JIT failure returns the JIT's log.
func loadModule(image []byte) (cu.Module, error) {
	var mod cu.Module
	// PTX must be NUL-terminated; a cubin is read by its ELF header and the
	// extra byte is harmless.
	buf := C.malloc(C.size_t(len(image) + 1))
	defer C.free(buf)
	C.memcpy(buf, unsafe.Pointer(&image[0]), C.size_t(len(image)))
	*(*byte)(unsafe.Add(buf, len(image))) = 0
	const logSize = 16 << 10
	logBuf := (*C.char)(C.malloc(logSize))
	defer C.free(unsafe.Pointer(logBuf))
	var cm C.CUmodule
	r := C.kc_module_load(buf, &cm, logBuf, logSize)
	if r != C.CUDA_SUCCESS {
		e := newError("cuModuleLoadDataEx", int(r))
		if log := strings.TrimSpace(C.GoString(logBuf)); log != "" {
			e.Detail = log
		}
		return mod, e
	}
	// cu.Module is a struct holding the C handle alone.
	*(*C.CUmodule)(unsafe.Pointer(&mod)) = cm
	return mod, nil
}

func setMaxDynamicSmem(fn cu.Function, bytes int) error {
	f := *(*C.CUfunction)(unsafe.Pointer(&fn))
	if r := C.kc_set_max_dynamic_smem(f, C.int(bytes)); r != C.CUDA_SUCCESS {
		return newError("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", int(r))
	}
	return nil
}

func smemOptin(d cu.Device) (int, error) {
	var v C.int
	if r := C.kc_smem_optin(C.CUdevice(d), &v); r != C.CUDA_SUCCESS {
		return 0, newError("cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)", int(r))
	}
	return int(v), nil
}

// errorName is CUDA's name for a driver result code.
func errorName(code int) string {
	if s := C.kc_error_name(C.CUresult(code)); s != nil {
		return C.GoString(s)
	}
	return fmt.Sprintf("CUDA_ERROR_%d", code)
}

func newError(op string, code int) *Error { return &Error{Op: op, Code: code, Name: errorName(code)} }

// wrap turns an error from gorgonia.org/cu (its unexported cuResult, an
// int) into an *Error with CUDA's name; other errors pass through.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	var ce *Error
	if errors.As(err, &ce) {
		return err
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		if v := reflect.ValueOf(e); v.Kind() == reflect.Int {
			return newError(op, int(v.Int()))
		}
	}
	return fmt.Errorf("%s: %w", op, err)
}

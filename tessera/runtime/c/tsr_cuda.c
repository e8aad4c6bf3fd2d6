/* tsr.h on NVIDIA GPUs, through the CUDA driver API (link with -lcuda).
 *
 * A context is the primary context of device 0, made current on the calling thread. A
 * module image is a cubin or a NUL-terminated PTX text (cuModuleLoadData takes either;
 * NVRTC or nvcc -cubin builds one from a generated .cu file). Where the image defines a
 * global tsr_module_abi (major << 16 | minor), tsrLoadModule checks it as the CPU's
 * does. A kernel is a __global__ function of the file, by its name; a launch needing
 * more than 48 KiB of dynamic shared memory raises the kernel's limit first. */
#include "tsr.h"

#include <cuda.h>
#include <stdlib.h>

struct tsr_context {
  CUdevice device;
  CUcontext context;
};

struct tsr_module {
  CUmodule module;
};

/* A kernel handle is its CUfunction. */
#define FUNCTION(kernel) ((CUfunction)(kernel))

static tsr_status_t status_of(CUresult result) {
  switch (result) {
    case CUDA_SUCCESS:
      return TSR_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY:
      return TSR_EOOM;
    case CUDA_ERROR_NOT_FOUND:
      return TSR_ENOTFOUND;
    case CUDA_ERROR_LAUNCH_TIMEOUT:
      return TSR_ETIMEOUT;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_IMAGE:
    case CUDA_ERROR_INVALID_PTX:
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
      return TSR_EINVAL;
    default:
      return TSR_ELAUNCH;
  }
}

tsr_status_t tsrCreateContext(tsr_context_t* ctx) {
  if (ctx == NULL) return TSR_EINVAL;
  struct tsr_context* made = (struct tsr_context*)calloc(1, sizeof *made);
  if (made == NULL) return TSR_EOOM;
  CUresult result = cuInit(0);
  if (result == CUDA_SUCCESS) result = cuDeviceGet(&made->device, 0);
  if (result == CUDA_SUCCESS) result = cuDevicePrimaryCtxRetain(&made->context, made->device);
  if (result == CUDA_SUCCESS) result = cuCtxSetCurrent(made->context);
  if (result != CUDA_SUCCESS) {
    free(made);
    return status_of(result);
  }
  *ctx = made;
  return TSR_SUCCESS;
}

tsr_status_t tsrDestroyContext(tsr_context_t ctx) {
  if (ctx == NULL) return TSR_EINVAL;
  const CUresult result = cuDevicePrimaryCtxRelease(ctx->device);
  free(ctx);
  return status_of(result);
}

tsr_status_t tsrLoadModule(tsr_context_t ctx, const void* image, size_t size,
                           tsr_module_t* mod) {
  if (ctx == NULL || image == NULL || size == 0 || mod == NULL) return TSR_EINVAL;
  struct tsr_module* loaded = (struct tsr_module*)calloc(1, sizeof *loaded);
  if (loaded == NULL) return TSR_EOOM;
  CUresult result = cuCtxSetCurrent(ctx->context);
  if (result == CUDA_SUCCESS) result = cuModuleLoadData(&loaded->module, image);
  if (result != CUDA_SUCCESS) {
    free(loaded);
    return status_of(result);
  }
  CUdeviceptr abi;
  size_t bytes;
  if (cuModuleGetGlobal(&abi, &bytes, loaded->module, "tsr_module_abi") == CUDA_SUCCESS) {
    uint32_t version = 0;
    if (bytes != sizeof version || cuMemcpyDtoH(&version, abi, sizeof version) != CUDA_SUCCESS ||
        version >> 16 != TSR_ABI_MAJOR || (version & 0xFFFF) > TSR_ABI_MINOR) {
      cuModuleUnload(loaded->module);
      free(loaded);
      return TSR_EVERSION;
    }
  }
  *mod = loaded;
  return TSR_SUCCESS;
}

tsr_status_t tsrGetKernel(tsr_module_t mod, const char* name, tsr_kernel_t* kernel) {
  if (mod == NULL || name == NULL || kernel == NULL) return TSR_EINVAL;
  CUfunction function;
  const CUresult result = cuModuleGetFunction(&function, mod->module, name);
  if (result != CUDA_SUCCESS) return result == CUDA_ERROR_NOT_FOUND ? TSR_ENOTFOUND : TSR_EINVAL;
  *kernel = (tsr_kernel_t)function;
  return TSR_SUCCESS;
}

tsr_status_t tsrAlloc(tsr_context_t ctx, size_t bytes, uint32_t flags, void** ptr) {
  if (ctx == NULL || ptr == NULL || flags != 0) return TSR_EINVAL;
  CUdeviceptr memory;
  CUresult result = cuCtxSetCurrent(ctx->context);
  if (result == CUDA_SUCCESS) result = cuMemAlloc(&memory, bytes ? bytes : 1);
  if (result != CUDA_SUCCESS) return status_of(result);
  *ptr = (void*)(uintptr_t)memory;
  return TSR_SUCCESS;
}

tsr_status_t tsrFree(tsr_context_t ctx, void* ptr) {
  if (ctx == NULL) return TSR_EINVAL;
  return ptr == NULL ? TSR_SUCCESS : status_of(cuMemFree((CUdeviceptr)(uintptr_t)ptr));
}

tsr_status_t tsrLaunch(tsr_kernel_t kernel, tsr_stream_t stream, tsr_launch_t launch,
                       void** args, size_t nargs) {
  if (kernel == NULL || (nargs > 0 && args == NULL)) return TSR_EINVAL;
  if (launch.smem_bytes > 48 * 1024) {
    const CUresult raised = cuFuncSetAttribute(
        FUNCTION(kernel), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)launch.smem_bytes);
    if (raised != CUDA_SUCCESS) return status_of(raised);
  }
  return status_of(cuLaunchKernel(FUNCTION(kernel), launch.grid_x, launch.grid_y, launch.grid_z,
                                  launch.block_x, launch.block_y, launch.block_z,
                                  launch.smem_bytes, (CUstream)stream, args, NULL));
}

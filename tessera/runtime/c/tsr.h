/* tsr.h: the Tessera runtime's C ABI (seed 003, section 3.5).
 *
 * A context loads module images, finds their kernels by name, allocates memory and
 * launches. Two implementations ship beside this header (tesserac --print-runtime-dir):
 *
 *   tsr_cpu.c   the CPU: a module image is the shared object tessera.runtime.c_abi
 *               builds from a CPU file; a kernel is a function of the .tsr file, run on
 *               OpenMP's threads (the launch's grid and stream are not used).
 *   tsr_cuda.c  NVIDIA GPUs through the driver API: a module image is a cubin or PTX
 *               (NUL-terminated); a kernel is a __global__ function of the .cu file.
 *
 * Build one of them with the program that uses it (cc -c tsr_cpu.c -ldl, or
 * cc -c tsr_cuda.c -lcuda). Every call returns a status; none aborts. */
#ifndef TSR_H
#define TSR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI's version. A module records the version it was built for; tsrLoadModule
 * takes one of the same major version and a minor version no newer than this. */
#define TSR_ABI_MAJOR 1
#define TSR_ABI_MINOR 0

typedef struct tsr_context* tsr_context_t;
typedef struct tsr_module* tsr_module_t;
typedef struct tsr_kernel* tsr_kernel_t;
typedef struct tsr_stream* tsr_stream_t; /* CUDA: a CUstream; NULL: the default stream */

typedef enum {
  TSR_SUCCESS = 0,
  TSR_EOOM,      /* out of memory */
  TSR_EINVAL,    /* an invalid argument: a null handle, a bad image, a wrong count */
  TSR_ETIMEOUT,  /* the device did not finish in time */
  TSR_EVERSION,  /* the module was built for another TSR_ABI_MAJOR, or a newer minor */
  TSR_ENOTFOUND, /* no kernel of that name in the module */
  TSR_ELAUNCH    /* the device or the driver refused the launch */
} tsr_status_t;

/* Lifecycle */
tsr_status_t tsrCreateContext(tsr_context_t* ctx);
tsr_status_t tsrDestroyContext(tsr_context_t ctx);

/* Modules and kernels. The module keeps its kernels; it lives until its context goes. */
tsr_status_t tsrLoadModule(tsr_context_t ctx, const void* image, size_t size,
                           tsr_module_t* mod);
tsr_status_t tsrGetKernel(tsr_module_t mod, const char* name, tsr_kernel_t* kernel);

/* Memory: host memory on the CPU, device memory on a GPU. flags: 0. */
tsr_status_t tsrAlloc(tsr_context_t ctx, size_t bytes, uint32_t flags, void** ptr);
tsr_status_t tsrFree(tsr_context_t ctx, void* ptr);

/* Launch: args[i] points to the value of the kernel's i-th parameter (a pointer's, a
 * size's, a scalar's), as cuLaunchKernel takes them. */
typedef struct {
  uint32_t grid_x, grid_y, grid_z;
  uint32_t block_x, block_y, block_z;
  uint32_t smem_bytes;
} tsr_launch_t;

tsr_status_t tsrLaunch(tsr_kernel_t kernel, tsr_stream_t stream, tsr_launch_t launch,
                       void** args, size_t nargs);

#ifdef __cplusplus
}
#endif

#endif /* TSR_H */

/* tsr.h on the CPU: modules are shared objects, kernels are the functions of a .tsr file.
 *
 * A module image is the shared object tessera.runtime.c_abi.cpu_module builds: the
 * generated CPU file, and for each function f of the .tsr file tsr_args_f (the entry
 * with its arguments by address) and tsr_nargs_f (how many), and tsr_module_abi (the
 * TSR_ABI_MAJOR and TSR_ABI_MINOR it was built for, as major << 16 | minor). The image
 * is written to a temporary file and loaded from there with dlopen; the file goes at
 * once. A launch runs the function on the calling thread (and OpenMP's), and returns
 * when it is done: the grid and the stream are not used on the CPU. */
#define _GNU_SOURCE
#include "tsr.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct tsr_kernel {
  void (*entry)(void* const*);
  uint32_t nargs;
  struct tsr_kernel* next;
};

struct tsr_module {
  void* library;
  struct tsr_kernel* kernels;
  struct tsr_module* next;
};

struct tsr_context {
  struct tsr_module* modules;
};

tsr_status_t tsrCreateContext(tsr_context_t* ctx) {
  if (ctx == NULL) return TSR_EINVAL;
  *ctx = calloc(1, sizeof **ctx);
  return *ctx == NULL ? TSR_EOOM : TSR_SUCCESS;
}

tsr_status_t tsrDestroyContext(tsr_context_t ctx) {
  if (ctx == NULL) return TSR_EINVAL;
  while (ctx->modules != NULL) {
    struct tsr_module* mod = ctx->modules;
    ctx->modules = mod->next;
    while (mod->kernels != NULL) {
      struct tsr_kernel* kernel = mod->kernels;
      mod->kernels = kernel->next;
      free(kernel);
    }
    dlclose(mod->library);
    free(mod);
  }
  free(ctx);
  return TSR_SUCCESS;
}

/* The image in a file of its own, for dlopen; 0 on success. */
static int write_image(const void* image, size_t size, char* path, size_t capacity) {
  const char* dir = getenv("TMPDIR");
  if (snprintf(path, capacity, "%s/tsr-module-XXXXXX", dir ? dir : "/tmp") >= (int)capacity)
    return 1;
  const int fd = mkstemp(path);
  if (fd < 0) return 1;
  const char* bytes = image;
  size_t done = 0;
  while (done < size) {
    const ssize_t wrote = write(fd, bytes + done, size - done);
    if (wrote <= 0) break;
    done += (size_t)wrote;
  }
  close(fd);
  if (done == size) return 0;
  unlink(path);
  return 1;
}

tsr_status_t tsrLoadModule(tsr_context_t ctx, const void* image, size_t size,
                           tsr_module_t* mod) {
  if (ctx == NULL || image == NULL || size == 0 || mod == NULL) return TSR_EINVAL;
  char path[4096];
  if (write_image(image, size, path, sizeof path) != 0) return TSR_EINVAL;
  void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  unlink(path);
  if (library == NULL) return TSR_EINVAL;
  const uint32_t* abi = dlsym(library, "tsr_module_abi");
  if (abi == NULL || *abi >> 16 != TSR_ABI_MAJOR || (*abi & 0xFFFF) > TSR_ABI_MINOR) {
    dlclose(library);
    return abi == NULL ? TSR_EINVAL : TSR_EVERSION;
  }
  struct tsr_module* loaded = calloc(1, sizeof *loaded);
  if (loaded == NULL) {
    dlclose(library);
    return TSR_EOOM;
  }
  loaded->library = library;
  loaded->next = ctx->modules;
  ctx->modules = loaded;
  *mod = loaded;
  return TSR_SUCCESS;
}

tsr_status_t tsrGetKernel(tsr_module_t mod, const char* name, tsr_kernel_t* kernel) {
  if (mod == NULL || name == NULL || kernel == NULL) return TSR_EINVAL;
  char symbol[512];
  if (snprintf(symbol, sizeof symbol, "tsr_args_%s", name) >= (int)sizeof symbol)
    return TSR_ENOTFOUND;
  void* entry = dlsym(mod->library, symbol);
  snprintf(symbol, sizeof symbol, "tsr_nargs_%s", name);
  const uint32_t* nargs = dlsym(mod->library, symbol);
  if (entry == NULL || nargs == NULL) return TSR_ENOTFOUND;
  struct tsr_kernel* found = calloc(1, sizeof *found);
  if (found == NULL) return TSR_EOOM;
  *(void**)&found->entry = entry; /* dlsym gives an object pointer (POSIX allows this) */
  found->nargs = *nargs;
  found->next = mod->kernels;
  mod->kernels = found;
  *kernel = found;
  return TSR_SUCCESS;
}

tsr_status_t tsrAlloc(tsr_context_t ctx, size_t bytes, uint32_t flags, void** ptr) {
  if (ctx == NULL || ptr == NULL || flags != 0) return TSR_EINVAL;
  const size_t rounded = (bytes + 63) / 64 * 64; /* aligned_alloc takes whole alignments */
  *ptr = aligned_alloc(64, rounded ? rounded : 64);
  return *ptr == NULL ? TSR_EOOM : TSR_SUCCESS;
}

tsr_status_t tsrFree(tsr_context_t ctx, void* ptr) {
  if (ctx == NULL) return TSR_EINVAL;
  free(ptr);
  return TSR_SUCCESS;
}

tsr_status_t tsrLaunch(tsr_kernel_t kernel, tsr_stream_t stream, tsr_launch_t launch,
                       void** args, size_t nargs) {
  (void)stream;
  (void)launch;
  if (kernel == NULL || nargs != kernel->nargs || (nargs > 0 && args == NULL))
    return TSR_EINVAL;
  for (size_t i = 0; i < nargs; ++i)
    if (args[i] == NULL) return TSR_EINVAL;
  kernel->entry(args);
  return TSR_SUCCESS;
}

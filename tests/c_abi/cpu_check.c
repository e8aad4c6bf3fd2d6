/* A C program against tsr.h's CPU implementation: it loads the module image argv[1]
 * (axpy: out = x * a + y over N floats), launches it, checks the result, and checks
 * that each misuse gets its status. Prints "ok", or what went wrong. */
#include "tsr.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call, want)                                                       \
  do {                                                                          \
    const tsr_status_t got = (call);                                            \
    if (got != (want)) {                                                        \
      printf("%s gave %d, not %d (line %d)\n", #call, got, want, __LINE__);     \
      return 1;                                                                 \
    }                                                                           \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  FILE* file = fopen(argv[1], "rb");
  if (file == NULL) return 2;
  fseek(file, 0, SEEK_END);
  const size_t size = (size_t)ftell(file);
  fseek(file, 0, SEEK_SET);
  char* image = malloc(size);
  if (image == NULL || fread(image, 1, size, file) != size) return 2;
  fclose(file);

  tsr_context_t ctx;
  CHECK(tsrCreateContext(&ctx), TSR_SUCCESS);
  tsr_module_t mod;
  CHECK(tsrLoadModule(ctx, "not a module", 12, &mod), TSR_EINVAL);
  CHECK(tsrLoadModule(ctx, image, size, NULL), TSR_EINVAL);
  CHECK(tsrLoadModule(ctx, image, size, &mod), TSR_SUCCESS);
  tsr_kernel_t axpy;
  CHECK(tsrGetKernel(mod, "no_such_function", &axpy), TSR_ENOTFOUND);
  CHECK(tsrGetKernel(mod, "axpy", &axpy), TSR_SUCCESS);

  int64_t n = 1003;
  float *x, *y, *out;
  CHECK(tsrAlloc(ctx, sizeof(float) * n, 1, (void**)&x), TSR_EINVAL);
  CHECK(tsrAlloc(ctx, sizeof(float) * n, 0, (void**)&x), TSR_SUCCESS);
  CHECK(tsrAlloc(ctx, sizeof(float) * n, 0, (void**)&y), TSR_SUCCESS);
  CHECK(tsrAlloc(ctx, sizeof(float) * n, 0, (void**)&out), TSR_SUCCESS);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = (float)(i % 17) - 8.5f;
    y[i] = (float)(i % 5) * 0.25f;
    out[i] = NAN;
  }
  float a = 1.5f;
  void* args[] = {&x, &y, &a, &out, &n};
  const tsr_launch_t launch = {1, 1, 1, 1, 1, 1, 0};
  CHECK(tsrLaunch(axpy, NULL, launch, args, 4), TSR_EINVAL);
  CHECK(tsrLaunch(axpy, NULL, launch, args, 5), TSR_SUCCESS);
  for (int64_t i = 0; i < n; ++i) {
    const double want = (double)x[i] * a + y[i];
    if (!(fabs(out[i] - want) <= 1e-6 * fabs(want) + 1e-6)) {
      printf("out[%lld] = %g, want %g\n", (long long)i, out[i], want);
      return 1;
    }
  }
  CHECK(tsrFree(ctx, x), TSR_SUCCESS);
  CHECK(tsrFree(ctx, y), TSR_SUCCESS);
  CHECK(tsrFree(ctx, out), TSR_SUCCESS);
  CHECK(tsrDestroyContext(ctx), TSR_SUCCESS);
  free(image);
  printf("ok\n");
  return 0;
}

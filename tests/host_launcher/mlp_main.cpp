// A program of a downstream repository: it calls mlp (examples/mlp.tsr) through the
// host launcher of the file tesserac writes, with inputs read from the files in the
// directory argv[1] (x, W_in, b_in, W_out, b_out: raw bytes), sizes T D F. It writes the
// result to argv[1]/out and prints the workspace's bytes and the statuses of four calls:
// with a workspace one byte too small, with the one it needs, with none (the launcher
// allocates its own), and with a negative size. Given argv[5], it then prints the
// host's microseconds per call of that many calls back to back.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#define GPU(name) hip##name
#else
#include <cuda_runtime.h>
#define GPU(name) cuda##name
#endif

extern "C" std::size_t tessera_mlp_workspace(std::int64_t T, std::int64_t D, std::int64_t F);
extern "C" int tessera_mlp(const unsigned short* x, const unsigned short* W_in,
                           const float* b_in, const unsigned short* W_out, const float* b_out,
                           unsigned short* out, std::int64_t T, std::int64_t D, std::int64_t F,
                           void* workspace, std::size_t workspace_bytes, GPU(Stream_t) stream);

static void* upload(const char* dir, const char* name, std::size_t bytes) {
  std::vector<unsigned char> host(bytes);
  char path[4096];
  std::snprintf(path, sizeof path, "%s/%s", dir, name);
  std::FILE* f = std::fopen(path, "rb");
  if (f == nullptr || std::fread(host.data(), 1, bytes, f) != bytes) std::exit(10);
  std::fclose(f);
  void* device = nullptr;
  if (GPU(Malloc)(&device, bytes) != GPU(Success)) std::exit(11);
  GPU(Memcpy)(device, host.data(), bytes, GPU(MemcpyHostToDevice));
  return device;
}

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) return 2;
  const std::int64_t T = std::atoll(argv[2]), D = std::atoll(argv[3]), F = std::atoll(argv[4]);
  const char* dir = argv[1];
  auto* x = static_cast<unsigned short*>(upload(dir, "x", 2 * T * D));
  auto* W_in = static_cast<unsigned short*>(upload(dir, "W_in", 2 * D * F));
  auto* b_in = static_cast<float*>(upload(dir, "b_in", 4 * F));
  auto* W_out = static_cast<unsigned short*>(upload(dir, "W_out", 2 * F * D));
  auto* b_out = static_cast<float*>(upload(dir, "b_out", 4 * D));
  unsigned short* out = nullptr;
  GPU(Malloc)(reinterpret_cast<void**>(&out), 2 * T * D);
  const std::size_t need = tessera_mlp_workspace(T, D, F);
  void* workspace = nullptr;
  GPU(Malloc)(&workspace, need);
  const int small = tessera_mlp(x, W_in, b_in, W_out, b_out, out, T, D, F, workspace, need - 1, 0);
  const int given = tessera_mlp(x, W_in, b_in, W_out, b_out, out, T, D, F, workspace, need, 0);
  const int none = tessera_mlp(x, W_in, b_in, W_out, b_out, out, T, D, F, nullptr, 0, 0);
  const int negative = tessera_mlp(x, W_in, b_in, W_out, b_out, out, -1, D, F, nullptr, 0, 0);
  std::vector<unsigned short> result(T * D);
  GPU(Memcpy)(result.data(), out, 2 * T * D, GPU(MemcpyDeviceToHost));
  char path[4096];
  std::snprintf(path, sizeof path, "%s/out", dir);
  std::FILE* f = std::fopen(path, "wb");
  std::fwrite(result.data(), 2, result.size(), f);
  std::fclose(f);
  std::printf("%zu %d %d %d %d\n", need, small, given, none, negative);
  if (argc == 6) {  // the host's time per call, back to back, after a warm-up
    const int calls = std::atoi(argv[5]);
    for (int i = 0; i < 10; ++i)
      tessera_mlp(x, W_in, b_in, W_out, b_out, out, T, D, F, workspace, need, 0);
    GPU(DeviceSynchronize)();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i)
      tessera_mlp(x, W_in, b_in, W_out, b_out, out, T, D, F, workspace, need, 0);
    const auto end = std::chrono::steady_clock::now();
    GPU(DeviceSynchronize)();
    std::printf("%.3f\n", std::chrono::duration<double, std::micro>(end - start).count() / calls);
  }
  return 0;
}

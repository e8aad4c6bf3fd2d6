"""The C ABI of ``tsr.h`` (``tessera/runtime/c``): where its sources are, and the CPU
module images its CPU implementation loads.

A C or C++ program that loads Tessera modules at run time builds ``tsr_cpu.c`` (or
``tsr_cuda.c``) from ``runtime_dir()`` (``tesserac --print-runtime-dir``) with itself.
On the CPU a module image is a shared object: the generated CPU file, and after it, for
each function ``f`` of the ``.tsr`` file, ``tsr_args_f`` (the entry ``tessera_f`` with
each argument by its address, as ``tsrLaunch`` passes them), ``tsr_nargs_f`` (how many)
and once ``tsr_module_abi``, the ``TSR_ABI_MAJOR``/``TSR_ABI_MINOR`` it was built for.
``cpu_module(program)`` builds it (cached as the runtime's builds are); its bytes are
the image ``tsrLoadModule`` takes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .cpu import build

__all__ = ["runtime_dir", "abi_version", "cpu_module", "cpu_module_source"]

_HERE = Path(__file__).resolve().parent / "c"

_ADAPTER = """
// ---- tsr.h: the ABI version, and each entry with its arguments by address

#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

namespace tsr_abi {{

template <typename F>
struct Entry;
template <typename... A>
struct Entry<void (*)(A...)> {{
  static constexpr std::uint32_t count = sizeof...(A);
  // f(*args[0], *args[1], ...), each argument read as its parameter's type.
  template <std::size_t... I>
  static void call(void (*f)(A...), void* const* args, std::index_sequence<I...>) {{
    f(*static_cast<std::remove_cv_t<A>*>(args[I])...);
  }}
}};

template <auto F>
void call(void* const* args) {{
  using E = Entry<decltype(F)>;
  E::call(F, args, std::make_index_sequence<E::count>{{}});
}}

}}  // namespace tsr_abi

extern "C" const std::uint32_t tsr_module_abi = ({major}u << 16) | {minor}u;
"""


def runtime_dir() -> Path:
    """The directory of ``tsr.h`` and its implementations."""
    return _HERE


def abi_version() -> tuple[int, int]:
    """``TSR_ABI_MAJOR`` and ``TSR_ABI_MINOR``, as ``tsr.h`` defines them."""
    text = (_HERE / "tsr.h").read_text(encoding="utf-8")
    major, minor = (int(re.search(rf"#define TSR_ABI_{n} (\d+)", text).group(1))  # type: ignore[union-attr]
                    for n in ("MAJOR", "MINOR"))  # fmt: skip
    return major, minor


def cpu_module_source(source: str, meta: dict[str, Any]) -> str:
    """The CPU file with the entries ``tsr.h`` loads after it."""
    major, minor = abi_version()
    parts = [source, _ADAPTER.format(major=major, minor=minor)]
    for f in meta["functions"]:
        parts.append(
            f'\nextern "C" void tsr_args_{f["name"]}(void* const* args) {{\n'
            f"  tsr_abi::call<&{f['symbol']}>(args);\n}}\n"
            f'extern "C" const std::uint32_t tsr_nargs_{f["name"]} = '
            f"tsr_abi::Entry<decltype(&{f['symbol']})>::count;\n"
        )
    return "".join(parts)


def cpu_module(program: Any) -> Path:
    """The module image of a program compiled for the CPU: a shared object, built (or
    found in the cache) with the metadata's compiler and flags."""
    meta = program.ir("meta")
    if meta["target"] != "cpu":
        raise ValueError(
            f"a CPU module image needs a program for the cpu target, not {meta['target']}"
        )
    text = cpu_module_source(program.source, meta)
    return build(text, meta["build"]["flags"], meta["build"]["compiler"])

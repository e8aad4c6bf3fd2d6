"""A numpy interpreter for the Tile IR, to prove a lowering before a backend prints it.

It runs every program of the grid one after another, each op on whole tiles.
The numerics are the reference ones the backends follow: values are held in
f32, and every op's result is rounded to its dtype (bf16, f16 and fp8 round
to nearest even through ``ml_dtypes``); dots and the ``p @ v`` of online
softmax accumulate in f32, with ``p`` rounded to ``v``'s dtype first, as on
tensor cores.

It is also a checker: shared memory starts as NaN, so reading a stage that
no copy has filled poisons the result; asynchronous copies land only at the
``wait`` that covers them, so a wrong wait count or slot shows; and an
access that runs past a tensor's end on an axis that is not masked raises
``TileRuntimeError``. Barriers do nothing here, since one program runs as
one thread; the barrier pass has its own tests.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from ..graph.dims import Dim
from ..graph.dtypes import SATURATION, DType
from ..graph.graph_ops import binary_operands, dropout_operands, named_operands
from ..graph.ir import Block, Op, Value
from ..graph.stochastic import STOCHASTIC_FORMATS, stochastic_operands
from ..graph.types import ScalarType, TensorType, TileType
from .ir import Access, SharedType, Slot, TileKernel, TileModule, When

__all__ = [
    "TileRuntimeError", "run_kernel", "run_function", "numpy_dtype", "round_to", "saturate",
]  # fmt: skip

_NUMPY = {
    "f32": np.float32, "tf32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16,
    "fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2,
    "i32": np.int32, "i8": np.int8, "f64": np.float64, "i64": np.int64,
    "i4": np.uint8,  # the bytes of a packed tensor, two elements to a byte
}  # fmt: skip


class TileRuntimeError(RuntimeError):
    """The tile program did something a device would not survive."""


def numpy_dtype(dtype: DType) -> Any:
    return _NUMPY.get(dtype.name, np.float32)


def round_to(x: Any, dtype: DType) -> Any:
    """``x`` rounded to ``dtype`` and held in f32 (i32 and i8 stay integral): an integer
    converts toward zero, and an i8 keeps the low 8 bits of that i32."""
    if dtype.name in ("i32", "i8"):
        return np.asarray(x).astype(np.int32).astype(numpy_dtype(dtype))
    if dtype.name == "tf32":
        bits = np.asarray(x, dtype=np.float32).view(np.uint32)
        rounded = (bits + 0xFFF + ((bits >> 13) & 1)) & np.uint32(0xFFFFE000)
        return rounded.view(np.float32)
    return np.asarray(x).astype(numpy_dtype(dtype)).astype(np.float32)


def saturate(x: Any, dtype: DType) -> Any:
    """``x`` clamped into ``dtype``'s range (``docs/numerics.md``): NaN stays NaN for a
    float and gives 0 for an integer."""
    lo, hi = SATURATION[dtype.name]
    clamped = np.clip(x, lo, hi)
    return clamped if dtype.is_float else np.where(np.isnan(clamped), 0.0, clamped)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def run_function(
    module: TileModule, function: str, inputs: Mapping[str, Any], poison: float = math.nan
) -> dict[str, np.ndarray]:
    """Run a function's kernels in order. Tensors it writes that are not among
    ``inputs`` (results, intermediates) are allocated and filled with ``poison``
    first. Returns every tensor by parameter name, ``out`` being the result."""
    program = next(p for p in module.programs if p.host.function == function)
    arrays: dict[str, Any] = dict(inputs)
    sizes: dict[str, int] = {}
    # the sizes of the inputs as declared: a kernel that reads none (arange's) has them too
    for name, declared in zip(program.host.inputs, program.host.types, strict=False):
        given = arrays.get(name.lstrip("%"))
        if isinstance(declared, TensorType) and np.ndim(given) == declared.rank:
            for dim, size in zip(declared.dims, np.shape(given), strict=True):
                if dim.symbol is not None:
                    sizes.setdefault(dim.symbol, size)
    for kernel in program.kernels:
        _bind_sizes(kernel, arrays, sizes)
    for guard in program.host.guards:
        left, right = _eval(guard.left, sizes), _eval(guard.right, sizes)
        if guard.kind == "indices":  # on the values of an index tensor, as the runtime checks
            index = np.asarray(arrays[guard.tensor])
            holds = index.size == 0 or (left <= index.min() and index.max() < right)
        elif guard.kind == "divisible":
            holds = left % right == 0
        else:
            holds = {"equal": left == right, "at_most": left <= right,
                     "at_least": left >= right}[guard.kind]  # fmt: skip
        if not holds:
            raise TileRuntimeError(f"guard {guard} fails with {sizes}: {guard.reason}")
    for kernel in program.kernels:
        for param in kernel.params:
            if param.name not in arrays and isinstance(param.type, TensorType):
                shape = tuple(_eval(d, sizes) for d in param.type.dims)
                dtype = numpy_dtype(param.type.dtype)
                # an integer tensor (a transposed index) has no NaN: its smallest value
                fill = poison if param.type.dtype.is_float else np.iinfo(dtype).min
                arrays[param.name] = np.full(shape, fill).astype(dtype)
        run_kernel(kernel, arrays, sizes)
    return arrays


def _bind_sizes(kernel: TileKernel, arrays: Mapping[str, Any], sizes: dict[str, int]) -> None:
    for param in kernel.params:
        if isinstance(param.type, TensorType) and param.name in arrays:
            shape = np.shape(arrays[param.name])
            if len(shape) != param.type.rank:
                raise TileRuntimeError(f"{param.name} has shape {shape}, wants {param.type}")
            for dim, size in zip(param.type.dims, shape, strict=True):
                if dim.symbol is not None and sizes.setdefault(dim.symbol, size) != size:
                    raise TileRuntimeError(
                        f"{param.name}: {dim.symbol} is {size} here, {sizes[dim.symbol]} before"
                    )


def _eval(dim: Dim, env: Mapping[str, int]) -> int:
    value = dim.substitute(dict(env)).constant
    if value is None:
        raise TileRuntimeError(f"cannot evaluate {dim} with {dict(env)}")
    return value


def run_kernel(kernel: TileKernel, arrays: Mapping[str, Any], sizes: Mapping[str, int]) -> None:
    """Run every program of ``kernel``'s grid; tensors are read and written in place."""
    ranges = [range(_ceil_div(_eval(a.extent, sizes), a.block)) for a in kernel.grid]
    for pids in itertools.product(*ranges):
        env = dict(sizes)
        env.update({a.name: pid for a, pid in zip(kernel.grid, pids, strict=True)})
        _Program(kernel, arrays, env).run()


def _viewed(array: Any, param: Value, env: Mapping[str, int]) -> Any:
    """The tensor as the kernel declares it. A kernel may read a tensor that another one
    wrote through a view of the same memory (``x`` of ``[R, C]`` as ``[1, C*R]``, a
    reduction's ``[C]`` as ``[1, C]``): the row-major reshape, which shares the array."""
    if not isinstance(param.type, TensorType) or not isinstance(array, np.ndarray):
        return array
    shape = tuple(_eval(d, env) for d in param.type.dims)
    if array.shape == shape or math.prod(shape) != array.size:
        return array
    return array.reshape(shape)


class _Program:
    def __init__(self, kernel: TileKernel, arrays: Mapping[str, Any], env: dict[str, int]) -> None:
        self.kernel = kernel
        self.env = env
        self.values: dict[int, Any] = {}
        for param in kernel.params:
            if param.name not in arrays:
                raise TileRuntimeError(f"no value for parameter '{param.name}'")
            self.values[param.id] = _viewed(arrays[param.name], param, env)
        self.groups: list[list[tuple[np.ndarray, int, np.ndarray]]] = []
        self.open: list[tuple[np.ndarray, int, np.ndarray]] = []

    def run(self) -> None:
        self.block(self.kernel.body)

    def block(self, block: Block) -> list[Any]:
        for op in block.ops:
            handler = getattr(self, "op_" + op.kind, None)
            if handler is None:
                results = self.elementwise(op)
            else:
                results = handler(op, *(self.values[v.id] for v in op.operands))
            if op.results:
                results = results if isinstance(results, tuple) else (results,)
                for value, result in zip(op.results, results, strict=True):
                    self.values[value.id] = _typed(result, value)
        return [self.values[v.id] for v in block.yields]

    # -- memory ----------------------------------------------------------------

    def _window(self, at: Access, shape: tuple[int, ...]) -> tuple[list, list, list]:
        """Per axis: source slice, destination slice (in the tile), tile size. A
        ``keepdims`` reduction's result (``[R, 1]``) is stored and loaded without its
        trailing unit axes, which the access then leaves out: element 0 of each."""
        src, dst, sizes = [], [], []
        units = shape[len(at.axes) :]
        left_out = len(units) if units and all(extent == 1 for extent in units) else 0
        for axis, extent in zip(at.axes, shape[: len(shape) - left_out], strict=True):
            start = _eval(axis.offset, self.env)
            if axis.index:
                if not 0 <= start < extent:
                    raise TileRuntimeError(f"index {start} out of range {extent} in {at}")
                src.append(start)
                continue
            size = _eval(axis.size, self.env)
            stop = min(start + size, extent)
            if start + size > extent and not axis.masked:
                raise TileRuntimeError(
                    f"unmasked access {at} runs past {axis.extent} = {extent} "
                    f"(elements {start}..{start + size - 1})"
                )
            src.append(slice(start, max(stop, start)))
            dst.append(slice(0, max(stop - start, 0)))
            sizes.append(size)
        return src + [0] * left_out, dst, sizes

    def _gather(self, tensor: np.ndarray, at: Access) -> np.ndarray:
        src, dst, sizes = self._window(at, tensor.shape)
        tile = np.zeros(sizes, dtype=np.float32)
        tile[tuple(dst)] = np.asarray(tensor[tuple(src)]).astype(np.float32)
        return tile

    def op_load(self, op: Op, tensor: np.ndarray) -> np.ndarray:
        return self._gather(tensor, op.attr("at"))

    def op_store(self, op: Op, tensor: np.ndarray, tile: np.ndarray) -> None:
        src, dst, _ = self._window(op.attr("at"), tensor.shape)
        tensor[tuple(src)] = np.asarray(tile)[tuple(dst)].astype(tensor.dtype)

    def op_alloc(self, op: Op) -> np.ndarray:
        t: SharedType = op.result.type
        return np.full((t.stages, *(_eval(d, self.env) for d in t.dims)), np.nan, np.float32)

    def _slot(self, slot: Slot) -> int:
        return _eval(slot.index, self.env) % slot.stages

    def op_copy(self, op: Op, tensor: np.ndarray, buf: np.ndarray) -> None:
        when: When | None = op.attr("when")
        if when is not None and not (
            _eval(when.start, self.env) < _eval(when.extent, self.env)
            and (when.stop is None or _eval(when.stop[0], self.env) < _eval(when.stop[1], self.env))
        ):
            return
        data = self._gather(tensor, op.attr("at"))
        if op.attr("async") is None:
            buf[self._slot(op.attr("slot"))] = data
        else:
            self.open.append((buf, self._slot(op.attr("slot")), data))

    def op_commit(self, op: Op) -> None:
        self.groups.append(self.open)
        self.open = []

    def op_wait(self, op: Op) -> None:
        keep = op.attr("pending")
        done = self.groups[: max(len(self.groups) - keep, 0)]
        self.groups = self.groups[len(done) :]
        for group in done:
            for buf, slot, data in group:
                buf[slot] = data

    def op_wait_mma(self, op: Op) -> None:
        """Products run when they are issued here: nothing is left in flight."""

    def op_release(self, op: Op) -> None:
        """A stage handed back to a producer warpgroup: here copies land at their wait."""

    def op_read(self, op: Op, buf: np.ndarray) -> np.ndarray:
        return buf[self._slot(op.attr("slot"))].copy()

    def op_barrier(self, op: Op) -> None:
        return None

    # -- values ----------------------------------------------------------------

    def op_const(self, op: Op) -> Any:
        return op.attr("value")

    def op_dim_to_float(self, op: Op) -> float:
        return float(_eval(op.attr("dim"), self.env))

    def op_iota(self, op: Op) -> np.ndarray:
        size = _eval(op.result.type.dims[0], self.env)
        return np.arange(size, dtype=np.int32) + _eval(op.attr("offset"), self.env)

    def op_full(self, op: Op) -> np.ndarray:
        shape = tuple(_eval(d, self.env) for d in op.result.type.dims)
        return np.full(shape, op.attr("value"), np.float32)

    def _product(self, op: Op, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``a @ b`` over the op's live corner only, zero elsewhere, as a backend that
        skips the padding computes it: a corner too small shows as a wrong result."""
        live = op.attr("live")
        (rows, depth), cols = a.shape, b.shape[1]
        out = np.zeros((rows, cols), np.float32)
        m, n, k = (
            size if bound is None else min(max(_eval(bound, self.env), 0), size)
            for bound, size in zip(
                (live.m, live.n, live.k) if live else (None,) * 3,
                (rows, cols, depth),
                strict=True,
            )
        )
        out[:m, :n] = np.matmul(a[:m, :k], b[:k, :n], dtype=np.float32)
        return out

    def op_dot(self, op: Op, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self._product(op, a, b)

    def op_mma(self, op: Op, a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> np.ndarray:
        return acc + self._product(op, a, b)

    def op_transpose(self, op: Op, x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x.T)

    def op_expand_dims(self, op: Op, x: np.ndarray) -> np.ndarray:
        return np.expand_dims(x, op.attr("axes"))

    def op_broadcast(self, op: Op, x: np.ndarray) -> np.ndarray:
        shape = tuple(_eval(d, self.env) for d in op.result.type.dims)
        return np.broadcast_to(x, shape).copy()

    def op_max(self, op: Op, x: np.ndarray) -> np.ndarray:
        return x.max(axis=op.attr("axis"))

    def op_sum(self, op: Op, x: np.ndarray) -> np.ndarray:
        return x.sum(axis=op.attr("axis"), dtype=np.float32)

    def op_gather(self, op: Op, x: np.ndarray, index: np.ndarray) -> np.ndarray:
        columns = np.clip(np.asarray(index).astype(np.int64), 0, x.shape[1] - 1)
        return np.take_along_axis(x, columns, axis=1)

    def op_scatter(
        self, op: Op, x: np.ndarray, index: np.ndarray, values: np.ndarray
    ) -> np.ndarray:
        out, rows, columns = self._scattered(x, index)
        out[rows, columns] = values  # numpy assigns a repeated index its last value
        return out

    def op_scatter_add(
        self, op: Op, x: np.ndarray, index: np.ndarray, values: np.ndarray
    ) -> np.ndarray:
        out, rows, columns = self._scattered(x, index)
        np.add.at(out, (rows, columns), values)
        return out

    @staticmethod
    def _scattered(x: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A copy of ``x`` to scatter into, and the (row, column) of each index, the
        column clamped into the row as the kernels clamp it."""
        columns = np.clip(np.asarray(index).astype(np.int64), 0, x.shape[1] - 1)
        rows = np.broadcast_to(np.arange(x.shape[0])[:, None], columns.shape)
        return np.array(x, dtype=np.float32), rows, columns

    def op_split(self, op: Op, x: np.ndarray) -> tuple:
        return tuple(np.split(x, len(op.results), axis=op.attr("axis")))

    def op_concat(self, op: Op, *tiles: np.ndarray) -> np.ndarray:
        return np.concatenate(tiles, axis=op.attr("axis"))

    def op_cast(self, op: Op, x: np.ndarray) -> np.ndarray:
        if op.attr("saturate"):
            return saturate(x, op.result.type.dtype)
        return x  # the result is rounded to its dtype like every other

    def op_mask_causal(self, op: Op, s: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> Any:
        return np.where(cols[None, :] > rows[:, None], -np.inf, s).astype(np.float32)

    def op_dropout(self, op: Op, x: np.ndarray, *_: Any) -> np.ndarray:
        _, p, seed = (
            self.values[v.id] if isinstance(v, Value) else v for v in dropout_operands(op)
        )
        drawn = _philox(int(seed), self._place(op, x), 0)
        u = (drawn >> 8).astype(np.float32) * np.float32(2.0**-24)
        p = np.float32(p)
        return np.where(u >= p, x * (np.float32(1.0) / (np.float32(1.0) - p)), np.float32(0.0))

    def op_index_along(self, op: Op, *x: np.ndarray) -> np.ndarray:
        """The index along an axis of each element of ``x``'s tile or, with no operand
        (``arange``'s), of the result's tile."""
        stride, size = (int(_eval(op.attr(a), self.env)) for a in ("stride", "size"))
        tile = x[0] if x else np.empty(tuple(int(_eval(d, self.env)) for d in op.result.type.dims))
        return ((self._place(op, tile) // np.uint64(stride)) % np.uint64(size)).astype(np.float32)

    def op_stochastic_cast(self, op: Op, x: np.ndarray, *_: Any) -> np.ndarray:
        _, seed = (
            self.values[v.id] if isinstance(v, Value) else v for v in stochastic_operands(op)
        )
        dtype = op.result.type.dtype
        mantissa, emin = STOCHASTIC_FORMATS[dtype.name]
        drawn = _philox(int(seed), self._place(op, x), 1) >> 8
        rounded = stochastic_round(np.asarray(x, np.float32), mantissa, emin, drawn)
        return saturate(rounded, dtype) if op.attr("saturate") else rounded

    def _place(self, op: Op, x: np.ndarray) -> np.ndarray:
        """The row-major place in its tensor of each element of the tile ``x`` that a
        drawing op (``DRAWN``) computes, from the op's ``at``."""
        at: Access = op.attr("at")
        place: Any = 0
        tile_axis = 0
        for axis in at.axes:
            offset = _eval(axis.offset, self.env)
            if not axis.index:
                shape = [1] * x.ndim
                shape[tile_axis] = x.shape[tile_axis]
                offset = offset + np.arange(x.shape[tile_axis], dtype=np.uint64).reshape(shape)
                tile_axis += 1
            place = place * _eval(axis.extent, self.env) + offset
        return np.broadcast_to(np.uint64(place), x.shape)

    def op_mask_edge(self, op: Op, x: np.ndarray) -> np.ndarray:
        axis = op.attr("axis")
        start = _eval(op.attr("offset"), self.env)
        past = np.arange(x.shape[axis]) + start >= _eval(op.attr("extent"), self.env)
        shape = [1] * x.ndim
        shape[axis] = -1
        return np.where(past.reshape(shape), np.float32(op.attr("fill")), x)

    def op_softmax_online(self, op: Op, s: np.ndarray) -> tuple:
        m = s.max(axis=1)
        p = np.exp(s - _finite(m)[:, None])
        return p, m, p.sum(axis=1, dtype=np.float32)

    def op_softmax_accumulate(self, op: Op, acc: Any, m: Any, l_: Any, p: Any, v: Any,
                              m_c: Any, l_c: Any) -> tuple:  # fmt: skip
        m_new = np.maximum(m, m_c)
        alpha = np.exp(m - _finite(m_new))
        beta = np.exp(m_c - _finite(m_new))
        p = round_to(p * beta[:, None], op.operands[4].type.dtype)
        acc = acc * alpha[:, None] + self._product(op, p, v)
        return acc, m_new, l_ * alpha + l_c * beta

    # -- control flow -------------------------------------------------------------

    def op_for(self, op: Op, *init: Any) -> tuple:
        body = op.regions[0]
        counter = body.args[0].name
        extent = _eval(op.attr("extent"), self.env)
        if op.attr("stop") is not None:
            extent = min(extent, _eval(op.attr("stop"), self.env))
        step = _eval(op.attr("step"), self.env)
        first = 0 if op.attr("start") is None else _eval(op.attr("start"), self.env) // step
        carried = list(init)
        for i in range(first, _ceil_div(extent, step)):
            self.env[counter] = i
            self.values[body.args[0].id] = i
            for arg, value in zip(body.args[1:], carried, strict=True):
                self.values[arg.id] = value
            carried = self.block(body)
        self.env.pop(counter, None)
        return tuple(carried)

    def op_if(self, op: Op, cond: Any) -> tuple:
        return tuple(self.block(op.regions[0 if cond else 1]))

    def elementwise(self, op: Op) -> Any:
        operands = [self.values[v.id] for v in op.operands]
        if op.kind in _BINARY:
            a, b = (self.values[x.id] if isinstance(x, Value) else x for x in binary_operands(op))
            return _BINARY[op.kind](a, b)
        if op.kind in _UNARY:
            return _UNARY[op.kind](operands[0])
        if op.kind == "where":
            cond, a, b = (
                self.values[x.id] if isinstance(x, Value) else x
                for x in named_operands(op, ("cond", "a", "b"))
            )
            return np.where(np.asarray(cond) != 0, a, b)
        if op.kind == "join_i32":  # high * radix + low, exact (an i8 product's sum)
            high, low = (np.asarray(x).astype(np.int64) for x in operands)
            return (high * op.attr("radix") + low).astype(np.int32)
        raise TileRuntimeError(f"the interpreter has no rule for '{op.kind}'")


def _philox(seed: int, n: np.ndarray, stream: int) -> np.ndarray:
    """Philox4x32-10's first word for the counters ``(n, 0, stream, 0)`` under the key
    ``seed``, as the backends' headers compute it."""
    low = np.uint64(0xFFFFFFFF)
    c0, c1 = n & low, n >> np.uint64(32)
    c2, c3 = np.full_like(n, stream), np.zeros_like(n)
    k0, k1 = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    for _ in range(10):
        p0, p1 = np.uint64(0xD2511F53) * c0, np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = (
            (p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0), p1 & low,
            (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1), p0 & low,
        )  # fmt: skip
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return c0.astype(np.uint32)


def _finite(m: np.ndarray) -> np.ndarray:
    """Row maxima with -inf (a row with nothing unmasked yet) replaced by 0."""
    return np.where(np.isneginf(m), np.float32(0), m)


def _typed(result: Any, value: Value) -> Any:
    if isinstance(value.type, TileType):
        return round_to(result, value.type.dtype)
    if isinstance(value.type, ScalarType) and value.type.kind == "float":
        return float(result)
    return result


def _gelu(x: Any) -> Any:
    return 0.5 * x * (1.0 + np.tanh(np.float32(math.sqrt(2.0 / math.pi)) * (x + 0.044715 * x**3)))


_BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "pow": lambda a, b: a**b, "maximum": np.fmax, "minimum": np.fmin,
    "floordiv": np.floor_divide, "mod": np.mod,
    "less": np.less, "less_equal": np.less_equal, "greater": np.greater,
    "greater_equal": np.greater_equal, "equal": np.equal, "not_equal": np.not_equal,
    "logical_and": np.logical_and, "logical_or": np.logical_or,
}  # fmt: skip
_UNARY = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "tanh": np.tanh, "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)), "gelu": _gelu,
    "silu": lambda x: x / (1.0 + np.exp(-x)), "relu": lambda x: np.maximum(x, 0),
    "neg": lambda x: -x, "abs": np.abs, "round": np.rint, "sin": np.sin, "cos": np.cos,
    "logical_not": np.logical_not, "floor": np.floor, "ceil": np.ceil, "exp2": np.exp2,
    "log2": np.log2, "log1p": np.log1p, "expm1": np.expm1, "tan": np.tan,
    "erf": np.vectorize(math.erf, otypes=[np.float64]),
}  # fmt: skip


def stochastic_round(x: np.ndarray, mantissa: int, emin: int, draw: np.ndarray) -> np.ndarray:
    """``x`` (f32) rounded as the headers' ``stochastic_round`` does, with the 24-bit draws
    ``draw``: toward zero to a multiple of the format's spacing at ``x``, and one spacing
    further when the draw is less than the remainder's share of it times 2^24, rounded up."""
    bits = x.view(np.uint32).astype(np.int64)
    field = (bits >> 23) & 0xFF
    sig = np.where(field > 0, (bits & 0x7FFFFF) | 0x800000, bits & 0x7FFFFF)
    gap = np.maximum(field - 127, emin) - mantissa
    cut = gap - (np.maximum(field, 1) - 150)
    kept = np.where(cut < 24, sig >> np.minimum(cut, 63), 0)
    rest = sig - (kept << np.minimum(cut, 63))
    # ceil(rest * 2^(24 - cut)), exactly: rest < 2^24 and cut >= 13
    bound = -((-rest << 39) >> np.minimum(cut + 15, 63))
    up = draw.astype(np.int64) < bound
    with np.errstate(over="ignore"):  # the power of two past the largest f32: infinity
        magnitude = ((kept + up) * np.ldexp(1.0, gap)).astype(np.float32)
    return np.where(field == 0xFF, x, np.copysign(magnitude, x)).astype(np.float32)

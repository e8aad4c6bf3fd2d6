"""An optimizer's state for one parameter, as compiled functions take and return it.

``OptimizerState`` is the Python side of ``OptimizerState[w] @fp32_master``: the Adam
moments ``m`` and ``v`` of the parameter ``w`` and, with ``@fp32_master``, its f32
master copy ``master``, each an array of ``w``'s shape (numpy, or cupy or torch on a
GPU, as the runtime's other tensors). A compiled function takes the object where its
``.tsr`` signature has the state, checks it against the parameter it belongs to, and
passes its arrays (``<state>_master``, ``<state>_m``, ``<state>_v`` in the metadata). A
state it returns is written into the arrays of the state of the same parameter that it
was given, which the call donates: the caller gets that same object back, its arrays
updated in place, as ``KVCache.append`` does. ``docs/autodiff.md`` describes both sides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .arguments import bound_arguments

__all__ = ["OptimizerState", "StateSignature"]


class OptimizerState:
    """The Adam state of one parameter: ``m`` and ``v`` (the first and second moments,
    torch's ``exp_avg`` and ``exp_avg_sq``) and, for a bf16 or f16 parameter trained
    with ``@fp32_master``, the f32 ``master`` copy that the update is computed on. All
    have the parameter's shape; the moments are f32 with a master, and of the
    parameter's dtype without one. ``OptimizerState.init(w)`` makes the state a first
    step starts from; arrays of one's own are checked by the constructor."""

    def __init__(self, m: Any, v: Any, master: Any = None) -> None:
        self.m, self.v, self.master = m, v, master
        self.check()

    @classmethod
    def init(cls, param: Any, *, fp32_master: bool = False) -> OptimizerState:
        """The state before the first step (optax's ``init``): zero moments and, with
        ``fp32_master``, the master copy as ``param``'s values widened to f32. The
        arrays are of ``param``'s kind (numpy, cupy, torch) and on its device."""
        if fp32_master:
            master = _f32(param)
            return cls(_zeros(master), _zeros(master), master)
        return cls(_zeros(param), _zeros(param))

    @property
    def fp32_master(self) -> bool:
        """Whether the state keeps an f32 master copy (``@fp32_master``)."""
        return self.master is not None

    @property
    def shape(self) -> tuple[int, ...]:
        """The parameter's shape, which every array of the state has."""
        return tuple(self.m.shape)

    def arrays(self) -> tuple[Any, ...]:
        """The arrays in the order a compiled function passes them: master, m, v."""
        return (self.master, self.m, self.v) if self.fp32_master else (self.m, self.v)

    def check(self, param: Any = None, name: str = "OptimizerState") -> None:
        """Raise ``ValueError`` unless the arrays make a state: ``m`` and ``v`` of one shape
        and one float dtype, ``master`` (if any) f32 of that shape, the moments f32 with
        it. Given the parameter, also that they have its shape, the moments its dtype
        without a master, and that a master goes with a narrower parameter."""
        m, v, master = self.m, self.v, self.master
        for field, x in (("m", m), ("v", v), ("master", master)):
            if x is None and field == "master":
                continue
            if not hasattr(x, "shape") or not hasattr(x, "dtype"):
                raise ValueError(f"{name}: {field} must be an array, not {type(x).__name__}")
        if tuple(v.shape) != tuple(m.shape) or _dtype(v) != _dtype(m):
            raise ValueError(f"{name}: m and v must have one shape and dtype: m is {_shown(m)}, "
                             f"v is {_shown(v)}")  # fmt: skip
        if _dtype(m) not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"{name}: the moments must be float32 (or the parameter's "
                             f"bfloat16, float16), not {_dtype(m)}")  # fmt: skip
        if master is not None:
            if tuple(master.shape) != tuple(m.shape) or _dtype(master) != "float32":
                raise ValueError(f"{name}: master must be float32 of the moments' shape "
                                 f"{list(m.shape)}, not {_shown(master)}")  # fmt: skip
            if _dtype(m) != "float32":
                raise ValueError(f"{name}: with a master copy the moments are float32, "
                                 f"not {_dtype(m)}")  # fmt: skip
        if param is None:
            return
        if tuple(param.shape) != tuple(m.shape):
            raise ValueError(f"{name}: the state has shape {list(m.shape)}, but its parameter "
                             f"is {_shown(param)}")  # fmt: skip
        if master is None and _dtype(m) != _dtype(param):
            raise ValueError(f"{name}: the moments are {_dtype(m)}, but the parameter is "
                             f"{_dtype(param)} (without a master they have its dtype)")  # fmt: skip

    def __repr__(self) -> str:
        master = f", master={_shown(self.master)}" if self.fp32_master else ""
        return f"OptimizerState(m={_shown(self.m)}, v={_shown(self.v)}{master})"


class StateSignature:
    """The ``OptimizerState`` parameters and results of one compiled function (its
    metadata's ``states``): a call takes a state object for each state parameter, and
    returns one for each state result."""

    def __init__(
        self, name: str, inputs: list[Mapping[str, Any]], states: list[dict], results: list[str]
    ) -> None:
        self.name = name
        self.params = [s for s in states if "result" not in s]
        self.results = sorted((s for s in states if "result" in s), key=lambda s: s["result"])
        #: the function's results, a state's tensors one by one
        self.count = len(results)
        fields = {s["name"]: _fields(s) for s in self.params}
        #: the results that the kernels write into the donated state's arrays, by name:
        #: those of a state result ``in_place``
        self.donated: dict[str, str] = {}
        for spec in (s for s in self.results if s.get("in_place")):
            given = next(s["name"] for s in self.params if s["param"] == spec["param"])
            tensors = results[spec["result"] : spec["result"] + spec["count"]]
            names = (f"{given}_{f}" for f in _fields(spec))
            self.donated.update(zip(tensors, names, strict=True))
        flat = {f"{s}_{f}": s for s, names in fields.items() for f in names}
        #: the inputs as the caller passes them: each state's tensors as one input
        self.inputs: list[Mapping[str, Any]] = []
        for p in inputs:
            state = flat.get(p["name"])
            if state is None:
                self.inputs.append(p)
            elif p["name"] == f"{state}_{fields[state][0]}":
                spec = next(s for s in self.params if s["name"] == state)
                self.inputs.append({**p, "name": state, "kind": "state", "state": spec})

    def signature(self, items: Callable[[list[Mapping[str, Any]]], list[str]]) -> list[str]:
        """The inputs as the docstring shows them, a state as its ``.tsr`` type."""
        shown = []
        for p in self.inputs:
            if p["kind"] != "state":
                shown += [i for i in items([p]) if i != "*"]
                continue
            master = " @fp32_master" if p["state"]["fp32_master"] else ""
            shown.append(f"{p['name']}: OptimizerState[{p['state']['param']}]{master}")
        first = next((i for i, p in enumerate(self.inputs) if p.get("keyword_only")), None)
        return shown if first is None else [*shown[:first], "*", *shown[first:]]

    def call(
        self, run: Callable[..., Any], flat: list[str], args: tuple, kwargs: dict, out: Any
    ) -> Any:
        """Check the state arguments, run the function on their arrays (``flat``: the
        names ``run`` takes by position), and return each state result as the state
        argument of its parameter, which the call donates: the same object, its arrays
        overwritten with the new state."""
        values = bound_arguments(self.name, self.inputs, args, kwargs)
        given: dict[str, OptimizerState] = {}
        for spec in self.params:
            name = spec["name"]
            if name not in values:
                raise TypeError(f"{self.name}() is missing {name}")
            state = values.pop(name)
            self._check(name, spec, state, values.get(spec["param"]))
            values.update(zip((f"{name}_{f}" for f in _fields(spec)), state.arrays(), strict=True))
            given[spec["param"]] = state
        if self.results and out is not None:
            raise TypeError(f"{self.name}() returns an OptimizerState, written into the one it "
                            "is given; it takes no 'out'")  # fmt: skip
        if self.donated:
            # the kernels write the new state over the donated one: its arrays are the
            # results' out, and nothing is copied
            outs: list[Any] = [None] * self.count
            for spec in (s for s in self.results if s.get("in_place")):
                first = spec["result"]
                outs[first : first + spec["count"]] = given[spec["param"]].arrays()
            out = tuple(outs) if self.count > 1 else outs[0]
        by_position = []
        for key in flat:  # by position while they last: the fast path takes those
            if key not in values:
                break
            by_position.append(values.pop(key))
        done = run(*by_position, **values) if out is None else run(*by_position, **values, out=out)
        if not self.results:
            return done
        flat = list(done) if isinstance(done, tuple) else [done]
        for spec in reversed(self.results):
            first, count = spec["result"], spec["count"]
            arrays = flat[first : first + count]
            # a returned state is one of the function's state parameters, updated (the
            # compiler allows no other); there is one state per parameter
            donor = given[spec["param"]]
            for target, array in zip(donor.arrays(), arrays, strict=True):
                if array is not target:  # computed apart: copied into the state
                    _assign(target, array)
            flat[first : first + count] = [donor]
        return tuple(flat) if len(flat) > 1 else flat[0]

    def _check(self, name: str, spec: Mapping[str, Any], state: Any, param: Any) -> None:
        """A state argument is an ``OptimizerState`` of the declared kind, of its
        parameter's shape (and dtype, without a master)."""
        declared = f"OptimizerState[{spec['param']}]" + " @fp32_master" * spec["fp32_master"]
        where = f"{self.name}(): '{name}'"
        if not isinstance(state, OptimizerState):
            raise TypeError(f"{where} must be a tessera.OptimizerState ({declared}), not "
                            f"{type(state).__name__}")  # fmt: skip
        if state.fp32_master != spec["fp32_master"]:
            has = "holds a" if state.fp32_master else "has no"
            make = f"OptimizerState.init({spec['param']}, fp32_master={spec['fp32_master']})"
            raise ValueError(f"{where} {has} master copy, and the function declares "
                             f"{declared}: make it with {make}")  # fmt: skip
        state.check(param if hasattr(param, "shape") else None, where)


def _fields(spec: Mapping[str, Any]) -> tuple[str, ...]:
    return ("master", "m", "v") if spec["fp32_master"] else ("m", "v")


def _dtype(x: Any) -> str:
    """An array's dtype by its numpy name (torch's ``torch.float32`` is ``float32``)."""
    return str(x.dtype).removeprefix("torch.")


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _f32(x: Any) -> Any:
    """A copy of ``x`` in float32, of its kind and on its device."""
    if _is_torch(x):
        import torch

        return x.to(torch.float32, copy=True).contiguous()
    return x.astype(np.float32, copy=True)


def _zeros(x: Any) -> Any:
    """Zeros of ``x``'s shape and dtype, of its kind and on its device."""
    if _is_torch(x):
        import torch

        return torch.zeros_like(x, memory_format=torch.contiguous_format)
    if type(x).__module__.startswith("cupy"):
        import cupy

        return cupy.zeros(x.shape, x.dtype)
    return np.zeros(x.shape, x.dtype)


def _assign(target: Any, source: Any) -> None:
    """Write ``source`` into the donated array ``target``."""
    if _is_torch(target):
        target.copy_(source)
    else:
        target[...] = source


def _shown(x: Any) -> str:
    """An array as a message shows it: its shape and dtype, or its type."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"{list(x.shape)} {_dtype(x)}"
    return type(x).__name__

"""The autotuner: for each tunable launch, measure candidates and keep the fastest.

For one launch the search

1. takes the candidates of its space (``space.py``), pruned of those the
   machine cannot run;
2. ranks them: the heuristic's own schedule first (the baseline every other
   candidate is checked against and compared with), then the best
   configurations of the record for the nearest shape bucket in the cache (a
   warm start), then the rest by the cost model (``cost.py``); it keeps the
   first ``max_candidates``;
3. compiles them in parallel, one process per core;
4. measures them: every one within the budget when they are few (exhaustive),
   otherwise by successive halving: each round shares the budget among the
   candidates still in, and the faster half goes on. A candidate always runs
   once after a warm-up, so a budget too small for that is exceeded rather than
   leaving a candidate unmeasured.

The record it writes holds the winner, the five fastest with their median
times, and the heuristic's time, at the sizes given with ``-D``.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..files import is_special
from ..runtime import cpu as cpu_runtime
from ..transpiler.frontend.fingerprint import fingerprints
from ..transpiler.frontend.source import SourceFile
from ..transpiler.graph.ir import GraphModule
from ..transpiler.options import Options
from ..transpiler.pipeline import Program, read_file
from ..transpiler.schedule.lower import TuningPoint, tuning_points
from ..transpiler.schedule.tuned import Timing, TunedRecord, TunedSchedules, knobs
from . import cachefile
from .cost import estimate_cycles
from .measure import Inputs, Runner, disagreement, make_inputs
from .space import space_for
from .toolchain import toolchain

__all__ = ["TuneError", "tune", "tune_file", "DEFAULT_BUDGET_MS", "EXHAUSTIVE"]

log = logging.getLogger("tessera.tune")

#: Measuring time per launch when neither the call nor ``@kernel.autotune`` gives one.
DEFAULT_BUDGET_MS = 1000.0
#: Spaces up to this size are measured whole; larger ones by successive halving.
EXHAUSTIVE = 8
#: Candidates compiled and measured per launch, at most.
MAX_CANDIDATES = 16
#: Timings a record keeps.
KEPT = 5

#: Reports progress: (what is going on, done, total).
Progress = Callable[[str, int, int], None]


class TuneError(Exception):
    """Tuning cannot start: no sizes, nothing to tune, or no way to measure the target."""


@dataclass
class _Candidate:
    #: Values of the searched knobs; the untuned schedule's values fill in the rest.
    config: dict[str, Any]
    origin: str
    runner: Runner | None = None
    #: Why the candidate is out of the search: it did not build, or its output disagreed.
    problem: str | None = None

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in sorted(self.config.items()))


def tune_file(path: str | Path, **options: Any) -> list[TunedRecord]:
    """Tune the launches of a ``.tsr`` file; ``options`` are those of ``tune``. A missing
    or undecodable file is a ``CompileError``, as for ``compile_file``."""
    source = read_file(path)
    return tune(source.text, source.name, **options)


def tune(
    src: str,
    filename: str = "<string>",
    *,
    target: str = "cpu",
    arch: str | None = None,
    defines: Mapping[str, int] | Iterable[str] | None = None,
    cache: str | Path | None = None,
    budget_ms: float | None = None,
    kernel: str | None = None,
    max_candidates: int = MAX_CANDIDATES,
    progress: Progress | None = None,
) -> list[TunedRecord]:
    """Tune source text: measure each tunable launch's candidates at the sizes of
    ``defines`` and return one record per launch; with ``cache``, merge them into that
    file (else into the file an ``@kernel.autotune(cache=...)`` names)."""
    return _Tuner(SourceFile(filename, src), Options.create(target, arch, defines, kernel),
                  cache, budget_ms, max_candidates, progress).run()  # fmt: skip


class _Tuner:
    def __init__(
        self,
        source: SourceFile,
        options: Options,
        cache: str | Path | None,
        budget_ms: float | None,
        max_candidates: int,
        progress: Progress | None,
    ) -> None:
        if options.target != "cpu":
            raise TuneError(
                f"measuring on the {options.target} target is not supported yet; "
                "tune with --target cpu"
            )
        self.source = source
        self.options = options
        self.cache = cache
        self.budget_ms = budget_ms
        self.max_candidates = max(1, max_candidates)
        self.progress = progress or (lambda _what, _done, _total: None)
        self.toolchain = toolchain(options.target)

    def run(self) -> list[TunedRecord]:
        program = Program(self.source, self.options, until="sched")
        points = tuning_points(program.ir("graph"), self.options,
                               fingerprints(program.ir("ast")), self.toolchain)  # fmt: skip
        missing = _symbolic_sizes(program.ir("graph"), {p.key.function for p in points})
        if missing:
            raise TuneError(
                "tuning measures at fixed sizes: give "
                + " ".join(f"-D {name}=..." for name in missing)
            )
        if not points:
            raise TuneError(
                f"{self.source.name} has nothing to tune: no gemm, attention or tile kernel "
                "without a fixed @kernel.schedule"
            )
        records: list[TunedRecord] = []
        for point in points:
            record = self._tune(point, records)
            records.append(record)
            path = self._cache_path(point)
            if path is not None:
                cachefile.update(path, [record])
            else:
                log.warning(
                    "%s/%s: not saved: give a cache file (--cache, or "
                    "@kernel.autotune(cache=...))",
                    point.key.function,
                    point.key.launch,
                )
        return records

    # -- one launch ---------------------------------------------------------------------

    def _tune(self, point: TuningPoint, earlier: list[TunedRecord]) -> TunedRecord:
        """Tune one launch; the launches tuned before it run with their records."""
        name = f"{point.key.function}/{point.key.launch}"
        candidates = self._ranked(point)
        log.info("%s: %d candidates to measure", name, len(candidates))
        self._build(point, candidates, name, earlier)
        baseline = candidates[0]
        if baseline.runner is None:
            raise TuneError(f"{name}: the untuned schedule does not build: {baseline.problem}")
        reference = baseline.runner.output()
        for c in candidates[1:]:
            if c.runner is not None:
                c.problem = disagreement(c.runner.output(), reference)
                if c.problem is not None:
                    log.warning("%s: dropped %s: %s (a compiler bug; please report it)",
                                name, c.label, c.problem)  # fmt: skip
        alive = [c for c in candidates if c.runner is not None and c.problem is None]
        self._measure(alive, name, self._budget(point))
        ranked = sorted(alive, key=lambda c: (c.runner.median, c.label))  # type: ignore[union-attr]
        best = tuple(Timing(knobs(c.config), c.runner.median * 1e3)  # type: ignore[union-attr]
                     for c in ranked[:KEPT])  # fmt: skip
        winner = ranked[0]
        baseline_ms = baseline.runner.median * 1e3
        log.info("%s: %s at %.3f ms (untuned %s at %.3f ms)", name, winner.label,
                 best[0].ms, baseline.label, baseline_ms)  # fmt: skip
        return TunedRecord(point.key, knobs(winner.config), self._sizes(point), best,
                           baseline_ms, len(alive))  # fmt: skip

    def _sizes(self, point: TuningPoint) -> tuple[tuple[str, int], ...]:
        """The ``-D`` sizes of the tuned function's own symbols."""
        generic = Options(self.options.target, self.options.arch, (), self.options.kernel)
        graph = Program(self.source, generic, until="graph").ir("graph")
        own = set(_symbolic_sizes(graph, {point.key.function}))
        return tuple((name, size) for name, size in self.options.defines if name in own)

    def _cache_path(self, point: TuningPoint) -> Path | None:
        """The ``cache`` argument, else the file ``@kernel.autotune(cache=...)`` names."""
        path = self.cache or (point.space.cache if point.space is not None else None)
        return None if path is None else Path(path).expanduser()

    def _budget(self, point: TuningPoint) -> float:
        if self.budget_ms is not None:
            return self.budget_ms / 1e3
        if point.space is not None and point.space.budget_ms is not None:
            return point.space.budget_ms / 1e3
        return DEFAULT_BUDGET_MS / 1e3

    def _ranked(self, point: TuningPoint) -> list[_Candidate]:
        space = space_for(point)
        name = f"{point.key.function}/{point.key.launch}"
        for config, why in space.pruned:
            log.info("%s: pruned %s: %s", name, _Candidate(config, "space").label, why)

        def searched(config: Mapping[str, Any]) -> dict[str, Any]:
            return {k: config.get(k, point.default[k]) for k in space.knobs}

        ranked = [_Candidate(searched(point.default), "baseline")]
        path = self._cache_path(point)
        if path is not None and not is_special(path):  # /dev/stdout, a FIFO: written only
            near = TunedSchedules(self.toolchain, tuple(cachefile.read(path)))
            record = near.nearest(point.key)
            if record is not None:
                sizes = " ".join(f"{k}={v}" for k, v in record.sizes)
                log.info("%s: warm start from [%s]", name, sizes)
                ranked += [_Candidate(searched(dict(t.config)), "warm start")
                           for t in record.best]  # fmt: skip
        by_cost = sorted(space.candidates, key=lambda c: estimate_cycles(
            point.problem, {**point.default, **c}, point.hw))  # fmt: skip
        ranked += [_Candidate(c, "cost model") for c in by_cost]
        unique: dict[str, _Candidate] = {}
        for c in ranked:
            unique.setdefault(c.label, c)
        kept = list(unique.values())
        seeded = [c for c in kept if c.origin != "cost model"]
        rest = [c for c in kept if c.origin == "cost model"]
        return seeded + rest[: max(0, self.max_candidates - len(seeded))]

    def _build(
        self,
        point: TuningPoint,
        candidates: list[_Candidate],
        name: str,
        earlier: list[TunedRecord],
    ) -> None:
        """Generate every candidate's source, then compile them all in parallel."""
        built: list[tuple[_Candidate, str, dict[str, Any]]] = []
        for index, c in enumerate(candidates):
            self.progress(f"{name}: generating {len(candidates)} candidates", index,
                          len(candidates))  # fmt: skip
            forced = TunedSchedules(self.toolchain, (
                *earlier, TunedRecord(point.key, knobs(c.config), (), (), None),
            ))  # fmt: skip
            program = Program(self.source, _with_cache(self.options, forced))
            launch = next(
                lnch
                for p in program.ir("sched").programs
                for lnch in p.launches
                if (p.function, lnch.name) == (point.key.function, point.key.launch)
            )
            if launch.source != "tuned":
                c.problem = "the compiler did not take the schedule"
                continue
            built.append((c, program.source, program.ir("meta")))
        done = 0

        def compile_one(item: tuple[_Candidate, str, dict[str, Any]]) -> None:
            nonlocal done
            c, source, meta = item
            try:
                cpu_runtime.build(source, meta["build"]["flags"], meta["build"]["compiler"])
            except cpu_runtime.BuildError as exc:
                c.problem = str(exc)
                log.warning("%s: %s does not build: %s", name, c.label, exc)
            done += 1
            self.progress(f"{name}: compiling {len(built)} candidates", done, len(built))

        with ThreadPoolExecutor(max_workers=max(1, len(os.sched_getaffinity(0)))) as pool:
            list(pool.map(compile_one, built))
        inputs: Inputs | None = None
        for c, source, meta in built:
            if c.problem is not None:
                continue
            function = next(f for f in meta["functions"] if f["name"] == point.key.function)
            if inputs is None:
                try:
                    inputs = make_inputs(function)
                except ValueError as exc:
                    raise TuneError(f"{name}: {exc}") from None
            library = cpu_runtime.load(source, meta)
            c.runner = Runner(getattr(library, point.key.function), inputs)

    def _measure(self, alive: list[_Candidate], name: str, budget_s: float) -> None:
        runners = [c.runner for c in alive if c.runner is not None]
        for r in runners:
            r.run(1)  # warm-up: page faults, first touch of the inputs
            r.times.clear()
        rounds = 1 if len(runners) <= EXHAUSTIVE else math.ceil(math.log2(len(runners)))
        for index in range(rounds):
            share = budget_s / rounds / max(1, len(runners))
            self.progress(f"{name}: measuring {len(runners)} candidates, round {index + 1} of "
                          f"{rounds}", index, rounds)  # fmt: skip
            reps = {id(r): 1 for r in runners}
            for r in runners:
                r.run(1)
                reps[id(r)] = max(1, int(share / max(r.times[-1], 1e-6)))
            # interleaved, so that drift in the machine's speed is shared by all
            for rep in range(1, max(reps.values())):
                for r in runners:
                    if rep < reps[id(r)]:
                        r.run(1)
            if index + 1 < rounds:
                runners = sorted(runners, key=lambda r: r.median)[: math.ceil(len(runners) / 2)]


def _symbolic_sizes(graph: GraphModule, functions: set[str]) -> list[str]:
    """The symbolic sizes of some functions' parameters, sorted: those ``-D`` leaves open
    when the graph was built with defines, all of them when it was built without."""
    names: set[str] = set()
    for f in graph.functions:
        if f.name in functions:
            for p in f.params:
                for dim in getattr(p.value.type, "dims", ()):
                    names |= dim.symbols()
    return sorted(names)


def _with_cache(options: Options, schedules: TunedSchedules) -> Options:
    return Options(options.target, options.arch, options.defines, options.kernel, schedules)

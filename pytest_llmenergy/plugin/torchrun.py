"""pytest under torchrun: one session over every rank of the job, one run file.

Like pytest-xdist's controller and workers (``workers.py``), with torch.distributed's own
machinery in place of xdist's channels:

* at configure, each rank checks the settings on its own (a tensor-parallel model whose
  heads do not divide by the world size is one line on every rank, never a hang), joins
  the process group, and takes rank 0's case-order seed, so every rank collects the same
  cases in the same order;
* each rank opens its own meter: local rank 0 its node's CPU/DRAM meter (and its GPU),
  every other rank only the GPU it owns, or nothing on a CPU-only node; at session start
  they become one :class:`~pytest_llmenergy.distributed.DistributedMeter`, whose windows
  open and close in lockstep and hold the whole job's joules on every rank;
* rank 0 alone shows tables, saves the run and gates; the run records the layout (world
  size, nodes, ranks per node, who reads which domain) and the energy per node and device;
* a rank that dies: the survivors' next collective fails or times out, the session stops,
  and rank 0 saves what was measured with the status ``incomplete`` and the silent rank
  named.  torchrun's own SIGTERM to the survivors ends the session the same way.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Generator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pytest

from ..distributed import (
    DistEnv,
    DistributedMeter,
    Group,
    NullMeter,
    RankLost,
    node_of_domain,
    per_process,
)
from ..errors import ConfigError
from ..gpu.device import gpu_backend
from ..meters import Meter, MeterFactory, open_meter
from ..results import CaseResult
from .meter import Metering

if TYPE_CHECKING:
    from ..controller.rule import ControllerSettings
    from ..meters import MeterSettings
    from .meter import MeasureSettings
    from .models import LLMSettings


class RankSettings(Protocol):
    """What a rank reads of the session's settings (``options.PluginSettings``, which
    imports the sections that use this module: named here by what it has, not imported,
    so that the plugin's modules import each other in one direction only)."""

    @property
    def meter(self) -> MeterSettings: ...

    @property
    def measure(self) -> MeasureSettings: ...

    @property
    def controller(self) -> ControllerSettings: ...

    @property
    def llm(self) -> LLMSettings: ...


Settings = TypeVar("Settings", bound=RankSettings)  # the settings given, given back

# The local meter of a rank that reads no sensor (not a user-facing backend).
RANK_BACKEND = "llmenergy-rank-without-meter"
INCOMPLETE = "incomplete"  # run status: a rank was lost, the run holds what was measured
RECORD_KEY = "distributed"  # where a run file's machine section keeps the layout


def rank_options(options: Settings, env: DistEnv, gpus: int) -> Settings:
    """Each rank's meter: the node's CPU/DRAM on local rank 0, and each rank's own GPU;
    busy-machine checks off (the job's other ranks are the 'other processes')."""
    meter, measure = options.meter, options.measure
    if gpus and meter.gpus is None:
        meter = dataclasses.replace(meter, gpus=(env.local_rank % gpus,))
    if not env.reads_host:
        backend = gpu_backend(measure.backend) if gpus else RANK_BACKEND  # its GPU alone
        measure = dataclasses.replace(measure, backend=backend)
    controller = dataclasses.replace(options.controller, max_background=None)
    return dataclasses.replace(options, meter=meter, measure=measure, controller=controller)


def check_layout(options: Settings, env: DistEnv) -> tuple[Settings, list[str]]:
    """Settings that cannot work on this job: one line, on every rank, before joining.

    A model named by the user that cannot be split is an error; one that came with a
    grid's default models (Falcon, which transformers cannot split) is left out, and the
    returned lines say so, so that ``torchrun ... -m pytest benchmarks/ --llm-parallel=tp``
    runs what it can."""
    llm = options.llm
    if llm.parallel != "tp":
        return options, []
    from ..llm.grid import split_model
    from ..llm.loader import NO_TP_PLAN, tensor_parallel_problem

    defaults = llm.models is None  # the grid's own models, not named by the user
    no_plan = NO_TP_PLAN.split("(", 1)[0]
    kept: list[str] = []
    notes: list[str] = []
    for spec in llm.grid.models:
        _, source = split_model(spec)
        try:
            problem = tensor_parallel_problem(
                source, env.world_size, trust_remote_code=llm.trust_remote_code
            )
        except ConfigError as exc:
            problem = str(exc)
        if problem and defaults and problem.startswith(no_plan):
            notes.append(f"--llm-parallel=tp: model {spec} left out: {problem.split(';')[0]}")
            continue
        if problem:
            raise pytest.UsageError(
                f"--llm-parallel=tp: model {spec} cannot be split over {env.world_size} "
                f"ranks: {problem}"
            )
        kept.append(spec)
    if not kept:
        raise pytest.UsageError(
            "--llm-parallel=tp: none of the grid's models can be split; name one with "
            "--llm-models (e.g. tiny-llama)"
        )
    if len(kept) == len(llm.grid.models):
        return options, notes
    return dataclasses.replace(options, llm=dataclasses.replace(llm, models=tuple(kept))), notes


class Distributed:
    """One rank's part in a torchrun session."""

    def __init__(
        self,
        config: pytest.Config,
        env: DistEnv,
        options: RankSettings,
        notes: list[str] | None = None,
    ) -> None:
        self.config = config
        self.env = env
        self.options = options
        self.notes = notes or []
        self.fault: str | None = None
        try:
            self.group = Group(env, options.measure.dist_timeout_s)
        except Exception as exc:
            raise pytest.UsageError(
                f"torchrun: {env.describe()} could not join the process group: "
                f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
            ) from None
        self.meter: DistributedMeter | None = None
        self._previous_sigterm: Any = None

    @property
    def is_main(self) -> bool:
        return self.env.rank == 0

    def seed(self, seed: int | None) -> int | None:
        """Rank 0's case-order seed, on every rank."""
        return int(self.group.broadcast(seed)) if seed is not None else None

    # -- hooks ---------------------------------------------------------------------
    def pytest_llmenergy_meters(self, config: pytest.Config) -> Mapping[str, MeterFactory]:
        return {RANK_BACKEND: lambda options: NullMeter()}

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """After Metering opened this rank's meter: share it with the other ranks."""
        from .meter import METERING

        metering: Metering = self.config.stash[METERING]
        assert metering.meter is not None
        try:
            metering.meter = self._rank_meter(metering.meter)
            self.meter = DistributedMeter(metering.meter, self.group)
        except RankLost as exc:
            raise pytest.UsageError(f"torchrun: {exc}") from None
        except ConfigError as exc:
            raise pytest.UsageError(f"torchrun: {exc}") from None
        metering.meter = self.meter
        self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _rank_meter(self, local: Meter) -> Meter:
        """A rank without a node meter runs the estimate too where its node's meter is the
        estimate: it counts this process's CPU time, so every rank must count its own."""
        kinds = self.group.all_gather((self.env.node_rank, self.env.local_rank, local.kind))
        host = next(k for node, lr, k in kinds if node == self.env.node_rank and lr == 0)
        if isinstance(local, NullMeter) and per_process(host):
            local.close()
            return open_meter("estimate", self.options.meter)
        return local

    def header(self) -> list[str]:
        env = self.env
        layout = self.options.llm.parallel
        what = (
            "each model split tensor-parallel over the ranks"
            if layout == "tp"
            else "every rank runs a whole model (--llm-parallel=tp splits it)"
        )
        return [
            f"torchrun: {env.world_size} ranks on {env.nnodes} node(s), "
            f"{env.local_world_size} per node ({self.group.backend}); {what}; this is "
            f"{env.describe()}; rank 0 keeps the run; busy-machine checks are off",
            *self.notes,
        ]

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Rank 0's run file gets the job's layout before the first case is saved."""
        recorder = self._recorder()
        if recorder is not None:
            machine = dict(recorder.run.machine)
            machine[RECORD_KEY] = self.layout()
            recorder.amend(machine=machine)
        keeper = self._keeper()
        if keeper is not None and keeper.header_run is not None:  # the HTML report's run
            machine = {**keeper.header_run.machine, RECORD_KEY: self.layout()}
            keeper.header_run = dataclasses.replace(keeper.header_run, machine=machine)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        excinfo = call.excinfo
        if excinfo is None or self.fault is not None:  # later failures follow from the first
            return report
        if excinfo.errisinstance(RankLost):
            self.fault = str(excinfo.value)
        elif excinfo.errisinstance(RuntimeError):
            # the model's own collectives (tensor-parallel all-reduces) fail too when a
            # rank dies; a silent heartbeat tells that from an ordinary error in the test
            silent = self.group.silent_ranks()
            if not silent:
                return report
            self.fault = self.group.fault_message(excinfo.value)
        else:
            return report
        report.longrepr = f"llmenergy: {self.fault}"
        item.session.shouldstop = f"llmenergy: {self.fault}"
        return report

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """After the keeper's last write: the energy per node and device, and the fault."""
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
        recorder = self._recorder()
        if recorder is not None and self.meter is not None:
            from .session_tables import CASE_RESULTS

            results = self.config.stash[CASE_RESULTS].results
            machine = dict(recorder.run.machine)
            machine[RECORD_KEY] = {**self.layout(), **self.energy(results)}
            if self.fault:
                machine[RECORD_KEY]["fault"] = self.fault
            changes: dict[str, Any] = {"machine": machine}
            if self.fault:
                changes["status"] = INCOMPLETE
            recorder.amend(**changes)
        if self.fault is not None and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        self.group.close()

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.fault:
            terminalreporter.write_line(
                f"llmenergy: run incomplete: {self.fault}", red=True, bold=True
            )

    # -- what the run file keeps -----------------------------------------------------
    def layout(self) -> dict[str, Any]:
        env = self.env
        meter = self.meter
        ranks = []
        if meter is not None:
            for rm in meter.ranks:
                ranks.append(
                    {
                        "rank": rm.rank,
                        "node": rm.node,
                        "local_rank": rm.rank % env.local_world_size,
                        "backend": rm.backend,
                        "domains": [name for name, _, _ in rm.domains],
                    }
                )
        return {
            "world_size": env.world_size,
            "nodes": env.nnodes,
            "ranks_per_node": env.local_world_size,
            "parallel": self.options.llm.parallel,
            "process_group": self.group.backend,
            "ranks": ranks,
        }

    def energy(self, results: list[CaseResult]) -> dict[str, Any]:
        """Joules of every measured trial, by node and by device (GPU domain)."""
        meter = self.meter
        assert meter is not None
        by_node: dict[str, float] = {}
        by_device: dict[str, float] = {}
        for case in results:
            for trial in case.trials:
                for domain, joules in trial.joules_by_domain.items():
                    d = meter.domains.get(domain)
                    if d is None or not d.counted:
                        continue
                    node = node_of_domain(domain)
                    if node is None:
                        node = meter.ranks[meter.owner[domain]].node
                    key = f"node{node}"
                    by_node[key] = by_node.get(key, 0.0) + joules
                    if domain.startswith("gpu:"):
                        by_device[domain] = by_device.get(domain, 0.0) + joules
        return {
            "energy_by_node_j": by_node,
            "energy_by_device_j": by_device,
            # each node's meter's own measured time, over every window (warm-up excluded)
            "window_s_by_node": {f"node{n}": s for n, s in meter.window_s_by_node.items()},
        }

    # -- faults ----------------------------------------------------------------------
    def _on_sigterm(self, signum: int, frame: Any) -> None:
        """torchrun stops the other ranks when one dies: end the session as interrupted,
        saving what was measured, and say which rank was lost."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once is enough
        self.fault = self.fault or (
            self.group.fault_message().split(";")[0]
            + f"; torchrun stopped rank {self.env.rank} (SIGTERM)"
        )
        raise KeyboardInterrupt(self.fault)

    def _keeper(self) -> Any:
        if not self.is_main:
            return None
        from .keeping import KEEPER

        return self.config.stash.get(KEEPER, None)

    def _recorder(self) -> Any:
        keeper = self._keeper()
        return keeper.recorder if keeper is not None else None


DISTRIBUTED = pytest.StashKey[Distributed]()

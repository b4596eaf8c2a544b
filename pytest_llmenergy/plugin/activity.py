"""Whether a session measures at all: one that measures nothing costs nothing and says nothing.

Installed in an environment, the plugin is in every pytest session.  A session measures

1. from its start, where it was asked to: one of the plugin's options on the command line
   (``PYTEST_ADDOPTS`` included), an ini setting that acts on its own (a run to keep or
   compare, an export, the HTML report, figures, a server, GPU settings, interleaving),
   a side of ``llmenergy ab``, or a rank under torchrun;
2. or from the end of collection, where a collected test needs it: it uses one of the
   plugin's fixtures (``energy_benchmark``, ``energy_meter``, ``energy_gpu_setting``,
   ``llm_pool``, ``llm_grid``, ``llm_server``, the grid's case fixtures), directly or
   through another fixture, or carries ``@pytest.mark.llmenergy``; with
   ``--energy-benchmark-extra-info=on``, a test using pytest-benchmark's ``benchmark``;
3. or from the moment a test asks for ``energy_meter`` by name
   (``request.getfixturevalue``), which collection cannot see; under pytest-xdist the
   controller, which collects nothing, from its first measured case.

Until then the features are registered only at session start, after pytest's own start,
so their start (opening the meter, looking at the GPUs) waits; the header waits too.  A
session that turns out to measure starts them then, and its header follows the collection
line (or, later than that, opens the terminal summary).  One that measures nothing drops
them after collection: nothing of theirs runs, prints or adds to pytest-benchmark's
``extra_info``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import pytest


@dataclass
class Activity:
    """The features of a session that may measure, and whether it does.

    ``features`` are the plugin objects by name, in registration order; ``fixtures``
    those whose use makes the session measure (``measures``); ``always`` names
    those registered at configure whatever happens and never dropped (what took something
    at configure that its unconfigure gives back: the SIGTERM handler, a lock's folder)."""

    features: Mapping[str, object]
    fixtures: Collection[str]
    reason: str = ""  # why the session measures; "" while nothing asked it to
    always: Collection[str] = field(default_factory=tuple)
    started: bool = False  # the features' session start ran (or runs: from the start)
    # the header has its place: pytest's header (from the start), or was shown later
    header_shown: bool = False
    session: pytest.Session | None = None

    @property
    def measuring(self) -> bool:
        return bool(self.reason)

    def register(self, manager: pytest.PytestPluginManager, names: Collection[str]) -> None:
        """Register the named features that are not registered, in their order."""
        for name, plugin in self.features.items():
            if name in names and not manager.is_registered(plugin):
                manager.register(plugin, name)

    def drop(self, manager: pytest.PytestPluginManager) -> None:
        """Unregister the features a session that measures nothing has no use for."""
        for name, plugin in self.features.items():
            if name not in self.always and manager.is_registered(plugin):
                manager.unregister(plugin)

    def wake(self, manager: pytest.PytestPluginManager, reason: str) -> None:
        """The session measures from now on: features dropped come back, and their
        session start, put off while nothing measured, runs now (the meter opens)."""
        if self.measuring:
            return
        self.reason = reason
        self.register(manager, self.features)
        if self.started or self.session is None:
            return
        self.started = True
        ours = {id(plugin) for plugin in self.features.values()}
        others = [plugin for plugin in manager.get_plugins() if id(plugin) not in ours]
        manager.subset_hook_caller("pytest_sessionstart", others)(session=self.session)

    def shows_header(self, config: pytest.Config) -> bool:
        """Whether a late header is due now: the session began to measure after pytest's
        header, has not shown it, and pytest shows headers (not under -q, --no-header)."""
        due = self.measuring and not self.header_shown and _shows_headers(config)
        self.header_shown = self.header_shown or due
        return due


def _shows_headers(config: pytest.Config) -> bool:
    """Whether pytest's terminal shows a session header (none under -q, --no-header)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    return reporter is not None and reporter.showheader and not reporter.no_header


def measures(item: pytest.Item, fixtures: Collection[str], marker: str) -> bool:
    """Does this test make the session measure: it uses one of ``fixtures`` (directly or
    through another fixture) or carries ``marker``."""
    used = getattr(item, "fixturenames", ())
    return any(name in fixtures for name in used) or item.get_closest_marker(marker) is not None


def given_on_command_line(config: pytest.Config, dests: Collection[str]) -> bool:
    """Whether any of these options was given on the command line (or PYTEST_ADDOPTS):
    their command-line default is None, the ini file's value is read apart."""
    return any(config.getoption(dest, default=None) is not None for dest in dests)


ACTIVITY = pytest.StashKey[Activity]()

"""The conformance suite as pytest items.

    pytest -p linattn.testing.pytest_plugin --linattn-backend cpu-chunked [--linattn-op gdn_prefill]
           [--linattn-xfail linattn-xfail.toml] [--linattn-device cuda]

(``-p linattn.testing`` works too.) Each case becomes one item named ``check[<case id>]`` under a
``linattn-conformance[<backend>]`` node, so ``-k``, ``-x``, ``--lf`` and junit XML work as usual. A
case the backend's predicates decline is skipped with their reason; the accuracy and pool cases of
an op the backend does not run on this device at all (``cutedsl`` on a CPU) are skipped with
"backend not available on <device>" and the rejection (device, arch, toolchain), as ``linattn
check`` reports them; a case in the xfail file is an xfail (strict entries fail when they pass). Without ``--linattn-backend`` the plugin adds
nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from linattn._namespace import public_dir

__all__ = ["pytest_addoption", "pytest_configure", "pytest_collection_modifyitems", "ConformanceFailure",
           "ConformanceItem", "ConformanceSuite"]
__dir__ = public_dir(__name__, __all__)


def pytest_addoption(parser) -> None:
    group = parser.getgroup("linattn", "linattn conformance suite")
    group.addoption("--linattn-backend", action="append", default=[], metavar="NAME",
                    help="run the linattn conformance suite against this backend (repeatable)")
    group.addoption("--linattn-op", action="append", default=[], metavar="OP",
                    help="only cases of this op (repeatable; default every op)")
    group.addoption("--linattn-xfail", default=None, metavar="FILE",
                    help="TOML file of known gaps ([[xfail]] case = '<id pattern>', reason = '...')")
    group.addoption("--linattn-device", default="cpu", metavar="DEVICE",
                    help="torch device the cases run on (default cpu)")


class ConformanceFailure(Exception):
    """A case failed: the message lists every failed check."""


class ConformanceItem(pytest.Item):
    """One conformance case."""

    def __init__(self, *, case, device, rules, unavailable=None, **kwargs):
        super().__init__(**kwargs)
        self.case, self.device, self.rules, self.unavailable = case, device, rules, unavailable
        self.add_marker(pytest.mark.linattn_conformance)

    def runtest(self) -> None:
        from .runner import run_case

        if self.unavailable and self.case.kind in ("accuracy", "pool"):
            pytest.skip(f"backend not available on {self.device}: {self.unavailable}")

        res = run_case(self.case, self.device, self.rules)
        self.user_properties.append(("errors", res.errors))
        if res.status == "skipped":
            pytest.skip(res.message)
        if res.status == "xfail":
            pytest.xfail(f"{res.xfail_reason} ({res.message})")
        if res.status == "failed":
            raise ConformanceFailure(f"{self.case.what}\n{res.message}")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ConformanceFailure):
            return f"{self.case.id}\n{excinfo.value}"
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, f"linattn conformance: {self.case.id}"


class ConformanceSuite(pytest.Collector):
    """The cases of one backend."""

    def __init__(self, *, backend, ops, device, rules, **kwargs):
        super().__init__(**kwargs)
        self.backend, self.ops, self.device, self.rules = backend, ops, device, rules

    def collect(self):
        from .runner import availability, plan

        backend, device, cases = plan(self.backend, self.ops or None, self.device)
        avail = availability(backend, list(dict.fromkeys(c.op for c in cases)), device)
        for case in cases:
            yield ConformanceItem.from_parent(self, name=f"check[{case.id}]", case=case, device=device,
                                              rules=self.rules, unavailable=avail.get(case.op))


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "linattn_conformance: a case of the linattn conformance suite")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items) -> None:
    """Append the conformance items (before ``-k`` / ``-m`` deselection, which run after us)."""
    backends = config.getoption("linattn_backend")
    if not backends:
        return
    from .xfail import load_xfail

    xfail = config.getoption("linattn_xfail")
    rules = load_xfail(Path(xfail)) if xfail else ()
    for name in backends:
        node = f"linattn-conformance[{name}]"
        suite = ConformanceSuite.from_parent(session, name=node, nodeid=node, backend=name,
                                             ops=config.getoption("linattn_op"),
                                             device=config.getoption("linattn_device"), rules=rules)
        items.extend(suite.collect())

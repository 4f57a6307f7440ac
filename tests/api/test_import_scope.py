"""``import linattn`` loads the library only (issue 30 section 4): not its tools (``linattn.apps``),
not context parallelism (``linattn.context_parallel``, built on torch.distributed's collectives),
not the rank-spawning test helper (``linattn.testing.spawn``), which ``linattn.context_parallel``
does not import either (its deprecated alias ``spawn_ranks`` imports it when read).

torch 2.x imports ``torch.distributed`` itself on ``import torch``, so "torch.distributed is not in
``sys.modules``" is asserted only where torch leaves it out; everywhere, no module that
``import linattn`` loads may hold ``torch.distributed`` (``import torch.distributed as dist``), and
the probe shows that check sees a module that does.
"""

import json
import subprocess
import sys

PROBE = r'''
import json, sys
import torch
by_torch = "torch.distributed" in sys.modules
import linattn

def ours():
    return sorted(m for m in sys.modules if m == "linattn" or m.startswith("linattn."))

def holders():
    dist = sys.modules.get("torch.distributed")
    return sorted(m for m in ours() if dist is not None and any(v is dist for v in vars(sys.modules[m]).values()))

doc = dict(by_torch=by_torch, loaded="torch.distributed" in sys.modules, modules=ours(), holders=holders())
fn = linattn.context_parallel_prefill  # the public name still resolves (imported on first use)
doc.update(fn=f"{fn.__module__}.{fn.__name__}", holders_after=holders(),
           spawn_after="linattn.testing.spawn" in sys.modules)  # the deprecated alias imports it when read only
print(json.dumps(doc))
'''


def _probe() -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_linattn_loads_no_tools_no_context_parallelism_and_no_torch_distributed():
    doc = _probe()
    mods = doc["modules"]
    assert "linattn.context_parallel" not in mods
    assert not [m for m in mods if m == "linattn.apps" or m.startswith("linattn.apps.")], mods
    assert "linattn.testing.spawn" not in mods
    assert doc["holders"] == [], doc["holders"]  # no linattn module imported torch.distributed
    if not doc["by_torch"]:  # torch left it out: so must linattn
        assert not doc["loaded"]
    # the check sees a holder: context_parallel, loaded by the public name, holds torch.distributed
    assert doc["fn"] == "linattn.context_parallel.context_parallel_prefill"
    assert doc["holders_after"] == ["linattn.context_parallel"]
    assert not doc["spawn_after"]  # import linattn.context_parallel leaves the rank spawner out

"""The module paths of before dispatch/ was split stay importable as the moved modules themselves
(dispatch/__init__.py's PRE_SPLIT_PATHS): the two plugin-API paths docs/writing-a-backend.md names,
even imported before anything else, and every other one (engines and field reproducers import them)."""

import subprocess
import sys


def test_old_hookspecs_and_verdict_paths_are_the_plugin_modules_in_a_fresh_interpreter():
    code = ("from linattn.dispatch.hookspecs import hookimpl\n"
            "from linattn.dispatch.verdict import Check, Reason, Rank\n"
            "import linattn.dispatch.verdict as old_v, linattn.dispatch.plugin.verdict as new_v\n"
            "import linattn.dispatch.hookspecs as old_h, linattn.dispatch.plugin.hookspecs as new_h\n"
            "assert old_v is new_v and old_h is new_h and hookimpl is new_h.hookimpl and Rank is new_v.Rank\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_every_pre_split_module_path_is_its_moved_module_and_import_linattn_loads_no_more():
    code = ("import sys, importlib, linattn\n"
            "before = set(sys.modules)\n"
            "from linattn.dispatch import PRE_SPLIT_PATHS\n"
            "assert set(sys.modules) == before, 'the package imported modules for the old paths'\n"
            "from linattn.dispatch import fast_path\n"
            "from linattn.dispatch.policy import current_policy\n"
            "for old, sub in PRE_SPLIT_PATHS.items():\n"
            "    a = importlib.import_module('linattn.dispatch.' + old)\n"
            "    b = importlib.import_module('linattn.dispatch.' + sub + '.' + old)\n"
            "    assert a is b, old\n"
            "assert fast_path is sys.modules['linattn.dispatch.runtime.fast_path']\n"
            "try:\n"
            "    importlib.import_module('linattn.dispatch.no_such_module')\n"
            "except ModuleNotFoundError:\n"
            "    print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr[-2000:]

"""``dir()`` of a public module lists its API only (PEP 562 module ``__dir__``).

A module's globals also hold what it imports (``Optional``, ``torch``, ``dataclass``, the
``annotations`` future flag); ``from M import *`` already takes ``__all__`` only, and this makes
``dir(M)``, ``help`` and tab completion agree with it. Attribute access is not changed.
"""

from __future__ import annotations

import sys
from typing import Callable, Iterable


def public_dir(module: str, names: Iterable[str], submodules: Iterable[str] = ()) -> Callable[[], list[str]]:
    """A ``__dir__`` for ``module``: ``names`` (its ``__all__``) and those of its public
    ``submodules`` that are imported (an attribute of the package only once imported).

    Args:
        module: the module's ``__name__``.
        names: its public names, ``__all__``.
        submodules: public submodules or subpackages (package modules only).
    Returns:
        the function to bind as the module's ``__dir__``.
    Example:
        >>> import linattn
        >>> "Optional" in dir(linattn), "gdn_decode" in dir(linattn)
        (False, True)
    """
    names, submodules = tuple(names), tuple(submodules)

    def __dir__() -> list[str]:
        loaded = vars(sys.modules[module])
        return sorted({*names, *(s for s in submodules if s in loaded)})

    return __dir__

"""The plugin contract: the hooks a linattn plugin may implement (pluggy, project "linattn").

A plugin is a module (or object) exposed through the entry-point group ``linattn.backends``::

    # pyproject.toml of the plugin
    [project.entry-points."linattn.backends"]
    my-backend = "my_package.plugin"

    # my_package/plugin.py
    from linattn.dispatch.plugin import hookimpl
    LINATTN_API_VERSION = "2"            # the plugin API version this plugin targets

    @hookimpl
    def linattn_register_backends():
        from my_package.backend import MyBackend
        return [MyBackend]

Built-in backends register through the very same hook (``linattn.backends.builtin``).

Versions: the hooks are the same in both; what differs is the backend contract
(``backends/base.py``). API 2: a backend implements one method per phase (``decode``, ``prefill``,
``gating``, ``clamp``) taking a call object (``dispatch/plugin/calls.py``). API 1: one keyword method per
op (``gdn_decode(q=..., ...)``), run through an adapter. A backend class may say which it is
(``api_version``); one that does not takes its plugin's ``LINATTN_API_VERSION``.
"""

from __future__ import annotations

from typing import Optional

import pluggy

PROJECT = "linattn"
#: The plugin API version this linattn implements, and the range of versions it accepts.
PLUGIN_API_VERSION = "2"
SUPPORTED_API_VERSIONS = frozenset({"1", "2"})

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class LinattnSpec:
    @hookspec
    def linattn_register_backends(self) -> list:
        """Return backend classes (subclasses of ``linattn.backends.base.Backend``)."""

    @hookspec(firstresult=True)
    def linattn_probe_device(self, device) -> Optional[object]:
        """Return ``DeviceCapabilities`` for a ``torch.device`` this plugin knows, else None.

        Lets a vendor describe hardware linattn has no probe for; the first answer wins.
        """


class BackendPlugin:
    """A plugin object that registers the given backend classes through the hook.

    For embedders and tests that add backends in-process rather than through an entry point::

        from linattn.dispatch import get_registry
        get_registry().add_plugin(BackendPlugin(MyBackend), name="my-plugin")

    ``api_version`` is the plugin API the classes were written for (default: this linattn's; pass
    ``"1"`` for first-release backend classes that do not say so themselves).
    """

    LINATTN_API_VERSION = PLUGIN_API_VERSION

    def __init__(self, *classes, api_version: Optional[str] = None):
        self.classes = list(classes)
        if api_version is not None:
            self.LINATTN_API_VERSION = api_version

    @hookimpl
    def linattn_register_backends(self):
        return self.classes

"""The plugin contract: the hooks a linattn plugin may implement (pluggy, project "linattn").

A plugin is a module (or object) exposed through the entry-point group ``linattn.backends``::

    # pyproject.toml of the plugin
    [project.entry-points."linattn.backends"]
    my-backend = "my_package.plugin"

    # my_package/plugin.py
    from linattn.dispatch.hookspecs import hookimpl
    LINATTN_API_VERSION = "1"            # the plugin API version this plugin targets

    @hookimpl
    def linattn_register_backends():
        from my_package.backend import MyBackend
        return [MyBackend]

Built-in backends register through the very same hook (``linattn.backends.builtin``).
"""

from __future__ import annotations

from typing import Optional

import pluggy

PROJECT = "linattn"
#: The plugin API version this linattn implements, and the range of versions it accepts.
PLUGIN_API_VERSION = "1"
SUPPORTED_API_VERSIONS = frozenset({"1"})

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
    """

    LINATTN_API_VERSION = PLUGIN_API_VERSION

    def __init__(self, *classes):
        self.classes = list(classes)

    @hookimpl
    def linattn_register_backends(self):
        return self.classes

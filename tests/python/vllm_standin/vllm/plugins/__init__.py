# SPDX-License-Identifier: MIT
"""Stands for vllm/plugins/__init__.py: load_general_plugins() calls every
entry point of the group vllm.general_plugins (VLLM_PLUGINS, when set,
names the ones allowed), once per process.

Read at vllm-project/vllm a27dcf13 (vllm/plugins/__init__.py)."""
import os
from importlib.metadata import entry_points

DEFAULT_PLUGINS_GROUP = "vllm.general_plugins"
#: names of the entry points called (the test reads it)
loaded = []


def load_general_plugins():
    if loaded:
        return
    allowed = os.environ.get("VLLM_PLUGINS")
    allowed = allowed.split(",") if allowed is not None else None
    for ep in entry_points(group=DEFAULT_PLUGINS_GROUP):
        if allowed is None or ep.name in allowed:
            ep.load()()
            loaded.append(ep.name)

#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The vLLM plugin example's entry point (lib/python/examples/vllm_plugin,
kvdmabuf_vllm.register), which vLLM calls unguarded in every process:
with a vLLM whose sleep-mode allocator fails to import with an error other
than ImportError (a CUDA driver too old, say), it logs why it disabled
itself and returns, so the engine still starts; with the stand-in vLLM
(tests/python/vllm_standin), which has vLLM's tag hooks, it subscribes to
them for weights and kv_cache, once however often it is called, and wraps
nothing. Each case runs in a fresh interpreter. Host-only."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))  # ktap
import ktap  # noqa: E402
from ktap import check  # noqa: E402

TOP = ktap.use_build_tree()
PLUGIN = os.path.join(TOP, "lib", "python", "examples", "vllm_plugin")

CODE = """
import sys
sys.path.insert(0, %r)
import ktap
ktap.use_build_tree()
import kvdmabuf_vllm
kvdmabuf_vllm.register()
from vllm.device_allocator.cumem import CuMemAllocator
print("wrapped", getattr(CuMemAllocator, "_kvdmabuf_wrapped", False))
""" % os.path.join(HERE, "..")


def run(vllm_dir, code):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [vllm_dir, PLUGIN, os.path.join(TOP, "lib", "python"),
         os.path.join(TOP, "lib", "python", "examples")]))
    return subprocess.run([sys.executable, "-c", code], env=env,
                          capture_output=True, text=True,
                          timeout=ktap.scaled(60))


def broken_vllm_does_not_stop_the_engine():
    with tempfile.TemporaryDirectory() as d:
        pkg = os.path.join(d, "vllm", "device_allocator")
        os.makedirs(pkg)
        for f in ("vllm/__init__.py", "vllm/device_allocator/__init__.py"):
            open(os.path.join(d, f), "w").close()
        with open(os.path.join(pkg, "cumem.py"), "w") as f:
            f.write('raise RuntimeError("CUDA driver too old")\n')
        p = run(d, CODE.replace('from vllm.device_allocator.cumem import '
                                'CuMemAllocator\nprint("wrapped", getattr('
                                'CuMemAllocator, "_kvdmabuf_wrapped", False))',
                                'print("engine starts")'))
    check(p.returncode == 0, "register() raised: %s" % p.stderr)
    check(p.stdout.strip() == "engine starts", p.stdout)
    check("kvdmabuf_vllm: disabled" in p.stderr and
          "RuntimeError: CUDA driver too old" in p.stderr, p.stderr)


def standin_vllm_tag_hooks_are_subscribed_once():
    code = CODE.replace("kvdmabuf_vllm.register()",
                        "kvdmabuf_vllm.register(); kvdmabuf_vllm.register()")
    code += ("from vllm import device_allocator as d\n"
             "print(sorted((t, len(h)) for t, h in d._tag_hooks.items()))\n")
    p = run(os.path.join(HERE, "vllm_standin"), code)
    check(p.returncode == 0, p.stderr)
    check(p.stdout.split("\n")[:2] == ["wrapped False",
                                       "[('kv_cache', 1), ('weights', 1)]"],
          p.stdout + p.stderr)


if __name__ == "__main__":
    sys.exit(ktap.main([
        broken_vllm_does_not_stop_the_engine,
        standin_vllm_tag_hooks_are_subscribed_once,
    ]))

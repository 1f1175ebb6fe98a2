# SPDX-License-Identifier: MIT
"""A stand-in for vLLM (tests/python/lib_install.py, vllm_plugin_*): the few names
the kvdmabuf plugin example touches, with vLLM's call order, and host
memory (hostvmm) in place of CUDA VMM memory. vLLM itself needs a GPU and
PyTorch, neither of which the unit lane has. Each module names the vLLM
file and function it stands for and the commit of vllm-project/vllm it was
read at (its docstring's last line); no vLLM code is copied."""

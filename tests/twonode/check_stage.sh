#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# make check's two-node stage, in each of the two guests of
# tests/vm/check.sh twonode (KVDMABUF_NODE 1 or 2): the two-node demo once,
# one cycle, then tests/mooncake/mooncake_vllm.py's two-node part (the
# vLLM stand-in with the plugin under the preload on node 1, the Mooncake
# store's master and segment on node 2). One pair of boots for both; each
# program waits for its peer on the other node. Fails when either fails.
tests=$(cd "$(dirname "$0")/.." && pwd)
rc=0
echo "# ===== twonode/kvdmabuf-twonode --cycles 1"
"$tests/twonode/kvdmabuf-twonode" --cycles 1 || rc=1
echo "# ===== mooncake/mooncake_vllm.py"
"$tests/mooncake/mooncake_vllm.py" || rc=1
exit $rc

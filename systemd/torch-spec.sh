#!/bin/sh
# What `pip install` gets for torch: one rule for `make venv` and systemd/install.sh.
#
#   SPX_TORCH_SPEC set      that (e.g. "torch --index-url https://download.pytorch.org/whl/cu124")
#   an NVIDIA driver loaded 'torch>=2.3': pip picks its CUDA build
#   otherwise               torch==2.13.0 (the CPU build this image ships; elsewhere set SPX_TORCH_SPEC,
#                           e.g. "torch --index-url https://download.pytorch.org/whl/cpu")
#
# Printed on one line, for the caller to word-split: the spec may carry pip options.
if [ -n "${SPX_TORCH_SPEC:-}" ]; then echo "$SPX_TORCH_SPEC"
elif [ -e /proc/driver/nvidia/version ]; then echo 'torch>=2.3'
else echo 'torch==2.13.0'; fi

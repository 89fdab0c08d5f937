"""Kuangchao's Python side: `import kuangchao.torch` registers the torch.distributed backend "kc".

The compiled module (_kc_torch) is built by CMake where Debian's PyTorch is installed
(python3-torch, libtorch-dev) and lands beside this file in the build tree:
PYTHONPATH=build/release/python makes `import kuangchao.torch` work. docs/user-guide/pytorch.md.
"""

"""Tensor kernels behind :func:`structgen.generation.verify.verify`, shipped as ``structgen.kernels``.

``torch_ref`` is the torch reference (the oracle, and the CPU path); ``triton_verify`` holds
the fused Triton kernels. Neither is imported here: the dispatcher loads the one it needs.
"""

"""CPU test stand-in for the CUDA-only ``sgl_kernel`` package (see tests/stubs/README.md).

Only ``sgl_kernel.speculative.reconstruct_indices_from_tree_mask`` exists, as a pure-torch
reference. Any other attribute raises AttributeError naming the missing op, so a test never runs
a silently faked kernel.
"""

__version__ = "0.0.0+cpu.test.standin"


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"sgl_kernel.{name} is not available: this is the CPU test stand-in "
        "(tests/stubs/sgl_kernel), which provides only "
        "speculative.reconstruct_indices_from_tree_mask"
    )

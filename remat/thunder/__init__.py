"""The Thunder adapter: the only part of remat that imports Thunder.

Importing this package applies the environment bridges (:mod:`remat.thunder._compat`) and then imports
Thunder, so every module below may ``import thunder`` at its top.

``capture``   the joint forward+backward trace of a training step (``remat.training_trace``)
``read``      a trace read into the IR (``remat.read_trace``): units, tensors, operations
``fuse``      nvFuser-style fusion regions (``remat.fuse``)
``regions``   regions as Thunder fusion bound symbols, and the executor that claims nvFuser's prims
``runtimes``  what runs a region: the torch reference (CPU) or nvFuser
``rewrite``   a plan layout made into a Thunder trace
``execute``   running joint traces on the CPU the way Thunder runs them
``attention`` attention executors (CPU flash attention for memory-faithful traces; cuDNN on Hopper)
``nvfuser``   regions as nvFuser FusionDefinitions (``remat.nvfuser``)
``executor``  the fusion executor remat puts in nvFuser's place inside ``thunder.jit``
``graph``     the planned forward and backward each as one Inductor graph (``runtime="inductor-graph"``)
"""

from remat.thunder._compat import import_thunder

import_thunder()

from thunder.core.trace import TraceCtx  # noqa: E402  (the type of a trace, for the layers above)

__all__ = ["TraceCtx"]

"""``remat.nvfuser``: fusion regions as nvFuser ``FusionDefinition`` scripts (public names).

The code lives in :mod:`remat.thunder.nvfuser` (it reads Thunder bound symbols); this module is the
public place to import it from: ``remat.nvfuser.definition_source(region)``, ``remat.nvfuser.build(region)``.
"""

from remat.thunder.nvfuser import (
    EMITTERS,
    MIN_LINEAR_VERSION,
    EmitError,
    NvFuserRegionCallable,
    available,
    build,
    clear_shared_definitions,
    contiguous_descriptor,
    definition_key,
    definition_source,
    linear_supported,
    shared_build,
    shared_definitions,
    supported_kinds,
    tensor_descriptor,
    version,
)

__all__ = [
    "EMITTERS",
    "MIN_LINEAR_VERSION",
    "EmitError",
    "NvFuserRegionCallable",
    "available",
    "build",
    "clear_shared_definitions",
    "contiguous_descriptor",
    "definition_key",
    "definition_source",
    "linear_supported",
    "shared_build",
    "shared_definitions",
    "supported_kinds",
    "tensor_descriptor",
    "version",
]

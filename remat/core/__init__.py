"""The core: plain data that every stage shares, with no Thunder import.

``ops`` (the op table), ``strides`` and ``views`` (which values alias which storage), ``storage`` (in-place
hazards), ``ir`` (the FusionGraph and its parts), ``plain`` (networkx graphs adopted as the IR),
``memory`` (the memory model and budgets), ``donation`` (which region outputs a runtime writes over
inputs dying at their region), ``policies`` (what may be recomputed, what may fuse),
``layout`` (how a plan changes a trace, unit by unit) and ``collector`` (Python's garbage collector,
paused while remat plans).
"""

"""Stage 3, *problem*: one flow network over the whole forward part of a training graph.

:func:`build_problem` turns a :class:`~remat.core.ir.FusionGraph` (read from a trace, or a plain
networkx graph adopted by :func:`remat.core.plain.plain_graph`) into a :class:`FlowProblem`: a
capacitated network whose minimum s-t cut is the cheapest set of forward values to save so that
everything the backward reads is either saved or recomputable from saved values, parameters and inputs.

Construction (the classical split-node formulation, over the *whole* forward at once):

* every forward value ``t`` (an output of a forward op) becomes two nodes ``in(t) -> out(t)`` joined by an
  edge of capacity ``save_cost(t)`` (:func:`remat.core.memory.save_cost`: its bytes, or 0 when keeping it
  costs nothing extra);
* an op that reads ``s`` and writes ``t`` adds ``out(s) -> in(t)`` with infinite capacity (to have ``t`` in
  the backward without saving it, its inputs must be there);
* values of ops that must not be recomputed are pinned to the source: ``SOURCE -> in(t)``, infinite;
* a forward value read by a backward op is pinned to the sink: ``out(t) -> SINK``, infinite;
* parameters and inputs are always available and are left out of the network.

A value whose split edge is cut is *saved*; a forward op whose value sits wholly on the sink side and is
needed by the backward is *recomputed* there.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass, field

import numpy as np

from remat.core.ir import FORWARD, FusionGraph, Op
from remat.core.layout import read_outside_regions
from remat.core.memory import held_storage
from remat.core.memory import save_cost as value_save_cost
from remat.core.ops import ALL_GATHER_KINDS, REGATHER_TAG, RETURN_KIND
from remat.core.policies import RecomputePolicy
from remat.errors import GraphError

__all__ = ["FlowProblem", "build_problem", "SOURCE", "SINK", "INFINITE"]

SOURCE = 0
SINK = 1
#: Marker for infinite capacity in :attr:`FlowProblem.capacities` (solvers map it to their own infinity).
INFINITE = -1


@dataclass
class FlowProblem:
    """A flow network with nodes ``0`` (source), ``1`` (sink), then ``in``/``out`` nodes of each value.

    ``tails``/``heads``/``capacities`` list the edges (capacity :data:`INFINITE` for pinned and data
    edges).  ``values[i]`` is the name of the value whose split nodes are ``2 + 2*i`` (in) and
    ``3 + 2*i`` (out).  ``producer[name]`` is the op node writing a value; ``reads[op]`` the network values
    an op reads; ``backward_reads`` the values read by backward ops; ``pinned`` the values that may not be
    recomputed; ``priced_ops`` the op nodes that may be recomputed at a price (see :func:`build_problem`).
    """

    values: list[str]
    value_index: dict[str, int]
    tails: np.ndarray
    heads: np.ndarray
    capacities: np.ndarray
    save_cost: dict[str, int]
    value_bytes: dict[str, int]
    producer: dict[str, Hashable]
    reads: dict[Hashable, tuple[str, ...]]
    backward_reads: set[str]
    pinned: set[str]
    op_flops: dict[Hashable, int] = field(default_factory=dict)
    unsavable: set[str] = field(default_factory=set)
    #: forward ops recomputable at a price (``priced`` allows them, ``recompute`` does not)
    priced_ops: set[Hashable] = field(default_factory=set)
    #: the graph the problem was built from (a plan's extra FLOPs are counted on its layout)
    graph: FusionGraph | None = None

    @property
    def num_nodes(self) -> int:
        return 2 + 2 * len(self.values)

    def in_node(self, name: str) -> int:
        return 2 + 2 * self.value_index[name]

    def out_node(self, name: str) -> int:
        return 3 + 2 * self.value_index[name]


def build_problem(
    graph: FusionGraph,
    recompute: RecomputePolicy | None = None,
    *,
    priced: RecomputePolicy | None = None,
    recompute_price: float = 0.0,
    weights: Mapping[str, float] | None = None,
    priced_ops: Collection[Hashable] | None = None,
    keep: Collection[str] = (),
) -> FlowProblem:
    """Build the flow network of ``graph`` (see the module docstring).  ``recompute`` says what may be
    recomputed (default :class:`~remat.RecomputePolicy()`); ops that read a buffer written in place
    later (:attr:`FusionGraph.mutation_hazards`) never are.

    Trading compute for memory (used by :mod:`remat.planning.budget`): ops that ``recompute`` does not
    allow but ``priced`` does may be recomputed at a price: ``SOURCE -> in(t)`` gets capacity
    ``recompute_price * flops`` (bytes per FLOP; split evenly over the op's outputs), so the cut pays for
    their FLOPs instead of being forbidden them.  ``weights`` scales the save cost of named values (the
    peak-aware search makes values that are not alive at the peak cheap to keep).  ``priced_ops`` (op
    ids) restricts pricing to those ops: the others stay pinned (the budget search interpolates between
    frontier plans this way); None prices every op ``priced`` allows.

    Re-gathers (ops tagged ``regather``, :func:`remat.core.ops.regather_tags`) that ``recompute`` allows
    (``RecomputePolicy(regather_parameters=True)``) are free without ``priced``; with ``priced`` (a budget
    search) they are priced like the ops ``priced`` allows, at their FLOP-equivalent
    (:data:`remat.core.ops.REGATHER_FLOPS_PER_BYTE` per gathered byte), so at an infinite price nothing is
    re-gathered.  The future of a re-gather the policies allow is never a saved value (it counts 0 bytes
    but holds the gathered buffer), also where ``priced_ops`` leaves the gather pinned.

    ``keep``: values whose producers may not be recomputed, whatever the policies say (the budget search
    above the default plan keeps values this way, :mod:`remat.planning.budget`); with
    ``RecomputePolicy(unfused_readers=False)`` every value a backward op outside every region reads is
    kept (:func:`remat.core.layout.read_outside_regions`).
    """
    if graph.ops is None:
        raise GraphError("this FusionGraph was read without operations; the solver needs them (remat.read_trace(trace))")
    policy = recompute or RecomputePolicy()
    weights = weights or {}
    network = _network(graph)
    value_index = network.value_index
    pinned: set[str] = set()
    unsavable: set[str] = set()

    kept = frozenset(keep)
    if not policy.unfused_readers:  # values a backward op outside every region reads stay saved
        kept = kept | read_outside_regions(graph)
    price: dict[str, int] = {}  # value -> capacity of SOURCE -> in(value) for priced recomputation
    priced_set: set[Hashable] = set()
    if priced_ops is not None and not isinstance(priced_ops, (set, frozenset)):
        priced_ops = set(priced_ops)
    may_price = math.isfinite(recompute_price)
    for op, names, (fixed, free, priceable) in zip(network.ops, network.op_values, _op_rules(graph, network, policy, priced)):
        if fixed is False:  # reads a buffer written in place later, or the graph says so
            allowed = False
        elif kept and not kept.isdisjoint(op.outputs):
            allowed = False  # asked to keep (``keep``, or its recomputation could not fuse into its reader)
        elif fixed is not None:  # the graph's own say (plain graphs)
            allowed = fixed
        elif free:
            allowed = True
        elif priceable and may_price and (priced_ops is None or op.id in priced_ops):
            share = recompute_price * op.flops / max(len(op.outputs), 1)
            for name in op.outputs:
                price[name] = max(int(round(share)), 1)
            priced_set.add(op.id)
            allowed = True
        else:
            allowed = False
        if not allowed:
            pinned.update(names)
        if not op.savable or ((free or priceable) and REGATHER_TAG in op.tags and op.kind in ALL_GATHER_KINDS):
            # A re-gather's future holds the gathered buffer but counts 0 bytes: saving it instead
            # of its wait's output would look free.  It is re-issued whole, or its wait's output
            # (which the memory model counts) is what the cut keeps.  Also where this cut may not
            # re-issue the gather (``priced_ops`` allows its wait alone): re-running the wait on a
            # saved future is not a re-gather.
            unsavable.update(names)

    save_cost = dict(network.save_cost)
    for name, weight in weights.items():
        if name in save_cost:
            save_cost[name] = int(round(network.save_cost[name] * weight))
    tails: list[int] = []
    heads: list[int] = []
    caps: list[int] = []
    for name, i in value_index.items():
        tails.append(2 + 2 * i)
        heads.append(3 + 2 * i)
        caps.append(INFINITE if name in unsavable else save_cost[name])
        if name in pinned:
            tails.append(SOURCE)
            heads.append(2 + 2 * i)
            caps.append(INFINITE)
        elif name in price:
            tails.append(SOURCE)
            heads.append(2 + 2 * i)
            caps.append(price[name])
    # each problem gets its own containers (a FlowProblem is mutable); copying them is cheap
    values, value_bytes, producer = list(network.values), dict(network.value_bytes), dict(network.producer)
    reads, backward_reads, op_flops = dict(network.reads), set(network.backward_reads), dict(network.op_flops)
    tails = np.concatenate([np.asarray(tails, dtype=np.int64), network.data_tails])
    heads = np.concatenate([np.asarray(heads, dtype=np.int64), network.data_heads])
    caps = np.concatenate([np.asarray(caps, dtype=np.int64), np.full(len(network.data_tails), INFINITE, dtype=np.int64)])

    return FlowProblem(
        values=values,
        value_index=dict(value_index),
        tails=tails,
        heads=heads,
        capacities=caps,
        save_cost=save_cost,
        value_bytes=value_bytes,
        producer=producer,
        reads=reads,
        backward_reads=backward_reads,
        pinned=pinned,
        op_flops=op_flops,
        unsavable=unsavable,
        priced_ops=priced_set,
        graph=graph,
    )


@dataclass(frozen=True)
class _Network:
    """The parts of a graph's flow network that no policy, price, weight or kept value changes: its
    values (the outputs of forward ops, parameters and inputs aside) with their unweighted save costs,
    and the edges of data dependencies and backward reads (all infinite).  ``ops``: the forward ops
    :func:`build_problem` decides on, in graph order; ``op_values[k]``: the network values of ``ops[k]``."""

    ops: tuple[Op, ...]
    op_values: tuple[tuple[str, ...], ...]
    values: tuple[str, ...]
    value_index: dict[str, int]
    save_cost: dict[str, int]
    value_bytes: dict[str, int]
    producer: dict[str, Hashable]
    op_flops: dict[Hashable, int]
    reads: dict[Hashable, tuple[str, ...]]
    backward_reads: frozenset[str]
    data_tails: np.ndarray
    data_heads: np.ndarray
    #: per (recompute, priced) policy pair, :func:`_op_rules`
    rules: dict = field(default_factory=dict)


#: Per graph (dropped with it): its :class:`_Network` (a budget search builds dozens of problems of one graph).
_NETWORKS: weakref.WeakKeyDictionary[FusionGraph, _Network] = weakref.WeakKeyDictionary()


def _network(graph: FusionGraph) -> _Network:
    network = _NETWORKS.get(graph)
    if network is not None:
        return network
    tensors = graph.tensors
    held = held_storage(tensors, graph.forward_outputs)
    ops: list[Op] = []
    op_values: list[tuple[str, ...]] = []
    values: list[str] = []
    value_index: dict[str, int] = {}
    save_cost: dict[str, int] = {}
    value_bytes: dict[str, int] = {}
    producer: dict[str, Hashable] = {}
    op_flops: dict[Hashable, int] = {}
    for op in graph.ops:
        if op.phase != FORWARD or op.kind == RETURN_KIND or op.is_input or op.is_param:
            continue
        op_flops[op.id] = op.flops
        names: list[str] = []
        for name, nbytes in zip(op.outputs, op.output_bytes):
            info = tensors.get(name)
            if info is not None and info.kind in ("param", "input"):
                continue
            value_index[name] = len(values)
            values.append(name)
            save_cost[name] = value_save_cost(graph, name, held=held)
            value_bytes[name] = nbytes
            producer[name] = op.id
            names.append(name)
        ops.append(op)
        op_values.append(tuple(names))

    tails: list[int] = []
    heads: list[int] = []
    reads: dict[Hashable, tuple[str, ...]] = {}
    backward_reads: set[str] = set()
    for op in graph.ops:
        if op.kind == RETURN_KIND:
            continue
        # Names are matched with their producer: a backward region may recompute a forward value under
        # the forward's name (Thunder does this); reading that copy is not a read of the forward value.
        read = tuple(
            dict.fromkeys(
                name
                for name, src in zip(op.inputs, op.input_nodes)
                if name in value_index and producer[name] == src
            )
        )
        if not read:
            continue
        if op.phase == FORWARD:
            reads[op.id] = read
            for out in op.outputs:
                j = value_index.get(out)
                if j is None:
                    continue
                for name in read:
                    tails.append(3 + 2 * value_index[name])
                    heads.append(2 + 2 * j)
        else:
            for name in read:
                backward_reads.add(name)
                tails.append(3 + 2 * value_index[name])
                heads.append(SINK)
    network = _NETWORKS[graph] = _Network(
        tuple(ops), tuple(op_values), tuple(values), value_index, save_cost, value_bytes, producer, op_flops, reads,
        frozenset(backward_reads), np.asarray(tails, dtype=np.int64), np.asarray(heads, dtype=np.int64),
    )
    return network


def _op_rules(
    graph: FusionGraph, network: _Network, policy: RecomputePolicy, priced: RecomputePolicy | None
) -> list[tuple[bool | None, bool, bool]]:
    """For each op of ``network``, what the policies alone decide: ``(fixed, free, priceable)``.
    ``fixed``: False for an op reading a buffer written in place later, the op's own ``recompute``
    setting (plain graphs), else None; ``free``: ``policy`` allows it (a re-gather only without
    ``priced``); ``priceable``: ``priced`` would allow it at a price.  ``keep``, the price and
    ``priced_ops`` are :func:`build_problem`'s to apply.  Once per graph and policy pair."""
    key = (policy, priced)
    rules = network.rules.get(key)
    if rules is not None:
        return rules
    hazards = graph.mutation_hazards
    rules = []
    for op in network.ops:
        if op.id in hazards:  # reads a buffer that is written in place later: never recomputed
            rules.append((False, False, False))
        elif op.recompute is not None:
            rules.append((op.recompute == "allowed", False, False))
        else:
            allowed = policy.allows(op.tags, op.fusible)
            # A re-gather the policy allows costs communication: free without a price (the plan saves
            # as few bytes as it can, ZeRO3), priced at its FLOP-equivalent when a budget search prices.
            regather = allowed and REGATHER_TAG in op.tags
            free = allowed and not (regather and priced is not None)
            priceable = not free and priced is not None and (regather or priced.allows(op.tags, op.fusible))
            rules.append((None, free, priceable))
    network.rules[key] = rules
    return rules

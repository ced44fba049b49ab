"""torch.compile(model, backend="graphfuse"): Dynamo's graphs compiled by graphfuse.

    import torch, graphfuse.torch_backend           # the import is optional: the package
    compiled = torch.compile(model, backend="graphfuse")   # registers the name as an entry point
    with torch.no_grad():
        out = compiled(input_ids)
    graphfuse.torch_backend.reports()[-1]           # compile time, partitions, kernels, fallbacks

The route, for each graph Dynamo hands over and each new input signature (or once, for a graph
of symbolic sizes: see Shapes below):

1. **ATen, every shape concrete.** The graph is traced again with make_fx on the call's real
   inputs, functionalized (views become copies, no mutation is left), so every op is an ATen op
   with known shapes and dtypes. Parameters, and everything computed from parameters and shapes
   alone (transposed weights, rotary tables, causal masks), are folded into constants: the
   weights reach graphfuse as constants, which GEMM packing and the projection fusions need.
   (Symbolic: traced over Dynamo's fake inputs, sizes as sympy expressions; only what depends
   on no symbolic size is folded.)
2. **Partitions.** torch.fx's CapabilityBasedPartitioner groups the nodes that have an ATen ->
   ONNX translation (graphfuse._aten_onnx) into the largest acyclic partitions. Everything else
   stays in PyTorch in the outer graph, so an op graphfuse lacks (or a collective such as
   all_reduce) costs a partition boundary, never an error.
3. **One graphfuse session per partition**, built from the partition written as an ONNX model:
   the same importer, passes and kernels the ONNX route uses, so what fuses in an exported
   model fuses here.

Why ATen and not torch.onnx.export: export re-traces the whole module (seconds), cannot leave
part of a graph to PyTorch, and its failures are all-or-nothing; ATen after functionalization
is a few dozen ops with fixed semantics, each translated on its own, and a partition boundary
falls wherever a translation is missing.

**Shapes.** A graph whose sizes Dynamo made symbolic (dynamic=True, or its automatic dynamic
shapes once a second size is seen: a decode loop's growing KV cache) is compiled once for all
sizes. It is traced when Dynamo hands it over, over Dynamo's own fake inputs, so the ATen graph
keeps the sizes as sympy expressions (and any guard that tracing adds joins Dynamo's guards);
each partition becomes an ONNX model whose inputs carry those sizes as dim_params and which
computes the sizes its ops need from its inputs' shapes (graphfuse._aten_onnx, "Symbolic
sizes"). One session per partition then serves every size: graphfuse plans each new signature,
the later ones of a shape class from its template (a few ms), and keeps options["plan_cache"]
(default 64) plans. A size that Dynamo passes as an int and that no input tensor of the
partition has becomes a "size input": an empty bool tensor of shape [0, size], which graphfuse
reads the size from as from any input's shape. Where this is refused (options["symbolic"]=False,
or a graph that cannot be traced symbolically), the report says why (symbolic_refused) and the
graph is compiled per signature as below.

Other graphs are specialized to the input shapes (and the values of integer inputs) of each
call, and kept in a small LRU cache (options["cache_size"], default 4): a call with a new shape
compiles again, as a recompilation would. Parameters are read at compile time; an in-place
change to one (its version counter moves) compiles again. session_stats() counts the
compilations per Dynamo graph.

Buffers are constants as parameters are; a graph that writes into one in place runs in
PyTorch.

**Grad.** graphfuse is an inference compiler: a call with grad enabled and an input that
requires grad runs the graph in PyTorch, with a warning, so that training stays correct.

options (torch.compile(..., options={...})): "fusion" (default True), "threads" (graphfuse's CPU
pool; 0: the hardware's), "cache_size" (4), "symbolic" (default True: compile graphs of
symbolic sizes once), "plan_cache" (64: the plans a symbolic session keeps), "dump_dir" (writes
each partition's ONNX model there, named graph<G>_<compile>_<partition>.onnx, for `graphfuse explain`), "check" (default
False; also on with the environment variable GRAPHFUSE_CHECK=1): on the first call of each
compiled signature, every partition is also run in PyTorch on the same inputs and compared; the
first that differs (NaN where eager has none, or past the dtype's tolerance) is named in a
RuntimeWarning, and each partition's report carries "check" (ok, max_abs_err, output, why).
"""

from __future__ import annotations

import collections
import logging
import operator
import os
import time
import types
import warnings
import weakref
from typing import Any, Callable, Optional

import numpy as np
import sympy

import torch
import onnx
import torch.fx
from onnx import helper
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from . import Error, InferenceSession
from . import _aten_onnx as ao

log = logging.getLogger("graphfuse")

__all__ = ["graphfuse_backend", "reports", "clear_reports", "session_stats"]

_REPORTS: list = []
_MAX_REPORTS = 256
# graph id -> {"compiles": n, "symbolic": bool}; and the live compiled graphs, for their sessions.
_COMPILES: dict = {}
_GRAPHS: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()

# ONNX's protobuf limit is 2 GiB; a partition whose constants come near it stays in PyTorch.
_MAX_PARTITION_BYTES = 1_800_000_000


def reports() -> list:
    """One dict per graph signature compiled (the latest last): graph, signature, compile_ms,
    aten_ops, partitions (each: ops, kernels_before, kernels_after, compile_ms), fallback (op ->
    count and reason, for the ops left to PyTorch), symbolic (compiled once for every size),
    dims (the partitions' symbolic dims, by dim_param), size_inputs (sizes fed as empty
    [0, size] inputs), guards_added (by symbolic tracing), size_ops (size arithmetic left to
    Python), and symbolic_refused (why a graph with symbolic sizes is compiled per signature)."""
    return list(_REPORTS)


def clear_reports() -> None:
    _REPORTS.clear()
    _COMPILES.clear()


def session_stats() -> dict:
    """graph id -> compiles (graphfuse compilations of that Dynamo graph: one per signature, or
    one for all sizes when symbolic), symbolic, and over the sessions of its latest compilation
    (while the graph is alive): sessions, plans_made, plans_from_template, plans_ahead, hits,
    planning_ms."""
    out = {}
    for gid, c in _COMPILES.items():
        entry = dict(c)
        graph = _GRAPHS.get(gid)
        if graph is not None:
            sessions = graph.sessions()
            stats = [s.cache_stats() for s in sessions]
            entry.update(
                sessions=len(sessions),
                plans_made=sum(st["plans_made"] for st in stats),
                plans_from_template=sum(st.get("plans_from_template", 0) for st in stats),
                plans_ahead=sum(st.get("plans_ahead", 0) for st in stats),
                hits=sum(st["hits"] for st in stats),
                planning_ms=sum(st["planning_ms"] for st in stats),
            )
        out[gid] = entry
    return out


def _record(report: dict) -> None:
    _REPORTS.append(report)
    del _REPORTS[: max(0, len(_REPORTS) - _MAX_REPORTS)]


# --- tracing ---------------------------------------------------------------------------------


def _trace(gm: torch.fx.GraphModule, args: list, frozen: dict) -> torch.fx.GraphModule:
    """gm as an ATen graph of the non-frozen tensor args; `frozen` (position -> value) holds the
    parameters and non-tensor args, which tracing turns into constants."""
    positions = [i for i in range(len(args)) if i not in frozen]

    def f(*live):
        full = list(args)
        for i, v in zip(positions, live):
            full[i] = v
        for i, v in frozen.items():
            full[i] = v
        return gm(*full)

    from torch.func import functionalize

    traced = make_fx(functionalize(f, remove="mutations_and_views"), tracing_mode="real")(*[args[i] for i in positions])
    return traced


def _free_symbols(value) -> bool:
    if isinstance(value, torch.SymInt):
        return not value.node.expr.is_number
    if isinstance(value, torch.Tensor):
        return any(_free_symbols(d) for d in value.shape)
    return False


def _is_symbolic(gm: torch.fx.GraphModule) -> bool:
    """Whether Dynamo made any of the graph's input sizes symbolic."""
    return any(_free_symbols(n.meta.get("example_value")) for n in gm.graph.nodes if n.op == "placeholder")


def _trace_symbolic(gm: torch.fx.GraphModule) -> tuple:
    """(ATen graph, guards added): gm traced with make_fx, functionalized, over the fake inputs
    Dynamo recorded on its placeholders, in their fake mode, so that the sizes stay Dynamo's
    symbols. A guard that tracing adds (a size specialized by a decomposition) goes into
    Dynamo's shape environment, hence into the guards Dynamo builds after this backend returns:
    a call that breaks it recompiles instead of running a wrong plan."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.func import functionalize

    fakes = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    if any(not isinstance(f, (torch.Tensor, torch.SymInt)) for f in fakes):
        raise _Unsupported("an input that is neither a tensor nor a size")
    mode = next((f.fake_mode for f in fakes if isinstance(f, FakeTensor)), None)
    if mode is None or mode.shape_env is None:
        raise _Unsupported("no fake inputs with a shape environment")
    before = len(mode.shape_env.guards)
    # Views stay views (remove="mutations"): the *_copy forms that "mutations_and_views" writes
    # have no meta kernel for symbolic sizes (slice_copy reads a storage offset).
    with mode:
        traced = make_fx(functionalize(gm, remove="mutations"), tracing_mode="real")(*fakes)
    guards = [str(g.expr) for g in mode.shape_env.guards[before:]]
    return traced, guards


def _dim(d) -> Any:
    """A size as an int, or as the sympy expression of a symbolic one."""
    if isinstance(d, torch.SymInt):
        e = d.node.expr
        return int(e) if e.is_number else e
    return int(d)


def _symbolic_meta(value) -> Any:
    if isinstance(value, torch.Tensor):
        return ao.Meta(tuple(_dim(d) for d in value.shape), value.dtype)
    if isinstance(value, torch.SymInt):
        return ao.Meta((), torch.int64, _dim(value))
    if isinstance(value, (list, tuple)):
        return [_symbolic_meta(v) for v in value]
    return None


def _static_meta(m) -> bool:
    if isinstance(m, list):
        return all(_static_meta(x) for x in m)
    return isinstance(m, ao.Meta) and m.expr is None and ao.is_static(m.shape)


def _record_symbolic(template: torch.fx.GraphModule, args: list, frozen: dict):
    """A copy of the symbolic ATen graph with the frozen args (parameters, buffers, Python
    scalars) as constants, and what _Recorder gives for a concrete trace: each node's Meta
    (symbolic sizes as sympy), the constant nodes and their values. A node is constant when its
    inputs are and its result's shape is static: nothing that depends on a symbolic size is
    folded (a causal mask of the sequence's length is computed in the graph)."""
    graph = torch.fx.Graph()
    out = graph.graph_copy(template.graph, {})
    graph.output(out)
    gm = torch.fx.GraphModule(template, graph)  # copies the constants tracing lifted (get_attr)
    rec = types.SimpleNamespace(info={}, constant=set(), const_values={})
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(args):
        raise _Unsupported(f"the traced graph has {len(placeholders)} inputs, the call {len(args)}")
    for i, ph in enumerate(placeholders):
        if i not in frozen:
            rec.info[ph] = _symbolic_meta(ph.meta.get("val"))
            continue
        value = frozen[i]
        value = value.detach() if isinstance(value, torch.Tensor) else torch.as_tensor(value)
        name = f"_gf_arg_{i}"
        gm.register_buffer(name, value, persistent=False)
        with graph.inserting_before(ph):
            attr = graph.get_attr(name)
        ph.replace_all_uses_with(attr)
        graph.erase_node(ph)
        rec.info[attr] = ao.Meta(tuple(value.shape), value.dtype)
        rec.constant.add(attr)
        rec.const_values[attr] = value
    for n in list(graph.nodes):
        if n.op == "get_attr" and n not in rec.constant:  # a tensor tracing lifted into a constant
            value = getattr(gm, n.target)
            rec.info[n] = ao.Meta(tuple(value.shape), value.dtype)
            rec.constant.add(n)
            rec.const_values[n] = value
        if n.op != "call_function":
            continue
        m = _symbolic_meta(n.meta.get("val"))
        rec.info[n] = m
        if not (_foldable(n) and all(a in rec.constant for a in n.all_input_nodes)):
            continue
        if not (_static_meta(m) or m is None):
            continue
        a, kw = torch.fx.node.map_arg((n.args, n.kwargs), lambda x: rec.const_values[x])
        value = n.target(*a, **kw)
        if isinstance(value, (bool, int, float)):
            # A number computed from constants (a scale read from a scalar input with .item(),
            # its square root): written into its users as the literal.
            for user in list(n.users):
                user.args, user.kwargs = torch.fx.node.map_arg((user.args, user.kwargs),
                                                               lambda x: value if x is n else x)
            graph.erase_node(n)
            continue
        rec.const_values[n] = value
        rec.constant.add(n)
    graph.eliminate_dead_code()
    gm.recompile()
    return gm, rec


class _Recorder(torch.fx.Interpreter):
    """Runs the traced graph once, recording each node's (shape, dtype) and keeping the values
    of the nodes that depend on no input (they become constants)."""

    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__(gm)
        self.info: dict = {}
        self.const_values: dict = {}
        self.constant: set = set()

    def run_node(self, n):
        result = super().run_node(n)
        self.info[n] = _meta_of(result)
        if n.op == "get_attr":
            self.constant.add(n)
        elif n.op == "call_function" and _foldable(n) and (
            n.target in _SHAPE_ONLY or all(a in self.constant for a in n.all_input_nodes)
        ):
            self.constant.add(n)
        if n in self.constant:
            self.const_values[n] = result
        return result


def _meta_of(value) -> Any:
    if isinstance(value, torch.Tensor):
        return ao.Meta(tuple(value.shape), value.dtype)
    if isinstance(value, (list, tuple)):
        return [_meta_of(v) for v in value]
    return None


# Ops whose result depends on their operands' shapes and dtypes only, which a signature fixes.
_SHAPE_ONLY = {
    torch.ops.aten.ones_like.default, torch.ops.aten.zeros_like.default, torch.ops.aten.full_like.default,
    torch.ops.aten.new_ones.default, torch.ops.aten.new_zeros.default, torch.ops.aten.new_full.default,
}


def _foldable(n) -> bool:
    target = n.target
    if target is operator.getitem:
        return True
    tags = getattr(target, "tags", ())
    return torch.Tag.nondeterministic_seeded not in tags


def _fold_constants(gm: torch.fx.GraphModule, rec: _Recorder) -> int:
    """Replaces each constant call_function node that a non-constant node (or the output) uses
    by a get_attr of its value. Returns how many nodes were folded."""
    graph = gm.graph
    folded = 0
    for n in list(graph.nodes):
        if n.op != "call_function" or n not in rec.constant:
            continue
        value = rec.const_values.get(n)
        if not isinstance(value, torch.Tensor):
            continue
        if all(u in rec.constant for u in n.users if u.op != "output") and not any(u.op == "output" for u in n.users):
            continue
        name = f"_gf_const_{folded}"
        while hasattr(gm, name):
            name += "_"
        gm.register_buffer(name, value.detach().clone() if value._is_view() else value.detach(), persistent=False)
        with graph.inserting_before(n):
            attr = graph.get_attr(name)
        rec.info[attr] = rec.info[n]
        rec.constant.add(attr)
        rec.const_values[attr] = getattr(gm, name)
        n.replace_all_uses_with(attr)
        folded += 1
    graph.eliminate_dead_code()
    gm.recompile()
    return folded


_VIEWS = {
    torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default, torch.ops.aten.view_copy.default,
    torch.ops.aten.reshape.default,
}
_EXPANDS = {torch.ops.aten.expand.default, torch.ops.aten.expand_copy.default}


def _broadcast(a: tuple, b: tuple) -> Optional[tuple]:
    """The broadcast of two shapes whose dims are ints or sympy sizes, or None when it is not
    known to exist."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(reversed(out))


def _merge_matmul_views(gm: torch.fx.GraphModule, info: dict) -> int:
    """Undoes ATen's decomposition of matmul: view(mm(view(x), w)) and
    view(bmm(view(expand(a)), view(expand(b)))) become one matmul of the original operands, with
    the batch dims broadcast as ONNX's MatMul does. The exported graphs' fusion patterns (linear
    layers on [B, S, K], attention on [B, H, S, d]) are written for that form. Returns how many
    were merged."""
    from math import prod

    def strip(x, kinds):
        if isinstance(x, torch.fx.Node) and x.op == "call_function" and x.target in kinds and len(x.users) == 1:
            return x.args[0]
        return x

    def shape(x):
        m = info.get(x)
        return tuple(m.shape) if isinstance(m, ao.Meta) else None

    merged = 0
    graph = gm.graph
    for out in list(graph.nodes):
        if out.op != "call_function" or out.target not in _VIEWS:
            continue
        mm = out.args[0]
        if not (isinstance(mm, torch.fx.Node) and mm.target in (torch.ops.aten.mm.default, torch.ops.aten.bmm.default)
                and len(mm.users) == 1):
            continue
        a3, b3 = mm.args[0], mm.args[1]
        a, b = strip(strip(a3, _VIEWS), _EXPANDS), strip(strip(b3, _VIEWS), _EXPANDS)
        sa, sb, sa3, sb3, so = shape(a), shape(b), shape(a3), shape(b3), shape(out)
        if None in (sa, sb, sa3, sb3, so) or len(sa) < 2 or len(sb) < 2 or sa[-1] != sb[-2]:
            continue
        batch = _broadcast(sa[:-2], sb[:-2])
        if batch is None:
            continue
        m, k, n = sa[-2], sa[-1], sb[-1]
        if so != batch + (m, n):
            continue
        if mm.target == torch.ops.aten.mm.default:
            # x [..., M, K] as [prod, K] times a 2-D w: only when w is not broadcast.
            ok = len(sb) == 2 and sa3 == (prod(sa[:-1]), k) and sb3 == (k, n) and batch == sa[:-2]
        else:
            ok = sa3 == (prod(batch), m, k) and sb3 == (prod(batch), k, n)
        if not ok:
            continue
        with graph.inserting_before(out):
            fused = graph.call_function(torch.ops.aten.matmul.default, (a, b))
        info[fused] = info[out]
        out.replace_all_uses_with(fused)
        merged += 1
    if merged:
        graph.eliminate_dead_code()
        gm.recompile()
    return merged


# --- partitioning ----------------------------------------------------------------------------


class _Support(OperatorSupportBase):
    def __init__(self, info: dict):
        self.info = info
        self.refused: dict = {}

    def is_node_supported(self, submodules, node) -> bool:
        reason = ao.support(node, self.info)
        if reason is not None and node.op == "call_function" and node.target is not operator.getitem:
            key = str(node.target)
            count, _ = self.refused.get(key, (0, reason))
            self.refused[key] = (count + 1, reason)
        return reason is None


class _Runner(torch.nn.Module):
    """A partition run by a graphfuse session: torch tensors in, torch tensors out. With a
    `check` (the check option), its first call also runs the partition's ATen ops in PyTorch on
    the same inputs and compares (_check_partition)."""

    def __init__(self, session: InferenceSession, out_dtypes: list, tuple_out: bool, check: Optional[dict] = None,
                 size_inputs: tuple = ()):
        super().__init__()
        self.session = session
        self.run = session._session.run  # the extension's run, without the dict API around it
        self.out_dtypes = out_dtypes
        self.numpy_dtypes = all(dt != torch.bfloat16 for dt in out_dtypes)  # from_numpy gives them as they are
        self.tuple_out = tuple_out
        self.check = check
        # Positions among the inputs of the sizes passed as ints, fed as empty [0, size] arrays
        # (one kept per size: an array of no elements is never written).
        self.size_inputs = frozenset(size_inputs)
        self.carriers: dict = {}
        # A session of symbolic dims plans at its first run: the partition's report (kernels
        # before and after fusion) is filled from that plan.
        self.report: Optional[dict] = None

    def _carrier(self, size: int) -> np.ndarray:
        c = self.carriers.get(size)
        if c is None:
            c = self.carriers[size] = np.empty((0, size), np.bool_)
        return c

    def forward(self, *tensors):
        if not self.size_inputs and self.check is None and self.report is None:
            # The common call: numpy views of the tensors (no copy; a strided one is copied around
            # the run by the extension), outputs wrapped as they come. A tensor numpy cannot view
            # (bf16, one that needs grad) takes the general path below.
            try:
                feed = [t.numpy() for t in tensors]
            except (TypeError, RuntimeError):
                pass
            else:
                outs = self.run(feed)
                if self.numpy_dtypes:
                    result = [torch.from_numpy(o) for o in outs]
                    return tuple(result) if self.tuple_out else result[0]
                return self._outputs(outs)
        feed = []
        for i, t in enumerate(tensors):
            if i in self.size_inputs:
                feed.append(self._carrier(int(t)))
                continue
            if t.requires_grad:
                t = t.detach()
            if not t.is_contiguous():
                t = t.contiguous()
            # numpy views share the tensors' memory (no copy); bf16, which numpy lacks, goes by DLPack
            feed.append(t if t.dtype == torch.bfloat16 else t.numpy())
        outs = self.run(feed)
        if self.report is not None:
            report, self.report = self.report, None
            explained = self.session.explain() or {}
            report.update(kernels_before=explained.get("kernels_before"), kernels_after=explained.get("kernels_after"))
        if self.check is not None:
            result = self._outputs(outs, as_list=True)
            check, self.check = self.check, None
            _check_partition(check, tensors, result)
            return tuple(result) if self.tuple_out else result[0]
        return self._outputs(outs)

    def _outputs(self, outs: list, as_list: bool = False):
        result = []
        for o, dt in zip(outs, self.out_dtypes):
            t = torch.from_numpy(o)
            result.append(t if t.dtype == dt else t.to(dt))  # bf16 comes back as float32
        if as_list:
            return result
        return tuple(result) if self.tuple_out else result[0]


# The check option's tolerance per output dtype: |graphfuse - eager| <= atol + rtol * |eager|.
_CHECK_TOLERANCE = {torch.float32: (1e-3, 1e-4), torch.float16: (1e-2, 1e-2), torch.bfloat16: (5e-2, 5e-2)}


def _check_partition(check: dict, tensors: tuple, got: list) -> None:
    """Runs the partition's own ATen graph (check["module"]) in PyTorch on the inputs the
    session got (constants where the partition folded them) and compares each output with the
    session's: NaN where the other is not, or past the dtype's tolerance, is a mismatch. Fills
    check["result"] (the report's entry); a mismatch warns, naming the graph, the partition, the
    output and the first element that differs."""
    live = iter(tensors)
    args = [c if c is not None else next(live) for c in check["constants"]]
    with torch.no_grad():
        want = check["module"](*args)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    result = check["result"]
    result.update({"checked": True, "ok": True, "max_abs_err": 0.0})
    for j, (g, w) in enumerate(zip(got, want)):
        if not isinstance(w, torch.Tensor) or g.shape != w.shape:
            result.update({"ok": False, "output": j, "why": f"shape {tuple(g.shape)}, eager {tuple(getattr(w, 'shape', ()))}"})
            break
        if not g.dtype.is_floating_point:
            bad = g != w
        else:
            rtol, atol = _CHECK_TOLERANCE.get(g.dtype, (1e-3, 1e-4))
            gd, wd = g.double(), w.double()
            err = (gd - wd).abs()
            finite = torch.isfinite(err)
            if finite.any():
                result["max_abs_err"] = max(result["max_abs_err"], err[finite].max().item())
            same_special = (gd == wd) | (torch.isnan(gd) & torch.isnan(wd))
            bad = ~(same_special | (err <= atol + rtol * wd.abs()))
        if bad.any():
            at = tuple(int(i) for i in bad.nonzero()[0])
            result.update({"ok": False, "output": j, "why": f"element {list(at)} is {g[at].item()!r}, eager gives {w[at].item()!r}"})
            break
    if not result["ok"]:
        warnings.warn(
            f"graphfuse check: graph {check['graph']} partition {check['name']} differs from eager at output "
            f"{result['output']}: {result['why']}", RuntimeWarning, stacklevel=3)


def _onnx_dims(shape) -> list:
    return [d if isinstance(d, int) else ao.dim_name(d) for d in shape]


def _onnx_of_partition(sub: torch.fx.GraphModule, info_outer: dict, rec: _Recorder, name: str):
    """The partition `sub` as an ONNX ModelProto, the positions of its inputs that stay inputs
    (the others are constants, written as initializers), and among those the sizes fed as size
    inputs. Every node of `sub` carries meta["gf_orig"], the traced node it copies, whose Meta
    and constness `rec` knows. A size input (a SymInt) whose value the tensor inputs' shapes
    give is dropped: the graph computes it from them."""
    info: dict = {}
    b = ao.Builder(info)
    graph_inputs = {}
    live_positions = []
    sizes = []
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    const_bytes = 0
    for k, ph in enumerate(placeholders):
        orig = ph.meta["gf_orig"]
        info[ph] = info_outer[orig]
        if orig in rec.constant:
            value = rec.const_values[orig]
            const_bytes += value.numel() * value.element_size()
            if const_bytes > _MAX_PARTITION_BYTES:
                raise ValueError(f"over {const_bytes / 1e9:.2f} GB of constants; ONNX's limit is 2 GiB")
            b.names[ph] = b.initializer(value, "w")
        elif isinstance(info[ph], ao.Meta) and info[ph].expr is not None:
            sizes.append((k, ph))  # after the tensors, whose shapes may give it
        else:
            m = info[ph]
            graph_inputs[k] = helper.make_tensor_value_info(f"in{k}", ao.ONNX_DTYPE[m.dtype], _onnx_dims(m.shape))
            b.names[ph] = f"in{k}"
            b.bind_dims(f"in{k}", m.shape)
            if b.data is None and m.shape and all(not isinstance(d, int) or d > 0 for d in m.shape):
                b.data, b.data_dtype = f"in{k}", m.dtype  # never empty: symbolic sizes are 2 or more
            live_positions.append(k)
    size_inputs = []
    for k, ph in sizes:
        e = info[ph].expr
        if not b.knows(e):
            # A size input: an empty [0, e] tensor, whose shape gives e (and the symbol of e = s + c)
            graph_inputs[k] = helper.make_tensor_value_info(f"size{k}", onnx.TensorProto.BOOL, [0, ao.dim_name(e)])
            b.bind_dims(f"size{k}", [0, e])
            b.bind_size(f"size{k}", 1, e)
            live_positions.append(k)
            size_inputs.append(k)
        b.names[ph] = b.size0(e)
    live_positions.sort()
    size_inputs = [live_positions.index(k) for k in size_inputs]
    graph_inputs = [graph_inputs[k] for k in live_positions]
    output_node = next(n for n in sub.graph.nodes if n.op == "output")
    for n in sub.graph.nodes:
        if n.op == "call_function":
            info[n] = info_outer[n.meta["gf_orig"]]
            b.translate(n)
    ret = output_node.args[0]
    tuple_out = isinstance(ret, (tuple, list))
    rets = list(ret) if tuple_out else [ret]
    graph_outputs = []
    out_dtypes = []
    for j, r in enumerate(rets):
        m = b.meta(r)
        src = b.names[r]
        out_name = f"out{j}"
        b.graph.node.append(helper.make_node("Identity", [src], [out_name], name=b.fresh("n_out")))
        graph_outputs.append(helper.make_tensor_value_info(out_name, ao.ONNX_DTYPE[m.dtype], _onnx_dims(m.shape)))
        out_dtypes.append(m.dtype)
    model = b.model
    model.graph.name = name
    model.graph.input.extend(graph_inputs)
    model.graph.output.extend(graph_outputs)
    model.opset_import.append(helper.make_opsetid("", ao.OPSET))
    model.producer_name = "graphfuse.torch_backend"
    model.ir_version = 9
    return model, live_positions, out_dtypes, tuple_out, size_inputs


def _frozen_positions(gm: torch.fx.GraphModule, example_inputs: list) -> tuple:
    """(state, scalars): the graph inputs that are a module's parameters or buffers (Parameters,
    and the tensors whose Dynamo source reads a module's _parameters or _buffers), and those that
    are Python numbers Dynamo passes as 0-d tensors (with dynamic shapes: a layer's eps, a
    scale). Both become constants; a scalar's value joins the signature."""
    positions = {i for i, a in enumerate(example_inputs) if isinstance(a, torch.nn.Parameter)}
    scalars = set()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, n in enumerate(placeholders):
        grapharg = n.meta.get("grapharg")
        if getattr(grapharg, "pass_arg_as_tensor", False):
            scalars.add(i)
            continue
        source = getattr(grapharg, "source", None)
        while source is not None:
            if type(source).__name__ in ("UnspecializedParamBufferSource", "ParamBufferSource"):
                positions.add(i)
                break
            if getattr(source, "member", None) in ("_parameters", "_buffers"):
                positions.add(i)
                break
            source = getattr(source, "base", None)
    return positions, scalars


def _compile_signature(gm: torch.fx.GraphModule, args: list, state: set, options: dict, graph_id: int) -> tuple:
    """(callable taking the live tensor args, report) for these args; `state` holds the
    positions of the module's parameters and buffers, which become constants."""
    t0 = time.perf_counter()
    frozen = {i: a for i, a in enumerate(args) if i in state or not isinstance(a, torch.Tensor)}
    # Tracing and recording run the graph for real, twice: each on its own copy of the live
    # inputs, since a graph may write into them in place (transformers' static KV cache writes
    # its rows and advances its length counter). On the inputs themselves those writes would
    # happen three times for one call.
    traced = _trace(gm, _copies(args, frozen), frozen)
    for n in traced.graph.nodes:
        if n.op == "call_function" and n.target in (torch.ops.aten.copy_.default,) and n.args[0].op == "get_attr":
            raise _Unsupported("the graph writes into a parameter or buffer in place")
    live = [a for i, a in enumerate(_copies(args, frozen)) if i not in frozen]
    t_trace = time.perf_counter()
    rec = _Recorder(traced)
    with torch.no_grad():
        rec.run(*live)
    fused, report = _compile_traced(traced, rec, options, graph_id, t0, t_trace, plan_cache=1)
    report["signature"] = _signature_text(args, frozen)
    return fused, report


def _compile_symbolic(template: torch.fx.GraphModule, guards: list, args: list, state: set, options: dict,
                      graph_id: int) -> tuple:
    """(callable taking the live args, tensors and sizes, report) for every size of a graph
    traced symbolically (_trace_symbolic); `args` (a call's) give the values of the frozen
    positions in `state`."""
    t0 = time.perf_counter()
    frozen = {i: a for i, a in enumerate(args) if i in state}
    traced, rec = _record_symbolic(template, args, frozen)
    for n in traced.graph.nodes:
        if n.op == "call_function" and n.target in (torch.ops.aten.copy_.default,) and n.args[0].op == "get_attr":
            raise _Unsupported("the graph writes into a parameter or buffer in place")
    signature = ";".join(
        f"{str(m.dtype).replace('torch.', '')}{_onnx_dims(m.shape)}" if m.expr is None else ao.dim_name(m.expr)
        for n in traced.graph.nodes if n.op == "placeholder" for m in [rec.info[n]]
    )
    fused, report = _compile_traced(traced, rec, options, graph_id, t0, time.perf_counter(),
                                    plan_cache=int(options.get("plan_cache", 64)))
    report["signature"] = signature
    report["symbolic"] = True
    report["guards_added"] = guards
    return fused, report


def _is_size(m) -> bool:
    return isinstance(m, ao.Meta) and m.expr is not None


def _compile_traced(traced: torch.fx.GraphModule, rec, options: dict, graph_id: int, t0: float, t_trace: float,
                    plan_cache: int) -> tuple:
    """Folds, partitions and compiles an ATen graph whose Metas and constants `rec` holds:
    (the graph with graphfuse sessions in its partitions, report)."""
    folded = _fold_constants(traced, rec)
    _merge_matmul_views(traced, rec.info)
    for n in traced.graph.nodes:
        n.meta["gf_orig"] = n
    # Size arithmetic (sym_size, int add / mul) runs in Python on the call's ints, not counted
    # as ops; the partitions compute the sizes they need from their inputs' shapes.
    size_ops = sum(1 for n in traced.graph.nodes if n.op == "call_function" and _is_size(rec.info.get(n)))
    aten_ops = sum(1 for n in traced.graph.nodes if n.op == "call_function" and n.target is not operator.getitem
                   and not _is_size(rec.info.get(n)))
    support = _Support(rec.info)
    # A partition of one op (views, casts and getitems not counted) stays in PyTorch: there is
    # nothing to fuse, and the crossing costs more than it saves.
    partitioner = CapabilityBasedPartitioner(
        traced, support, allows_single_node_partition=False, non_compute_ops=ao.VIEW_OPS
    )
    partitions = partitioner.propose_partitions()
    fused = partitioner.fuse_partitions(partitions) if partitions else traced
    part_reports = []
    fallback = collections.Counter()
    reasons = {}
    dims, size_inputs, runners = set(), [], []
    for n in list(fused.graph.nodes):
        size_op = _is_size(rec.info.get(n.meta.get("gf_orig")))
        if n.op == "call_function" and n.target is not operator.getitem and not size_op:
            key = str(n.target)
            fallback[key] += 1
            reasons[key] = support.refused.get(key, (0, "partition too small"))[1]
        if n.op != "call_module":
            continue
        sub = getattr(fused, n.target)
        tp = time.perf_counter()
        try:
            model, live_pos, out_dtypes, tuple_out, sizes = _onnx_of_partition(sub, rec.info, rec, n.target)
            if options.get("dump_dir"):
                os.makedirs(options["dump_dir"], exist_ok=True)
                path = os.path.join(options["dump_dir"], f"graph{graph_id}_{len(_REPORTS)}_{n.target}.onnx")
                onnx.save(model, path)
            session = InferenceSession(
                model.SerializeToString(), backend="cpu", threads=options.get("threads", 0),
                fusion=options.get("fusion", True), plan_cache_capacity=plan_cache,
            )
            explained = session.explain() or {}
        except Exception as e:  # a partition graphfuse refuses runs in PyTorch
            log.warning("graphfuse: partition %s stays in PyTorch: %s", n.target, e)
            for s in sub.graph.nodes:
                if s.op == "call_function" and s.target is not operator.getitem:
                    fallback[str(s.target)] += 1
                    reasons[str(s.target)] = f"partition refused: {e}"
            continue
        check = None
        if options.get("check"):
            placeholders = [p for p in sub.graph.nodes if p.op == "placeholder"]
            check = {
                "graph": graph_id, "name": n.target, "module": sub, "result": {"checked": False},
                "constants": [None if k in live_pos else rec.const_values[p.meta["gf_orig"]]
                              for k, p in enumerate(placeholders)],
            }
        runner = _Runner(session, out_dtypes, tuple_out, check, sizes)
        runners.append(runner)
        for vi in model.graph.input:
            dims.update(d.dim_param for d in vi.type.tensor_type.shape.dim if d.dim_param)
        size_inputs.extend(f"{n.target}.{model.graph.input[j].name}" for j in sizes)
        setattr(fused, n.target, runner)
        n.args = tuple(n.args[k] for k in live_pos)
        part_reports.append(
            {
                "name": n.target,
                "ops": sum(1 for s in sub.graph.nodes if s.op == "call_function" and s.target is not operator.getitem),
                "kernels_before": explained.get("kernels_before"),
                "kernels_after": explained.get("kernels_after"),
                "compile_ms": (time.perf_counter() - tp) * 1e3,
            }
        )
        if check is not None:
            part_reports[-1]["check"] = check["result"]
        if not explained:
            runner.report = part_reports[-1]
    fused.graph.eliminate_dead_code()
    fused.recompile()
    fused._gf_runners = runners
    report = {
        "graph": graph_id,
        "signature": "",
        "compile_ms": (time.perf_counter() - t0) * 1e3,
        "trace_ms": (t_trace - t0) * 1e3,
        "aten_ops": aten_ops,
        "size_ops": size_ops,
        "constants_folded": folded,
        "partitions": part_reports,
        "fallback": {k: {"count": c, "reason": reasons[k]} for k, c in sorted(fallback.items())},
        "symbolic": False,
        "dims": sorted(dims),
        "size_inputs": size_inputs,
    }
    return fused, report


def _copies(args: list, frozen: dict) -> list:
    """args with each live tensor replaced by a copy (same shape, strides and values)."""
    return [a.clone() if isinstance(a, torch.Tensor) and i not in frozen else a for i, a in enumerate(args)]


def _signature_text(args: list, frozen: dict) -> str:
    parts = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and i not in frozen:
            parts.append(f"{str(a.dtype).replace('torch.', '')}{list(a.shape)}")
        elif not isinstance(a, torch.Tensor):
            parts.append(repr(a))
    return ";".join(parts)


class _Unsupported(Exception):
    """A graph that graphfuse leaves to PyTorch as a whole."""


def _key(args: list, state: set, scalars: set) -> tuple:
    key = []
    for i, a in enumerate(args):
        if i in scalars:
            key.append(("s", a.item() if isinstance(a, torch.Tensor) else a))
        elif i in state:
            key.append(("p", id(a), a._version))
        elif isinstance(a, torch.Tensor):
            key.append((tuple(a.shape), a.dtype, a.device.type))
        else:
            key.append(("v", a))
    return tuple(key)


class _CompiledGraph:
    """What the backend returns for one Dynamo graph: compiles once for all sizes when it was
    traced symbolically (`symbolic`: the ATen graph and the guards tracing added), else per
    input signature (LRU)."""

    _next_id = 0

    def __init__(self, gm: torch.fx.GraphModule, state: set, scalars: set, options: dict,
                 symbolic: Optional[tuple] = None, symbolic_refused: Optional[str] = None):
        self.gm = gm
        self.scalars = scalars
        self.state = state | scalars
        self.options = options
        self.cache: collections.OrderedDict = collections.OrderedDict()
        self.capacity = max(1, int(options.get("cache_size", 4)))
        _CompiledGraph._next_id += 1
        self.graph_id = _CompiledGraph._next_id
        self.warned_grad = False
        self.on_cpu: Optional[bool] = None
        self.symbolic = symbolic
        self.symbolic_refused = symbolic_refused
        self.state_positions = sorted(state)
        self.scalar_positions = sorted(scalars)
        self.sym_key = None  # the parameters' versions and scalars the symbolic entry was made for
        self.sym_entry = None
        _COMPILES[self.graph_id] = {"compiles": 0, "symbolic": symbolic is not None}
        if symbolic_refused is not None:
            _COMPILES[self.graph_id]["symbolic_refused"] = symbolic_refused
        _GRAPHS[self.graph_id] = self

    def sessions(self) -> list:
        entries = [self.sym_entry] if self.sym_entry is not None else list(self.cache.values())
        return [r.session for fn, _ in entries if fn is not self.gm for r in getattr(fn, "_gf_runners", ())]

    def _compiled(self, compile_fn, args: list) -> tuple:
        """(fn, live positions) from compile_fn(), or the graph in PyTorch when it fails; the
        report recorded either way."""
        try:
            with torch.no_grad():
                fn, report = compile_fn()
        except Exception as e:  # whatever graphfuse cannot compile runs in PyTorch, never fails
            reason = str(e) if isinstance(e, _Unsupported) else f"{type(e).__name__}: {e}"
            warnings.warn(f"graphfuse: this graph runs in PyTorch: {reason}", RuntimeWarning, stacklevel=3)
            fn, report = self.gm, {"graph": self.graph_id, "signature": "", "compile_ms": 0.0, "aten_ops": 0,
                                   "partitions": [], "fallback": {"*": {"count": 1, "reason": reason}},
                                   "symbolic": False}
        if self.symbolic_refused is not None:
            report["symbolic_refused"] = self.symbolic_refused
        _COMPILES[self.graph_id]["compiles"] += 1
        _record(report)
        log.info(
            "graphfuse: graph %d %s compiled in %.1f ms: %d ATen ops, %d partitions, fallback %s",
            self.graph_id, report["signature"], report["compile_ms"], report["aten_ops"],
            len(report["partitions"]), dict((k, v["count"]) for k, v in report["fallback"].items()),
        )
        return fn, report

    def _call_symbolic(self, args: list):
        key = tuple((id(args[i]), args[i]._version) for i in self.state_positions)
        if self.scalar_positions:
            key += tuple(args[i].item() for i in self.scalar_positions)
        if key != self.sym_key:
            template, guards = self.symbolic
            fn, _ = self._compiled(
                lambda: _compile_symbolic(template, guards, args, self.state, self.options, self.graph_id), args)
            live = list(range(len(args))) if fn is self.gm else [i for i in range(len(args)) if i not in self.state]
            self.sym_key, self.sym_entry = key, (fn, live)
        fn, live = self.sym_entry
        if fn is self.gm:
            return fn(*args)
        try:
            if not torch.is_grad_enabled():  # generate() runs under no_grad: no context to enter
                return fn.forward(*[args[i] for i in live])
            with torch.no_grad():
                return fn.forward(*[args[i] for i in live])
        except Error as e:  # a plan that fails to run: the graph runs in PyTorch from now on
            warnings.warn(f"graphfuse: a partition failed to run ({e}); this graph runs in PyTorch", RuntimeWarning,
                          stacklevel=3)
            self.sym_entry = (self.gm, list(range(len(args))))
            return self.gm(*args)

    def __call__(self, *args):
        args = list(args)
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            if not self.warned_grad:
                warnings.warn("graphfuse compiles for inference; with grad enabled this graph runs in PyTorch",
                              RuntimeWarning, stacklevel=2)
                self.warned_grad = True
            return self.gm(*args)
        if self.on_cpu is None:
            # Dynamo's guards fix every input's device for this graph: checked at its first call
            self.on_cpu = all(a.is_cpu for a in args if isinstance(a, torch.Tensor))
        if not self.on_cpu:
            return self.gm(*args)  # the graphfuse CUDA target is for ONNX sessions, not torch tensors yet
        if self.symbolic is not None:
            return self._call_symbolic(args)
        key = _key(args, self.state, self.scalars)
        entry = self.cache.get(key)
        if entry is None:
            fn, _ = self._compiled(
                lambda: _compile_signature(self.gm, args, self.state, self.options, self.graph_id), args)
            live = list(range(len(args))) if fn is self.gm else [
                i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in self.state
            ]
            entry = (fn, live)
            self.cache[key] = entry
            while len(self.cache) > self.capacity:
                self.cache.popitem(last=False)
        else:
            self.cache.move_to_end(key)
        fn, live = entry
        if fn is self.gm:
            return fn(*[args[i] for i in live])
        try:
            with torch.no_grad():
                return fn(*[args[i] for i in live])
        except Error as e:  # a plan that fails to run: this signature runs in PyTorch from now on
            warnings.warn(f"graphfuse: a partition failed to run ({e}); this graph runs in PyTorch", RuntimeWarning,
                          stacklevel=2)
            self.cache[key] = (self.gm, list(range(len(args))))
            return self.gm(*args)


def graphfuse_backend(gm: torch.fx.GraphModule, example_inputs: list, options: Optional[dict] = None) -> Callable:
    """The Dynamo backend: torch.compile(model, backend="graphfuse", options={...})."""
    opts = dict(options or {})
    if os.environ.get("GRAPHFUSE_CHECK", "") not in ("", "0"):
        opts.setdefault("check", True)
    known = {"fusion", "threads", "cache_size", "dump_dir", "check", "symbolic", "plan_cache"}
    unknown = set(opts) - known
    if unknown:
        raise ValueError(f"graphfuse backend: unknown options {sorted(unknown)}; it takes {', '.join(sorted(known))}")
    state, scalars = _frozen_positions(gm, example_inputs)
    symbolic, refused = None, None
    if _is_symbolic(gm):
        if not opts.get("symbolic", True):
            refused = 'options["symbolic"] is False'
        else:
            # Traced now, not at the first call, so that the guards tracing adds join Dynamo's.
            try:
                symbolic = _trace_symbolic(gm)
            except Exception as e:  # the graph is compiled per signature instead
                refused = str(e) if isinstance(e, _Unsupported) else f"{type(e).__name__}: {str(e).splitlines()[0]}"
                log.info("graphfuse: symbolic tracing refused (%s); compiling per signature", refused)
    return _CompiledGraph(gm, state, scalars, opts, symbolic, refused)


def _register() -> None:
    """Makes backend="graphfuse" work without the entry point (an uninstalled source tree)."""
    try:
        from torch._dynamo.backends.registry import _BACKENDS, register_backend

        if "graphfuse" not in _BACKENDS:
            register_backend(name="graphfuse")(graphfuse_backend)
    except Exception:  # an older torch without the registry: the entry point still works
        pass


_register()

"""ATen -> ONNX: one translator per ATen op, writing the ONNX nodes graphfuse imports.

The torch.compile backend (graphfuse.torch_backend) traces Dynamo's graph to ATen with every
shape concrete, partitions it into the nodes that have a translator here, and hands each
partition to graphfuse as an ONNX model. Translators emit the forms torch.onnx.export writes
for the same ops (RMSNorm as Pow/ReduceMean/Sqrt/Div, SiLU as Sigmoid/Mul, attention as
MatMul/Mul/Add/Softmax/MatMul), so the partitions fuse as the exported models do.

`support(node, info)` says whether a node can be translated (None) or why not (a string the
compile report shows); `Builder.translate(node)` writes it.

**Symbolic sizes.** A graph traced over Dynamo's dynamic shapes has sympy expressions (s0,
s1 + 1, 2*s0) among its sizes. Inputs then carry them as ONNX dim_params, and a size that an op
needs as a value (a Reshape's or Expand's shape, a Slice's end, a Range's bound, a causal mask's
extent) is computed in the graph from the inputs' shapes (Shape -> Gather -> Add/Mul/Div ->
Concat), as torch.onnx.export writes it: graphfuse folds that arithmetic when it plans a
signature, so one model serves every size and its plans come from a shape class's template.
Where a shape keeps one symbolic dim (or copies the input's), it stays a constant with -1 (or 0,
1 for Expand), which the fusion patterns read as exported models write it.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable, Optional

import onnx
import sympy
import torch
from onnx import TensorProto, helper
from torch.utils._sympy import functions as symfn

aten = torch.ops.aten

OPSET = 20

# torch dtype -> ONNX element type, for every dtype graphfuse has.
ONNX_DTYPE = {
    torch.float32: TensorProto.FLOAT,
    torch.float16: TensorProto.FLOAT16,
    torch.bfloat16: TensorProto.BFLOAT16,
    torch.int32: TensorProto.INT32,
    torch.int64: TensorProto.INT64,
    torch.bool: TensorProto.BOOL,
}

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)

# Constants up to this size are compared by content when written (see Builder.initializer).
_DEDUPE_BYTES = 4 << 20


class Meta:
    """What a node produced when the graph ran once: (shape, dtype) per tensor output. In a
    symbolic trace a dim may be a sympy expression, and a node whose value is a size (a SymInt)
    has shape (), dtype int64 and its expression in `expr`."""

    __slots__ = ("shape", "dtype", "expr")

    def __init__(self, shape: tuple, dtype: torch.dtype, expr: Any = None):
        self.shape = shape
        self.dtype = dtype
        self.expr = expr


def is_static(dims) -> bool:
    return all(isinstance(d, int) for d in dims)


def dim_name(expr) -> str:
    """The ONNX dim_param of a symbolic size: its expression without spaces (s0, s1+1)."""
    return str(expr).replace(" ", "")


def expr_of(arg, info: dict) -> Any:
    """The size an op argument stands for: an int, or the sympy expression of a SymInt node."""
    if isinstance(arg, torch.fx.Node):
        m = info.get(arg)
        if m is None or getattr(m, "expr", None) is None:
            raise TypeError(f"{arg} is not a size")
        return m.expr
    if isinstance(arg, bool) or not isinstance(arg, int):
        raise TypeError(f"{arg!r} is not a size")
    return arg


def tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def fill_initializer(proto: TensorProto, name: str, t: torch.Tensor) -> None:
    proto.name = name
    proto.data_type = ONNX_DTYPE[t.dtype]
    proto.dims.extend(t.shape)
    proto.raw_data = tensor_bytes(t)


# --- which nodes translate -------------------------------------------------------------------


def _metas(node, info) -> list:
    m = info.get(node)
    if m is None:
        return []
    return list(m) if isinstance(m, (list, tuple)) else [m]


def support(node, info: dict) -> Optional[str]:
    """None when `node` translates; else why not. `info` maps nodes to their Meta (a list for
    nodes with several outputs)."""
    if node.op != "call_function":
        return "not an op"
    if node.target is operator.getitem:
        producer = node.args[0]
        return None if producer.op == "call_function" and support(producer, info) is None else "getitem of an op not run"
    entry = _TABLE.get(node.target)
    if entry is None:
        return f"no translation of {node.target}"
    for arg in node.all_input_nodes:
        for m in _metas(arg, info):
            if m.dtype not in ONNX_DTYPE:
                return f"operand dtype {m.dtype}"
    outs = _metas(node, info)
    if not outs:
        return "produces no tensor"
    for m in outs:
        if m.dtype not in ONNX_DTYPE:
            return f"result dtype {m.dtype}"
    check = entry[1]
    return check(node, info) if check else None


# --- the builder -----------------------------------------------------------------------------


class Builder:
    """Writes one partition as an ONNX graph. `value(arg)` is the ONNX name of an FX node's
    output (or a new constant for a Python scalar)."""

    def __init__(self, info: dict):
        self.info = info
        # Initializers are written straight into the model's graph: a weight's bytes are copied
        # once, from the tensor into the message (make_graph / make_model would copy them again).
        self.model = onnx.ModelProto()
        self.graph = self.model.graph
        self.names: dict = {}  # fx node -> ONNX name (or list of names for several outputs)
        self._constants: dict = {}  # see initializer()
        self._count = 0
        # Symbolic sizes: sympy Symbol -> a thunk writing the nodes that read it from an input's
        # shape (bind_dims); the ONNX name (a 1-D int64 of one element) of each expression made.
        self._sources: dict = {}
        self._sizes: dict = {}
        self._shapes: dict = {}  # input name -> its Shape node's output
        # An input with at least one element (its values read by _arange), and its dtype.
        self.data: Optional[str] = None
        self.data_dtype: Optional[torch.dtype] = None

    # --- symbolic sizes ---

    def bind_dims(self, name: str, dims) -> None:
        """Registers the input `name`, of these dims, as the source of the symbols in them: a dim
        that is a bare symbol gives it; s + c gives s as the dim less c."""
        for d, e in enumerate(dims):
            if isinstance(e, int):
                continue
            free = list(e.free_symbols)
            if len(free) != 1 or free[0] in self._sources:
                continue
            s = free[0]
            rest = sympy.expand(e - s)
            if rest.free_symbols:
                continue
            self._sources[s] = (lambda name=name, d=d, c=int(rest): self._dim_less(name, d, c))

    def bind_size(self, name: str, d: int, expr) -> None:
        """The input `name`'s dim d is the size `expr` (of any form)."""
        if expr not in self._sizes:
            self._sizes[expr] = self._dim_less(name, d, 0)

    def _dim_less(self, name: str, d: int, c: int) -> str:
        if name not in self._shapes:
            self._shapes[name] = self.add("Shape", [name])
        dim = self.add("Gather", [self._shapes[name], self.ints([d])], axis=0)
        return dim if c == 0 else self.add("Sub", [dim, self.ints([c])])

    def knows(self, expr) -> bool:
        return isinstance(expr, int) or expr in self._sizes or all(s in self._sources for s in expr.free_symbols)

    def size1(self, expr) -> str:
        """A 1-D int64 of one element holding the size `expr` (an int or a sympy expression)."""
        if isinstance(expr, int) or (isinstance(expr, sympy.Expr) and expr.is_Integer):
            return self.ints([int(expr)])
        if expr in self._sizes:
            return self._sizes[expr]
        if isinstance(expr, sympy.Symbol):
            if expr not in self._sources:
                raise ValueError(f"the size {expr} is read from none of the partition's inputs")
            out = self._sources[expr]()
        elif isinstance(expr, (sympy.Add, sympy.Mul, symfn.Max, symfn.Min)):
            op = {sympy.Add: "Add", sympy.Mul: "Mul", symfn.Max: "Max", symfn.Min: "Min"}[type(expr)]
            parts = [self.size1(a) for a in expr.args]
            out = parts[0]
            for p in parts[1:]:
                out = self.add(op, [out, p])
        elif isinstance(expr, (symfn.FloorDiv, symfn.CleanDiv)):
            # sizes are not negative, where ONNX's integer Div (truncating) is a floor division
            out = self.add("Div", [self.size1(expr.args[0]), self.size1(expr.args[1])])
        elif isinstance(expr, (symfn.PythonMod, symfn.Mod)):
            out = self.add("Mod", [self.size1(expr.args[0]), self.size1(expr.args[1])], fmod=0)
        else:
            raise ValueError(f"cannot compute the size {expr} in ONNX")
        self._sizes[expr] = out
        return out

    def size0(self, expr) -> str:
        """The size `expr` as a 0-D int64."""
        if isinstance(expr, int) or (isinstance(expr, sympy.Expr) and expr.is_Integer):
            return self.const(int(expr), torch.int64)
        return self.add("Squeeze", [self.size1(expr), self.ints([0])])

    def shape_value(self, dims, source=None, expand: bool = False) -> str:
        """A shape operand for `dims`. Static: a constant. Else, with `source` (the operand's
        dims): a dim equal to the source's at its position is 0 for Reshape (copy) or 1 for
        Expand (keep), aligned from the left or the right as each op does; a single dim left
        symbolic in a Reshape is -1. What remains symbolic is computed from the inputs' shapes."""
        dims = list(dims)
        if is_static(dims):
            return self.ints(dims)
        out = list(dims)
        if source is not None and not any(d == 0 for d in dims if isinstance(d, int)):
            src = list(source)
            offset = len(dims) - len(src) if expand else 0
            for i, d in enumerate(dims):
                j = i - offset
                if not isinstance(d, int) and 0 <= j < len(src) and src[j] == d:
                    out[i] = 1 if expand else 0
        left = [i for i, d in enumerate(out) if not isinstance(d, int)]
        if not expand and len(left) == 1 and not any(d == -1 for d in out):
            out[left[0]] = -1
        if is_static(out):
            return self.ints(out)
        parts, run = [], []
        for d in out:
            if isinstance(d, int):
                run.append(d)
                continue
            if run:
                parts.append(self.ints(run))
                run = []
            parts.append(self.size1(d))
        if run:
            parts.append(self.ints(run))
        return self.add("Concat", parts, axis=0)

    def fresh(self, hint: str = "v") -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def meta(self, node) -> Meta:
        m = self.info[node]
        return m[0] if isinstance(m, (list, tuple)) else m

    def add(self, op: str, inputs: list, n_out: int = 1, **attrs) -> Any:
        outs = [self.fresh(op.lower()) for _ in range(n_out)]
        self.graph.node.append(helper.make_node(op, inputs, outs, name=self.fresh("n_" + op), **attrs))
        return outs[0] if n_out == 1 else outs

    def initializer(self, t: torch.Tensor, hint: str = "c") -> str:
        """An initializer holding t. Equal constants share one (tracing gives each use of a
        buffer its own copy; graphfuse's patterns ask, for instance, that Q and K be roped by the
        same tables): same storage, or for small ones the same bytes."""
        t = t.detach()
        keys = [("ptr", t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), t.untyped_storage().data_ptr())]
        if t.numel() * t.element_size() <= _DEDUPE_BYTES:
            keys.append(("bytes", t.dtype, tuple(t.shape), tensor_bytes(t)))
        for key in keys:
            if key in self._constants:
                return self._constants[key][0]
        name = self.fresh(hint)
        fill_initializer(self.graph.initializer.add(), name, t)
        for key in keys:
            self._constants[key] = (name, t)  # t held, so that its storage is not reused meanwhile
        return name

    def const(self, value, dtype: torch.dtype) -> str:
        return self.initializer(torch.as_tensor(value, dtype=dtype))

    def ints(self, values) -> str:
        return self.const(list(values), torch.int64)

    def cast(self, name: str, have: torch.dtype, want: torch.dtype) -> str:
        if have == want:
            return name
        return self.add("Cast", [name], to=ONNX_DTYPE[want])

    def value(self, arg, dtype: Optional[torch.dtype] = None) -> str:
        """The ONNX name of `arg` (an FX node or a Python number), as `dtype` when given."""
        if isinstance(arg, torch.fx.Node):
            name = self.names[arg]
            return self.cast(name, self.meta(arg).dtype, dtype) if dtype is not None else name
        if isinstance(arg, (bool, int, float)):
            return self.const(arg, dtype if dtype is not None else _python_dtype(arg))
        raise TypeError(f"cannot translate operand {arg!r}")

    def translate(self, node) -> None:
        if node.target is operator.getitem:
            self.names[node] = self.names[node.args[0]][node.args[1]]
            return
        self.names[node] = _TABLE[node.target][0](self, node)


def _python_dtype(v) -> torch.dtype:
    if isinstance(v, bool):
        return torch.bool
    if isinstance(v, int):
        return torch.int64
    return torch.float32


def _dtype_of(arg, info) -> Any:
    """A probe for torch.result_type: an empty tensor of the node's rank and dtype, or the
    Python number itself."""
    if isinstance(arg, torch.fx.Node):
        m = info[arg]
        m = m[0] if isinstance(m, (list, tuple)) else m
        return torch.empty([0] * len(m.shape), dtype=m.dtype) if m.shape else torch.empty((), dtype=m.dtype)
    return arg


def _compute_dtype(node, info, *args) -> torch.dtype:
    probes = [_dtype_of(a, info) for a in args]
    if len(probes) == 1:
        p = probes[0]
        return p.dtype if isinstance(p, torch.Tensor) else _python_dtype(p)
    return torch.result_type(*probes) if isinstance(probes[0], torch.Tensor) else torch.result_type(probes[1], probes[0])


def _norm_dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


# --- translators -----------------------------------------------------------------------------
# Each takes (builder, node) and returns the ONNX name (a list for several outputs).


def _unary(op: str) -> Callable:
    def t(b: Builder, n):
        dt = b.meta(n).dtype
        return b.add(op, [b.value(n.args[0], dt)])

    return t


def _binary(op: str) -> Callable:
    def t(b: Builder, n):
        dt = b.meta(n).dtype
        return b.add(op, [b.value(n.args[0], dt), b.value(n.args[1], dt)])

    return t


def _add_sub(op: str, swap: bool = False) -> Callable:
    """add/sub(x, y, alpha): x op alpha * y; rsub (swap) is y - alpha * x."""

    def t(b: Builder, n):
        dt = b.meta(n).dtype
        x, y = b.value(n.args[0], dt), b.value(n.args[1], dt)
        if swap:
            x, y = y, x
        alpha = n.kwargs.get("alpha", 1)
        if alpha != 1:
            y = b.add("Mul", [y, b.const(alpha, dt)])
        return b.add(op, [x, y])

    return t


def _div(b: Builder, n):
    dt = b.meta(n).dtype
    q = b.add("Div", [b.value(n.args[0], dt), b.value(n.args[1], dt)])
    mode = n.kwargs.get("rounding_mode")
    if mode == "floor":
        return b.add("Floor", [q])
    if mode == "trunc":
        return b.add("Mul", [b.add("Floor", [b.add("Abs", [q])]), b.add("Sign", [q])])
    return q


def _remainder(b: Builder, n):
    """Python's remainder (the divisor's sign): Mod for integers; x - floor(x / y) * y for floats,
    whose ONNX Mod is fmod only."""
    dt = b.meta(n).dtype
    x, y = b.value(n.args[0], dt), b.value(n.args[1], dt)
    if dt not in _FLOATS:
        return b.add("Mod", [x, y], fmod=0)
    return b.add("Sub", [x, b.add("Mul", [b.add("Floor", [b.add("Div", [x, y])]), y])])


def _fmod(b: Builder, n):
    dt = b.meta(n).dtype
    return b.add("Mod", [b.value(n.args[0], dt), b.value(n.args[1], dt)], fmod=1)


def _div_check(n, info):
    mode = n.kwargs.get("rounding_mode")
    if mode is not None and info[n].dtype not in _FLOATS:
        return f"integer division with rounding_mode={mode}"
    return None


def _compare(op: str, negate: bool = False) -> Callable:
    def t(b: Builder, n):
        dt = _compute_dtype(n, b.info, n.args[0], n.args[1])
        out = b.add(op, [b.value(n.args[0], dt), b.value(n.args[1], dt)])
        return b.add("Not", [out]) if negate else out

    return t


def _logical(op: str) -> Callable:
    def t(b: Builder, n):
        return b.add(op, [b.value(a, torch.bool) for a in n.args[:2]])

    return t


def _bool_only(n, info):
    for a in n.args[:2]:
        if isinstance(a, torch.fx.Node) and info[a].dtype != torch.bool:
            return "bitwise op on integers"
    return None


def _not(b: Builder, n):
    return b.add("Not", [b.value(n.args[0], torch.bool)])


def _rsqrt(b: Builder, n):
    dt = b.meta(n).dtype
    return b.add("Div", [b.const(1.0, dt), b.add("Sqrt", [b.value(n.args[0], dt)])])


def _silu(b: Builder, n):
    dt = b.meta(n).dtype
    x = b.value(n.args[0], dt)
    return b.add("Mul", [x, b.add("Sigmoid", [x])])


def _gelu(b: Builder, n):
    dt = b.meta(n).dtype
    approximate = n.kwargs.get("approximate", n.args[1] if len(n.args) > 1 else "none")
    return b.add("Gelu", [b.value(n.args[0], dt)], approximate=approximate)


def _pow(b: Builder, n):
    dt = b.meta(n).dtype
    return b.add("Pow", [b.value(n.args[0], dt), b.value(n.args[1], dt)])


def _clamp(b: Builder, n):
    dt = b.meta(n).dtype
    lo = n.args[1] if len(n.args) > 1 else n.kwargs.get("min")
    hi = n.args[2] if len(n.args) > 2 else n.kwargs.get("max")
    x = b.value(n.args[0], dt)
    if lo is not None:
        x = b.add("Max", [x, b.value(lo, dt)])
    if hi is not None:
        x = b.add("Min", [x, b.value(hi, dt)])
    return x


def _where(b: Builder, n):
    dt = b.meta(n).dtype
    return b.add("Where", [b.value(n.args[0], torch.bool), b.value(n.args[1], dt), b.value(n.args[2], dt)])


def _masked_fill(b: Builder, n):
    dt = b.meta(n).dtype
    return b.add("Where", [b.value(n.args[1], torch.bool), b.value(n.args[2], dt), b.value(n.args[0], dt)])


def _cast(b: Builder, n):
    return b.value(n.args[0], b.meta(n).dtype) if b.meta(n.args[0]).dtype != b.meta(n).dtype else b.add(
        "Identity", [b.value(n.args[0])]
    )


def _identity(b: Builder, n):
    return b.add("Identity", [b.value(n.args[0])])


def _reshape(b: Builder, n):
    """Every view that keeps the elements in order (view, reshape, unsqueeze, squeeze, flatten):
    the shape it produced, which tracing made concrete (or symbolic: see shape_value)."""
    return b.add("Reshape", [b.value(n.args[0]), b.shape_value(b.meta(n).shape, b.meta(n.args[0]).shape)])


def _expand(b: Builder, n):
    return b.add("Expand", [b.value(n.args[0]), b.shape_value(b.meta(n).shape, b.meta(n.args[0]).shape, expand=True)])


def _permute(b: Builder, n):
    rank = len(b.meta(n).shape)
    return b.add("Transpose", [b.value(n.args[0])], perm=[_norm_dim(d, rank) for d in n.args[1]])


def _transpose(b: Builder, n):
    rank = len(b.meta(n).shape)
    perm = list(range(rank))
    if rank >= 2:
        d0 = _norm_dim(n.args[1] if len(n.args) > 1 else 0, rank)
        d1 = _norm_dim(n.args[2] if len(n.args) > 2 else 1, rank)
        perm[d0], perm[d1] = perm[d1], perm[d0]
    if perm == list(range(rank)):
        return b.add("Identity", [b.value(n.args[0])])
    return b.add("Transpose", [b.value(n.args[0])], perm=perm)


def _slice(b: Builder, n):
    shape = b.meta(n.args[0]).shape
    rank = len(shape)
    dim = _norm_dim(n.args[1] if len(n.args) > 1 else 0, rank)
    start = n.args[2] if len(n.args) > 2 else None
    end = n.args[3] if len(n.args) > 3 else None
    step = n.args[4] if len(n.args) > 4 else 1
    size = shape[dim]
    start = 0 if start is None else start
    if not (isinstance(size, int) and isinstance(start, int) and (end is None or isinstance(end, int))):
        # A symbolic size or bound: ONNX's Slice counts negative bounds from the end and clamps
        # them to the dim as PyTorch does (step > 0).
        starts = b.size1(expr_of(start, b.info))
        ends = b.ints([2**62]) if end is None else b.size1(expr_of(end, b.info))
        return b.add("Slice", [b.value(n.args[0]), starts, ends, b.ints([dim]), b.ints([step])])
    end = size if end is None else end
    start = max(0, min(size, start + size if start < 0 else start))
    end = max(0, min(size, end + size if end < 0 else end))
    return b.add("Slice", [b.value(n.args[0]), b.ints([start]), b.ints([end]), b.ints([dim]), b.ints([step])])


def _select(b: Builder, n):
    rank = len(b.meta(n.args[0]).shape)
    dim = _norm_dim(n.args[1], rank)
    index = n.args[2]
    if not isinstance(index, int) or (index < 0 and not isinstance(b.meta(n.args[0]).shape[dim], int)):
        e = expr_of(index, b.info)
        e = e + b.meta(n.args[0]).shape[dim] if isinstance(e, int) and e < 0 else e
        return b.add("Gather", [b.value(n.args[0]), b.size0(e)], axis=dim)
    index = index + b.meta(n.args[0]).shape[dim] if index < 0 else index
    return b.add("Gather", [b.value(n.args[0]), b.const(index, torch.int64)], axis=dim)


def _cat(b: Builder, n):
    dt = b.meta(n).dtype
    rank = len(b.meta(n).shape)
    dim = _norm_dim(n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0), rank)
    parts = [a for a in n.args[0] if not (b.meta(a).shape == (0,) and rank != 1)]
    return b.add("Concat", [b.value(a, dt) for a in parts], axis=dim)


def _split(b: Builder, n):
    outs = b.info[n]
    rank = len(outs[0].shape)
    dim = _norm_dim(n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0), rank)
    sizes = [m.shape[dim] for m in outs]
    return b.add("Split", [b.value(n.args[0]), b.shape_value(sizes) if not is_static(sizes) else b.ints(sizes)],
                 n_out=len(outs), axis=dim)


def _embedding(b: Builder, n):
    return b.add("Gather", [b.value(n.args[0]), b.value(n.args[1], torch.int64)], axis=0)


def _index_check(n, info):
    indices = n.args[1]
    present = [k for k, i in enumerate(indices) if i is not None]
    if len(present) != 1 and present != list(range(len(present))):
        return "indexing by several tensors, not the leading dims"
    if any(info[indices[k]].dtype == torch.bool for k in present):
        return "indexing by a boolean mask"
    return None


def _index(b: Builder, n):
    """x[i] along one dim: Gather. x[i0, i1, ...] over the leading dims (transformers' padding
    mask read as mask[batch_idx, kv_idx]): one Gather from x's leading dims flattened, at
    (i0 * d1 + i1) * d2 + ..., which broadcasts as the indices do. (Not GatherND over the
    indices expanded: a batch index expanded to [batch, kv length] would fold into a constant
    of the length, which no shape-class template can move.)"""
    indices = n.args[1]
    present = [k for k, i in enumerate(indices) if i is not None]
    if len(present) == 1:
        k = present[0]
        return b.add("Gather", [b.value(n.args[0]), b.value(indices[k], torch.int64)], axis=k)
    x = b.meta(n.args[0]).shape
    flat = None
    for j, i in enumerate(indices):
        d = b.size0(x[j])
        v = b.value(i, torch.int64)
        v = b.add("Where", [b.add("Less", [v, b.const(0, torch.int64)]), b.add("Add", [v, d]), v])  # PyTorch's -1
        flat = v if flat is None else b.add("Add", [b.add("Mul", [flat, d]), v])
    lead = 1
    for d in x[: len(indices)]:
        lead = lead * d
    rows = b.add("Reshape", [b.value(n.args[0]), b.shape_value([lead] + list(x[len(indices):]))])
    return b.add("Gather", [rows, flat], axis=0)


def _gather(b: Builder, n):
    rank = len(b.meta(n.args[0]).shape)
    return b.add("GatherElements", [b.value(n.args[0]), b.value(n.args[2], torch.int64)], axis=_norm_dim(n.args[1], rank))


def _index_copy(b: Builder, n):
    """index_copy(x, dim, index, source): x with its slices index[i] along dim replaced by
    source's slices i -- the write of new rows into a static KV cache, once functionalized.
    ScatterND writes whole slices of its first axis, so dim goes first and back."""
    x, dim, index, source = n.args[:4]
    rank = len(b.meta(x).shape)
    dim = _norm_dim(dim, rank)
    dt = b.meta(n).dtype
    xv, sv = b.value(x, dt), b.value(source, dt)
    perm = [dim] + [i for i in range(rank) if i != dim]
    if dim != 0:
        xv = b.add("Transpose", [xv], perm=perm)
        sv = b.add("Transpose", [sv], perm=perm)
    idx = b.add("Unsqueeze", [b.value(index, torch.int64), b.ints([1])])
    out = b.add("ScatterND", [xv, idx, sv])
    if dim != 0:
        out = b.add("Transpose", [out], perm=[perm.index(i) for i in range(rank)])
    return out


def _index_copy_check(n, info):
    index = n.args[2]
    if not isinstance(index, torch.fx.Node) or len(info[index].shape) != 1:
        return "index_copy with an index that is not a 1-D tensor"
    return None


def _f32_gemm(n, info):
    """graphfuse's CPU GEMM is f32 (bf16 and f16 GEMMs are planned); others stay in PyTorch."""
    m = info[n]
    m = m[0] if isinstance(m, list) else m
    return None if m.dtype == torch.float32 else f"a {str(m.dtype).replace('torch.', '')} GEMM (graphfuse's CPU GEMM is f32)"


def _matmul(b: Builder, n):
    dt = b.meta(n).dtype
    return b.add("MatMul", [b.value(n.args[0], dt), b.value(n.args[1], dt)])


def _scaled_product_plus_input(b: Builder, n):
    """beta * input + alpha * (args[1] @ args[2]): addmm, and baddbmm (BLOOM's ALiBi scores); the
    input is ignored when beta is 0, as PyTorch ignores it, NaN and inf included."""
    dt = b.meta(n).dtype
    beta = n.kwargs.get("beta", 1)
    alpha = n.kwargs.get("alpha", 1)
    prod = b.add("MatMul", [b.value(n.args[1], dt), b.value(n.args[2], dt)])
    if alpha != 1:
        prod = b.add("Mul", [prod, b.const(alpha, dt)])
    if beta == 0:
        return prod
    bias = b.value(n.args[0], dt)
    if beta != 1:
        bias = b.add("Mul", [bias, b.const(beta, dt)])
    return b.add("Add", [prod, bias])


def _stack(b: Builder, n):
    dt = b.meta(n).dtype
    rank = len(b.meta(n).shape)
    dim = _norm_dim(n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0), rank)
    parts = [b.add("Unsqueeze", [b.value(a, dt), b.ints([dim])]) for a in n.args[0]]
    return b.add("Concat", parts, axis=dim)


def _cumsum(b: Builder, n):
    dt = b.meta(n).dtype
    rank = len(b.meta(n).shape)
    dim = _norm_dim(n.args[1], rank) if rank else 0
    return b.add("CumSum", [b.value(n.args[0], dt), b.const(dim, torch.int64)])


def _layer_norm(b: Builder, n):
    x, normalized_shape, weight, bias, eps = n.args[:5]
    m = b.meta(x)
    axis = len(m.shape) - len(normalized_shape)
    w = b.value(weight, m.dtype) if weight is not None else b.const(torch.ones(list(normalized_shape)), m.dtype)
    inputs = [b.value(x), w]
    if bias is not None:
        inputs.append(b.value(bias, m.dtype))
    # Mean and InvStdDev only when read: the norm fusions take a LayerNormalization of one output.
    used = {u.args[1] for u in n.users if u.target is operator.getitem}
    n_out = 1 + max(used, default=0)
    outs = b.add("LayerNormalization", inputs, n_out=n_out, axis=axis, epsilon=float(eps))
    outs = [outs] if n_out == 1 else outs
    return outs + [None] * (3 - n_out)


def _reduce(op: str) -> Callable:
    def t(b: Builder, n):
        x = n.args[0]
        rank = len(b.meta(x).shape)
        dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
        keepdim = n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False)
        dt = b.meta(n).dtype
        inputs = [b.value(x, dt)]
        if dims is not None and len(dims) > 0:
            dims = [dims] if isinstance(dims, int) else dims
            inputs.append(b.ints([_norm_dim(d, rank) for d in dims]))
        return b.add(op, inputs, keepdims=int(bool(keepdim)))

    return t


def _softmax(op: str) -> Callable:
    def t(b: Builder, n):
        dt = b.meta(n).dtype
        rank = len(b.meta(n).shape)
        return b.add(op, [b.value(n.args[0], dt)], axis=_norm_dim(n.args[1], rank))

    return t


def _sdpa_args(n):
    """(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa) of any SDPA overload."""
    names = ["query", "key", "value"]
    q, k, v = (n.args[i] if len(n.args) > i else n.kwargs[names[i]] for i in range(3))
    if n.target in (aten.scaled_dot_product_attention.default,):
        mask = n.args[3] if len(n.args) > 3 else n.kwargs.get("attn_mask")
        dropout = n.args[4] if len(n.args) > 4 else n.kwargs.get("dropout_p", 0.0)
        causal = n.args[5] if len(n.args) > 5 else n.kwargs.get("is_causal", False)
        scale = n.kwargs.get("scale")
        gqa = n.kwargs.get("enable_gqa", False)
    else:  # _scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, *, attn_mask, scale)
        dropout = n.args[3] if len(n.args) > 3 else n.kwargs.get("dropout_p", 0.0)
        causal = n.args[4] if len(n.args) > 4 else n.kwargs.get("is_causal", False)
        mask = n.kwargs.get("attn_mask")
        scale = n.kwargs.get("scale")
        gqa = True
    return q, k, v, mask, dropout, causal, scale, gqa


def _sdpa_check(n, info):
    q, k, v, mask, dropout, causal, scale, gqa = _sdpa_args(n)
    if dropout:
        return f"attention with dropout_p={dropout}"
    if len(info[q].shape) < 3:
        return "attention on fewer than 3 dims"
    return _f32_gemm(n, info)


def _sdpa(b: Builder, n):
    """Attention as torch.onnx.export writes it: MatMul(q, kᵀ) * scale + mask -> Softmax (with
    the exporters' Where(IsNaN(p), 0, p) guard under a mask) -> MatMul(·, v); grouped-query K
    and V repeated as transformers' repeat_kv does (Unsqueeze, Expand, Reshape), which
    graphfuse's attention fusion folds back into kv_heads."""
    q, k, v, mask, _, causal, scale, _ = _sdpa_args(n)
    qm, km, vm = b.meta(q), b.meta(k), b.meta(v)
    dt = qm.dtype
    L, S, d = qm.shape[-2], km.shape[-2], qm.shape[-1]
    kq, vq = b.value(k), b.value(v)
    if len(qm.shape) == 4 and km.shape[1] != qm.shape[1]:
        rep = qm.shape[1] // km.shape[1]

        def repeat(x, shape):
            bsz, kvh, s, dd = shape
            u = b.add("Unsqueeze", [x, b.ints([2])])
            e = b.add("Expand", [u, b.shape_value([bsz, kvh, rep, s, dd], [bsz, kvh, 1, s, dd], expand=True)])
            return b.add("Reshape", [e, b.shape_value([bsz, kvh * rep, s, dd], [bsz, kvh, rep, s, dd])])

        kq, vq = repeat(kq, km.shape), repeat(vq, vm.shape)
    rank = len(km.shape)
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    scores = b.add("MatMul", [b.value(q), b.add("Transpose", [kq], perm=perm)])
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    scores = b.add("Mul", [scores, b.const(scale, dt)])
    if causal and not (isinstance(L, int) and isinstance(S, int)):
        # key j is seen by query i when j <= i (PyTorch's is_causal: the top-left triangle)
        rows = b.add("Unsqueeze", [b.add("Range", [b.const(0, torch.int64), b.size0(L), b.const(1, torch.int64)]),
                                   b.ints([1])])
        cols = b.add("Range", [b.const(0, torch.int64), b.size0(S), b.const(1, torch.int64)])
        allowed = b.add("LessOrEqual", [cols, rows])
        bias = b.add("Where", [allowed, b.const(0.0, dt), b.const(float("-inf"), dt)])
        scores = b.add("Add", [scores, bias])
    elif causal:
        allowed = torch.ones(L, S, dtype=torch.bool).tril()
        bias = torch.zeros(L, S, dtype=dt).masked_fill(~allowed, float("-inf"))
        scores = b.add("Add", [scores, b.const(bias, dt)])
    if mask is not None:
        if b.meta(mask).dtype == torch.bool:
            additive = b.add("Where", [b.value(mask), b.const(0.0, dt), b.const(float("-inf"), dt)])
        else:
            additive = b.value(mask, dt)
        scores = b.add("Add", [scores, additive])
    probs = b.add("Softmax", [scores], axis=-1)
    if mask is not None:
        # A query row whose keys are all masked (left padding under a causal mask) is a softmax
        # over -inf alone, NaN; PyTorch's SDPA gives 0 there, and so does this guard, as the
        # ONNX exporters write it. graphfuse's attention fusion absorbs it (zero_nan_rows).
        probs = b.add("Where", [b.add("IsNaN", [probs]), b.const(0.0, dt), probs])
    out = b.add("MatMul", [probs, vq])
    if n.target == aten.scaled_dot_product_attention.default:
        return out
    return [out, None]  # the logsumexp output is never translated (see _sdpa_outputs_check)


def _sdpa_flash_check(n, info):
    reason = _sdpa_check(n, info)
    if reason:
        return reason
    for user in n.users:
        if user.target is not operator.getitem or user.args[1] != 0:
            return "attention's logsumexp is used"
    return None


def _number(b: Builder, arg, dtype: torch.dtype) -> str:
    """A 0-D operand of `dtype`: a Python number, a size (SymInt node), or a tensor node."""
    if isinstance(arg, torch.fx.Node):
        return b.value(arg, dtype)
    return b.const(arg, dtype)


def _arange(b: Builder, n):
    """arange(end), arange(start, end[, step]): ONNX Range over the (possibly symbolic) bounds,
    in int64 or the float dtype asked for."""
    args = list(n.args)
    if n.target == aten.arange.default:
        args = [0, args[0], 1]
    elif n.target == aten.arange.start:
        args = [args[0], args[1], 1]
    else:
        args = args[:3] + [1] * (3 - len(args[:3]))
    dt = b.meta(n).dtype
    work = torch.int64 if dt not in _FLOATS else torch.float32
    length = b.meta(n).shape[0]
    if not isinstance(length, int) and args[2] == 1 and b.data is not None and all(
            not isinstance(a, float) for a in args[:2]):
        # A symbolic length: start + CumSum(ones) - 1, the ones expanded from a 1 read from an
        # input's values. A Range is folded into a constant of the call's length, which a
        # shape-class template cannot move (its elements differ per length), and every later
        # length would be planned from the model; this form stays computed (a few adds).
        first = b.add("Slice", [b.add("Reshape", [b.data, b.ints([-1])]), b.ints([0]), b.ints([1]), b.ints([0])])
        first = b.cast(first, b.data_dtype, torch.int64)
        one = b.cast(b.add("Equal", [first, first]), torch.bool, torch.int64)
        count = b.add("CumSum", [b.add("Expand", [one, b.size1(length)]), b.const(0, torch.int64)])
        start = args[0]
        out = b.add("Add", [count, b.add("Sub", [_number(b, start, torch.int64), b.const(1, torch.int64)])])
        return b.cast(out, torch.int64, dt)
    out = b.add("Range", [_number(b, a, work) for a in args])
    return b.cast(out, work, dt)


def _arange_check(n, info):
    dt = info[n].dtype
    if dt not in _FLOATS and dt != torch.int64 and dt != torch.int32:
        return f"arange of {dt}"
    return None


def _fill(value_arg: Optional[int], default=None) -> Callable:
    """full / zeros / ones / new_* / *_like: the fill value expanded to the result's shape."""

    def t(b: Builder, n):
        m = b.meta(n)
        if value_arg is None:
            value = default
        else:
            value = n.args[value_arg] if len(n.args) > value_arg else n.kwargs["fill_value"]
        scalar = _number(b, value, m.dtype)
        return b.add("Expand", [scalar, b.shape_value(m.shape, expand=True)])  # Expand takes no -1

    return t


def _scalar_tensor(b: Builder, n):
    return _number(b, n.args[0], b.meta(n).dtype)


# target -> (translator, check or None)
_TABLE: dict = {}


def _register(targets, fn, check=None):
    for t in targets:
        _TABLE[t] = (fn, check)


def _overloads(*packets):
    out = []
    for p in packets:
        out.extend(getattr(p, o) for o in p.overloads())
    return out


_register(_overloads(aten.add), _add_sub("Add"))
_register(_overloads(aten.sub), _add_sub("Sub"))
_register(_overloads(aten.rsub), _add_sub("Sub", swap=True))
_register(_overloads(aten.mul), _binary("Mul"))
_register([aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode], _div, _div_check)
_register([aten.remainder.Tensor, aten.remainder.Scalar], _remainder)
_register([aten.fmod.Tensor, aten.fmod.Scalar], _fmod)
_register([aten.maximum.default], _binary("Max"))
_register([aten.minimum.default], _binary("Min"))
_register([aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor], _pow)
for _name, _op in [
    ("neg", "Neg"), ("abs", "Abs"), ("exp", "Exp"), ("log", "Log"), ("sqrt", "Sqrt"),
    ("reciprocal", "Reciprocal"), ("sigmoid", "Sigmoid"), ("tanh", "Tanh"), ("relu", "Relu"),
    ("erf", "Erf"), ("sin", "Sin"), ("cos", "Cos"), ("floor", "Floor"), ("ceil", "Ceil"),
    ("sign", "Sign"),
]:
    _register([getattr(aten, _name).default], _unary(_op))
_register([aten.rsqrt.default], _rsqrt)
_register([aten.silu.default], _silu)
_register([aten.gelu.default], _gelu)
_register([aten.clamp.default, aten.clamp.Tensor], _clamp)
_register([aten.eq.Tensor, aten.eq.Scalar], _compare("Equal"))
_register([aten.ne.Tensor, aten.ne.Scalar], _compare("Equal", negate=True))
_register([aten.lt.Tensor, aten.lt.Scalar], _compare("Less"))
_register([aten.le.Tensor, aten.le.Scalar], _compare("LessOrEqual"))
_register([aten.gt.Tensor, aten.gt.Scalar], _compare("Greater"))
_register([aten.ge.Tensor, aten.ge.Scalar], _compare("GreaterOrEqual"))
_register([aten.bitwise_and.Tensor], _logical("And"), _bool_only)
_register([aten.bitwise_or.Tensor], _logical("Or"), _bool_only)
_register([aten.bitwise_xor.Tensor], _logical("Xor"), _bool_only)
_register([aten.bitwise_not.default], _not, lambda n, info: None if info[n.args[0]].dtype == torch.bool else "bitwise not on integers")
_register([aten.logical_and.default], _logical("And"))
_register([aten.logical_or.default], _logical("Or"))
_register([aten.logical_not.default], _not)
_register([aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar], _where)
_register([aten.masked_fill.Scalar, aten.masked_fill.Tensor], _masked_fill)
_register([aten._to_copy.default, aten.to.dtype], _cast)
_register([aten.clone.default, aten.alias.default, aten.alias_copy.default, aten.detach.default,
           aten.detach_copy.default, aten.lift_fresh_copy.default, aten.contiguous.default], _identity)
_register(
    [aten.view.default, aten._unsafe_view.default, aten.view_copy.default, aten.reshape.default,
     aten.unsqueeze.default, aten.unsqueeze_copy.default, aten.squeeze.dim, aten.squeeze.dims,
     aten.squeeze.default, aten.squeeze_copy.dim, aten.squeeze_copy.dims, aten.squeeze_copy.default,
     aten.flatten.using_ints],
    _reshape,
)
_register([aten.expand.default, aten.expand_copy.default], _expand)
_register([aten.permute.default, aten.permute_copy.default], _permute)
_register([aten.t.default, aten.t_copy.default, aten.transpose.int, aten.transpose_copy.int], _transpose)
_register([aten.slice.Tensor, aten.slice_copy.Tensor], _slice)
_register([aten.select.int, aten.select_copy.int], _select)
_register([aten.cat.default], _cat)
_register([aten.split.Tensor, aten.split_copy.Tensor, aten.split_with_sizes.default,
           aten.split_with_sizes_copy.default], _split)
_register([aten.embedding.default], _embedding)
_register([aten.arange.default, aten.arange.start, aten.arange.start_step], _arange, _arange_check)
_register([aten.full.default, aten.full_like.default], _fill(1))
_register([aten.new_full.default], _fill(2))
_register([aten.zeros.default, aten.new_zeros.default, aten.zeros_like.default], _fill(None, 0))
_register([aten.ones.default, aten.new_ones.default, aten.ones_like.default], _fill(None, 1))
_register([aten.scalar_tensor.default], _scalar_tensor)
_register([aten.index.Tensor], _index, _index_check)
_register([aten.gather.default], _gather)
_register([aten.index_copy.default], _index_copy, _index_copy_check)
_register([aten.mm.default, aten.bmm.default, aten.matmul.default], _matmul, _f32_gemm)
_register([aten.addmm.default, aten.baddbmm.default], _scaled_product_plus_input, _f32_gemm)
_register([aten.stack.default], _stack)
_register([aten.cumsum.default], _cumsum)
_register([aten.native_layer_norm.default], _layer_norm)
_register([aten.mean.dim, aten.mean.default], _reduce("ReduceMean"))
_register([aten.sum.dim_IntList, aten.sum.default], _reduce("ReduceSum"))
_register([aten.amax.default], _reduce("ReduceMax"))
_register([aten.amin.default], _reduce("ReduceMin"))
_register([aten._softmax.default, aten.softmax.int], _softmax("Softmax"))
_register([aten._log_softmax.default, aten.log_softmax.int], _softmax("LogSoftmax"))
_register([aten.scaled_dot_product_attention.default], _sdpa, _sdpa_check)
_register([aten._scaled_dot_product_flash_attention_for_cpu.default], _sdpa, _sdpa_flash_check)

# Ops that move no data worth a kernel: a partition of only these stays in PyTorch.
VIEW_OPS = sorted(
    torch.fx.node._get_qualified_name(t)
    for t, (fn, _) in _TABLE.items()
    if fn in (_reshape, _expand, _permute, _transpose, _slice, _select, _identity, _cast)
)

"""graphfuse from Python: ONNX models compiled with operator fusion, run like onnxruntime.

    import graphfuse as gf                      # in place of: import onnxruntime as ort
    sess = gf.InferenceSession("model.onnx")    # or the model's bytes; backend="cpu", threads=0
    [logits] = sess.run(None, {"input_ids": ids, "attention_mask": mask})
    sess.get_inputs()[0].shape                  # ['batch', 'seq'] for dynamic axes
    sess.explain()["groups"]                    # what fusion did in the latest plan

torch.compile(model, backend="graphfuse") runs PyTorch models through graphfuse: see
graphfuse.torch_backend.

Importing graphfuse changes no process-wide setting: its kernels (GEMMs included) run on the
session's own thread pool.

Errors raise graphfuse.Error subclasses carrying graphfuse's message: InvalidArgument (also a
ValueError), Unimplemented (NotImplementedError), ResourceExhausted (MemoryError), NotFound
(LookupError), Internal (RuntimeError).
"""

from __future__ import annotations

import enum
import os
import time
import warnings
from importlib import metadata as _metadata
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

import numpy as np

from . import _graphfuse
from ._graphfuse import Error, Internal, InvalidArgument, NotFound, ResourceExhausted, Unimplemented

try:
    __version__ = _metadata.version("graphfuse")
except _metadata.PackageNotFoundError:  # imported from a source tree, not an installed distribution
    __version__ = "0+unknown"

__all__ = [
    "__version__",
    "GraphOptimizationLevel",
    "RunOptions",
    "ExecutionMode",
    "ModelMetadata",
    "get_device",
    "get_all_providers",
    "get_build_info",
    "set_default_logger_severity",
    "set_default_logger_verbosity",
    "InferenceSession",
    "IOBinding",
    "OrtValue",
    "NodeArg",
    "SessionOptions",
    "get_available_providers",
    "get_available_backends",
    "set_progress",
    "Error",
    "InvalidArgument",
    "Unimplemented",
    "ResourceExhausted",
    "NotFound",
    "Internal",
]

# onnxruntime's execution providers and the graphfuse backend each one names.
_PROVIDER_BACKEND = {"CPUExecutionProvider": "cpu", "CUDAExecutionProvider": "cuda"}


def get_available_backends() -> list[str]:
    """The backends this build has: 'cpu', and 'cuda' when it was built with the CUDA toolkit."""
    return list(_graphfuse.target_names())


def set_progress(fn=None) -> None:
    """Calls fn(line: str) before each long step of compiling a session's plans: today each GEMM
    shape class timed for the first time on this machine (about a second each on large weights;
    the choices are then cached under ~/.cache/graphfuse/gemm). None, the default, keeps
    graphfuse silent. Process-wide; fn runs with the GIL held, from the thread that compiles;
    an exception it raises is reported as unraisable and compiling goes on.

        graphfuse.set_progress(print)
    """
    if fn is not None and not callable(fn):
        raise TypeError(f"set_progress takes a callable or None, not {type(fn).__name__}")
    _graphfuse.set_progress(fn)


def get_device() -> str:
    """As onnxruntime's: "GPU" when this build runs models on a CUDA device, else "CPU"."""
    return "GPU" if "cuda" in get_available_backends() else "CPU"


class GraphOptimizationLevel(enum.IntEnum):
    """onnxruntime's levels, as SessionOptions.graph_optimization_level reads them: ORT_DISABLE_ALL
    compiles the unfused baseline (every node its own kernel); every other level fuses (graphfuse
    has one set of passes, not levels of them)."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    """onnxruntime's, as SessionOptions.execution_mode reads it: accepted and changes nothing
    (a graphfuse plan runs its kernels in order, each on the session's thread pool)."""

    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


def get_all_providers() -> list[str]:
    """The onnxruntime provider names graphfuse knows (get_available_providers: those this build has)."""
    return list(_PROVIDER_BACKEND)


def get_build_info() -> str:
    """The version and the backends of this build."""
    return f"graphfuse {__version__}, backends: {', '.join(get_available_backends())}"


def set_default_logger_severity(severity: int) -> None:
    """Accepted as onnxruntime's; graphfuse reports through exceptions and warnings, not a logger."""
    int(severity)


def set_default_logger_verbosity(verbosity: int) -> None:
    """Accepted as onnxruntime's; see set_default_logger_severity."""
    int(verbosity)


class _ConfigEntries:
    """String key -> value entries, as onnxruntime's session and run config entries."""

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._config: dict[str, str] = {}

    def _add_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def _get_entry(self, key: str) -> str:
        if key not in self._config:
            raise KeyError(f"{self._kind} config entry {key!r} is not set")
        return self._config[key]


class RunOptions(_ConfigEntries):
    """onnxruntime's RunOptions, accepted by run(): terminate = True makes run() refuse to start
    (as onnxruntime's does); the logging fields (log_severity_level, log_verbosity_level, logid),
    only_execute_path_to_fetches and run config entries are kept and change nothing."""

    def __init__(self) -> None:
        super().__init__("run")
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.only_execute_path_to_fetches = False
        self.terminate = False

    def add_run_config_entry(self, key: str, value: str) -> None:
        self._add_entry(key, value)

    def get_run_config_entry(self, key: str) -> str:
        return self._get_entry(key)


def _check_run_options(run_options: Any) -> None:
    if run_options is not None and getattr(run_options, "terminate", False):
        raise Error("run() was not started: its RunOptions.terminate is set")


def get_available_providers() -> list[str]:
    """The onnxruntime provider names this build accepts, preferred first."""
    backends = set(get_available_backends())
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if _PROVIDER_BACKEND[p] in backends]


class NodeArg:
    """A model input or output: name, shape (ints; symbolic dims by name, None when unnamed) and
    type ("tensor(float)", "tensor(int64)", ... as onnxruntime writes them)."""

    __slots__ = ("name", "shape", "type")

    def __init__(self, name: str, shape: list, type: str):
        self.name = name
        self.shape = shape
        self.type = type

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


class ModelMetadata:
    """What the model says about itself, under onnxruntime's names: producer_name, graph_name,
    graph_description, domain, description (the model's doc string), version (model_version) and
    custom_metadata_map (metadata_props)."""

    __slots__ = ("producer_name", "producer_version", "graph_name", "graph_description", "domain", "description",
                 "version", "custom_metadata_map")

    def __init__(self, fields: Mapping[str, Any]):
        for name in self.__slots__:
            setattr(self, name, fields[name])

    def __repr__(self) -> str:
        return (f"ModelMetadata(producer_name={self.producer_name!r}, graph_name={self.graph_name!r}, "
                f"domain={self.domain!r}, version={self.version!r})")


class SessionOptions(_ConfigEntries):
    """The subset of onnxruntime.SessionOptions graphfuse reads: intra_op_num_threads (0: the
    hardware's threads), graph_optimization_level (GraphOptimizationLevel.ORT_DISABLE_ALL: no
    fusion), enable_profiling and profile_file_prefix (a Chrome-trace JSON file per session, see
    InferenceSession.end_profiling) and the session config entry
    "session.model_external_initializers_file_folder_path" (where a model given as bytes keeps its
    external data). The other fields onnxruntime has (inter_op_num_threads, execution_mode,
    log_severity_level, ...) may be set and change nothing; entries are kept."""

    def __init__(self) -> None:
        super().__init__("session")
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.enable_profiling = False
        self.profile_file_prefix = "graphfuse_profile"
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.optimized_model_filepath = ""
        self.enable_cpu_mem_arena = True
        self.enable_mem_pattern = True
        self.enable_mem_reuse = True

    def add_session_config_entry(self, key: str, value: str) -> None:
        self._add_entry(key, value)

    def get_session_config_entry(self, key: str) -> str:
        return self._get_entry(key)


def _provider_names(providers: Sequence[Any]) -> list[str]:
    """The provider names of onnxruntime's providers list (a name, or (name, options)), each one
    graphfuse knows (ValueError naming it otherwise)."""
    names = [p[0] if isinstance(p, (tuple, list)) else p for p in providers]
    for name in names:
        if name not in _PROVIDER_BACKEND:
            raise ValueError(f"unknown provider {name!r}; graphfuse takes {sorted(_PROVIDER_BACKEND)}")
    return names


def _backends_for(providers: Optional[Sequence[Any]], backend: Optional[str]) -> list[str]:
    """The backends to try, in order: `backend` alone, else the providers' (onnxruntime's names)
    that this build has, else the CPU."""
    if backend is not None:
        if providers:
            raise ValueError("give providers or backend, not both")
        return [backend]
    if not providers:
        return ["cpu"]
    available = set(get_available_backends())
    names = _provider_names(providers)
    chosen = [_PROVIDER_BACKEND[n] for n in names if _PROVIDER_BACKEND[n] in available]
    if not chosen:
        raise ValueError(f"none of the providers {names} is available in this build (it has {get_available_providers()})")
    return chosen


# numpy's dtype for each input type numpy has (lists and scalars are converted to it).
_NUMPY_DTYPE = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(bool)": np.bool_,
}


def _as_input(value: Any, arg: NodeArg) -> Any:
    """The input as the extension reads it in place: a C-contiguous, native-order numpy array, or
    a DLPack tensor in host memory (a torch tensor: f32, f16, bf16, int, bool). An array or tensor
    already so is passed as it is (no copy); one of another dtype is not converted (the error
    names the input). Lists and scalars become arrays of the input's dtype."""
    if not isinstance(value, np.ndarray) and hasattr(value, "__dlpack__"):
        device = value.__dlpack_device__()[0] if hasattr(value, "__dlpack_device__") else 1
        if device != 1:  # kDLCPU
            raise InvalidArgument(
                f"input {arg.name!r}: a tensor in device memory (DLPack device type {device}); "
                "graphfuse sessions read host memory"
            )
        if hasattr(value, "is_contiguous"):  # torch: DLPack export refuses tensors that need grad
            value = value.detach()
            if not value.is_contiguous():
                value = value.contiguous()
        return value
    if isinstance(value, np.ndarray):
        array = value
    else:
        array = np.asarray(value, dtype=_NUMPY_DTYPE.get(arg.type))
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return array


# numpy's dtype for each ONNX type name numpy has, and back.
_TYPE_OF_NUMPY = {np.dtype(v): k for k, v in _NUMPY_DTYPE.items()}


def _check_host(device_type: str, what: str) -> None:
    if str(device_type).lower() != "cpu":
        raise Unimplemented(
            f"{what}: device_type {device_type!r}; graphfuse binds host memory (a CUDA session copies "
            "bound host arrays to the device and back)"
        )


class OrtValue:
    """A tensor in host memory, as onnxruntime's OrtValue: it holds a numpy array (no copy), of
    any strides. ortvalue_from_numpy(cache[:, :, :n]) binds a view of a larger buffer; see
    IOBinding for a KV cache kept in place."""

    __slots__ = ("_array",)

    def __init__(self, array: np.ndarray):
        if not isinstance(array, np.ndarray):
            raise TypeError(f"OrtValue holds a numpy array, not {type(array).__name__}")
        self._array = array

    @staticmethod
    def ortvalue_from_numpy(numpy_obj: np.ndarray, device_type: str = "cpu", device_id: int = 0) -> "OrtValue":
        """The array itself (shared, not copied), as onnxruntime does for host memory."""
        _check_host(device_type, "OrtValue.ortvalue_from_numpy")
        return OrtValue(np.asarray(numpy_obj))

    @staticmethod
    def ortvalue_from_shape_and_type(
        shape: Sequence[int], element_type: Any = np.float32, device_type: str = "cpu", device_id: int = 0
    ) -> "OrtValue":
        """A new, uninitialized array of this shape and numpy type."""
        _check_host(device_type, "OrtValue.ortvalue_from_shape_and_type")
        return OrtValue(np.empty(tuple(shape), dtype=element_type))

    def numpy(self) -> np.ndarray:
        """The array (not a copy)."""
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def data_type(self) -> str:
        return _TYPE_OF_NUMPY.get(self._array.dtype, f"tensor({self._array.dtype})")

    def element_type(self) -> Any:
        return self._array.dtype.type

    def device_name(self) -> str:
        return "cpu"

    def data_ptr(self) -> int:
        return self._array.ctypes.data

    def is_tensor(self) -> bool:
        return True

    def has_value(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"OrtValue({self.data_type()}, shape={self.shape()})"


def _array_at(buffer_ptr: int, element_type: Any, shape: Sequence[int]) -> np.ndarray:
    """A numpy array over caller-owned host memory (onnxruntime's buffer_ptr binding)."""
    import ctypes

    dtype = np.dtype(element_type)
    count = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(int(buffer_ptr))
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(tuple(shape))


class IOBinding:
    """Inputs and outputs bound to arrays the caller owns, run with
    InferenceSession.run_with_iobinding, as onnxruntime's IOBinding (host memory).

    Outputs bound to an array (bind_ortvalue_output, or bind_output with a buffer_ptr) are
    written into it; outputs bound by name alone get a new array per run (get_outputs). Arrays
    may be strided numpy views. A KV cache kept in place: allocate each layer's cache with room
    for the whole generation, cache = np.empty((B, KV, capacity, d)); bind past.i.key to
    cache[:, :, :n] and present.i.key to cache[:, :, :n + 1]: where the plan takes them in place
    (explain()["in_place_outputs"]), a decode step writes only its new row instead of copying
    the n past rows into a new present. Other strided arrays are copied to and from contiguous
    buffers around the run."""

    def __init__(self, session: "InferenceSession"):
        self._session = session
        self._inputs: dict = {}
        self._outputs: dict = {}  # name -> bound array, or None: a new array per run
        self._results: dict = {}

    def _input(self, name: str):
        index = {a.name: a for a in self._session._inputs}
        if name not in index:
            raise InvalidArgument(f"no input named {name!r}; the model's inputs are {list(index)}")
        return index[name]

    def _output(self, name: str) -> None:
        if name not in self._session._output_index:
            raise InvalidArgument(
                f"no output named {name!r}; the model's outputs are {[o.name for o in self._session._outputs]}"
            )

    def bind_cpu_input(self, name: str, arr_on_cpu: Any) -> None:
        self._inputs[name] = _as_bound(arr_on_cpu, self._input(name))

    def bind_input(self, name: str, device_type: str, device_id: int, element_type: Any, shape: Sequence[int],
                   buffer_ptr: int) -> None:
        _check_host(device_type, f"input {name!r}")
        self._inputs[name] = _as_bound(_array_at(buffer_ptr, element_type, shape), self._input(name))

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        self._inputs[name] = _as_bound(ortvalue.numpy(), self._input(name))

    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0, element_type: Any = None,
                    shape: Optional[Sequence[int]] = None, buffer_ptr: Optional[int] = None) -> None:
        """Without buffer_ptr: a new array per run. With it: the output is written there (its
        element_type and shape must be the ones the run gives)."""
        _check_host(device_type, f"output {name!r}")
        self._output(name)
        if buffer_ptr is None:
            self._outputs[name] = None
            return
        if element_type is None or shape is None:
            raise InvalidArgument(f"output {name!r}: a buffer_ptr needs its element_type and shape")
        self._outputs[name] = _array_at(buffer_ptr, element_type, shape)

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        self._output(name)
        array = ortvalue.numpy()
        if not array.flags.writeable:
            raise InvalidArgument(f"output {name!r} is bound to a read-only array")
        self._outputs[name] = array

    def get_outputs(self) -> list[OrtValue]:
        """The bound outputs of the latest run, in the order they were bound."""
        missing = [n for n in self._outputs if n not in self._results]
        if missing:
            raise InvalidArgument(f"output {missing[0]!r} has not been computed: call run_with_iobinding first")
        return [OrtValue(self._results[n]) for n in self._outputs]

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        """Copies of the bound outputs of the latest run."""
        return [v.numpy().copy() for v in self.get_outputs()]

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()
        self._results.clear()

    def synchronize_inputs(self) -> None:  # host memory: nothing to wait for
        pass

    def synchronize_outputs(self) -> None:
        pass


def _as_bound(value: Any, arg: "NodeArg") -> Any:
    """A bound input as the extension reads it: strides kept (no copy here; the run copies a
    strided input the plan does not read in place)."""
    if isinstance(value, OrtValue):
        value = value.numpy()
    if isinstance(value, np.ndarray):
        return value if value.dtype.isnative else value.astype(value.dtype.newbyteorder("="))
    return _as_input(value, arg)


class InferenceSession:
    """An ONNX model compiled for one backend, shaped like onnxruntime.InferenceSession.

    path_or_bytes: a path (str or os.PathLike) to an .onnx file, or the serialized model (bytes).
      Weights kept in external data files (the dynamo exporter's model.onnx.data) are read from
      the file's folder, or for bytes from external_data_folder (onnxruntime's session config
      entry "session.model_external_initializers_file_folder_path" in sess_options gives it too).
    providers: onnxruntime's list ("CPUExecutionProvider", "CUDAExecutionProvider"); the first
      one this build has is used. backend ("cpu", "cuda") names it directly instead.
    threads: threads of the CPU backend's pool (0: the hardware's); sess_options'
      intra_op_num_threads when threads is 0.
    fusion: False compiles the unfused baseline (every node its own kernel), as sess_options'
      graph_optimization_level = GraphOptimizationLevel.ORT_DISABLE_ALL does.
    device, cuda_graph: the CUDA backend's device, and whether each run replays its launches as
      one CUDA graph. emulate_gpu: the CUDA backend runs its plan on the host (slow; checks CUDA
      plans without a GPU).
    dtype: what the model computes in, as the backend runs it ("f32", "bf16", "f16"): on the CPU
      "bf16" holds the GEMMs' constant weights in bf16 (rounded once, when planned; activations
      and sums stay f32: half the weight stream of a decode step); on CUDA "bf16" / "f16" run the
      model converted to that dtype (weights converted once, inputs and outputs keep their
      types). Within the dtype's tolerance of the README's accuracy contract; a dtype the backend
      does not run is refused (f16 on the CPU). bf16_weights=True is dtype="bf16".

    As with onnxruntime, a provider that cannot start (CUDA without a usable device) gives way to
    the next one in the list, with a warning; `backend=` names one backend and fails instead.

    A model with symbolic dims is planned once per input signature (shapes, and the values of
    inputs that become shapes); later runs with a known signature do no planning. Signatures
    whose sizes move in step (a decode loop's growing cache, prompts of new lengths) form a shape
    class, whose plans after the first three are made from a template of the first (about 1.1 ms
    instead of 15-25 ms for a 4-layer LLaMA); shape_classes=False plans each from the model. The
    weights the plans derive (packed GEMM panels, concatenated projections) are made once and
    shared by all of them. run() releases
    the GIL: Python threads running one session run in parallel.
    """

    def __init__(
        self,
        path_or_bytes: Union[str, bytes, os.PathLike],
        sess_options: Optional[Any] = None,
        providers: Optional[Sequence[Any]] = None,
        provider_options: Optional[Sequence[Any]] = None,
        *,
        backend: Optional[str] = None,
        threads: int = 0,
        fusion: bool = True,
        plan_cache_capacity: int = 16,
        device: int = 0,
        cuda_graph: bool = False,
        emulate_gpu: bool = False,
        bf16_weights: bool = False,
        dtype: str = "f32",
        shape_classes: bool = True,
        external_data_folder: Optional[Union[str, os.PathLike]] = None,
        enable_profiling: Optional[bool] = None,
    ):
        if isinstance(path_or_bytes, (bytearray, memoryview)):
            path_or_bytes = bytes(path_or_bytes)
        if not isinstance(path_or_bytes, bytes):
            path_or_bytes = os.fspath(path_or_bytes)
        if threads == 0 and sess_options is not None:
            threads = int(getattr(sess_options, "intra_op_num_threads", 0) or 0)
        if sess_options is not None and int(getattr(sess_options, "graph_optimization_level", 99)) == 0:
            fusion = False  # ORT_DISABLE_ALL: the unfused baseline
        if external_data_folder is None and sess_options is not None and hasattr(sess_options, "get_session_config_entry"):
            try:
                external_data_folder = sess_options.get_session_config_entry(
                    "session.model_external_initializers_file_folder_path") or None
            except Exception:  # onnxruntime raises for an entry never set
                external_data_folder = None
        if sess_options is not None and getattr(sess_options, "optimized_model_filepath", ""):
            raise Unimplemented(
                "onnxruntime's SessionOptions.optimized_model_filepath (saving the optimized model): graphfuse's plans "
                "are made per input signature and kept in memory; `graphfuse explain MODEL --print-ir` prints one"
            )
        candidates = _backends_for(providers, backend)
        if bf16_weights:
            if dtype not in ("f32", "bf16"):
                raise InvalidArgument(f"bf16_weights asks for bf16 and dtype for {dtype}: give one of them")
            dtype = "bf16"
        for k, name in enumerate(candidates):
            try:
                # The CUDA options go to the cuda target only (a target refuses another's options).
                on_cuda = name == "cuda"
                self._session = _graphfuse.Session(
                    path_or_bytes, name, threads, fusion, plan_cache_capacity, device if on_cuda else 0,
                    cuda_graph and on_cuda, emulate_gpu and on_cuda,
                    str(dtype), shape_classes, os.fspath(external_data_folder) if external_data_folder else "",
                )
            except NotFound as e:  # the backend cannot start here (no device): the next provider
                if k + 1 == len(candidates):
                    raise
                warnings.warn(f"graphfuse: {name} is unavailable ({e}); using {candidates[k + 1]}", RuntimeWarning,
                              stacklevel=2)
                continue
            self._backend = name
            break
        self._inputs = [NodeArg(*t) for t in self._session.inputs()]
        self._outputs = [NodeArg(*t) for t in self._session.outputs()]
        self._output_index = {o.name: i for i, o in enumerate(self._outputs)}
        self._sess_options = sess_options if sess_options is not None else SessionOptions()
        self._provider_options = list(provider_options or [])
        if enable_profiling is None:
            enable_profiling = bool(getattr(sess_options, "enable_profiling", False))
        self._profile_prefix = str(getattr(sess_options, "profile_file_prefix", "") or "graphfuse_profile")
        self._profiling_start_ns = 0
        if enable_profiling:
            self._start_profiling()

    def _start_profiling(self) -> None:
        self._session.start_profiling()
        self._profiling_start_ns = time.time_ns()

    def end_profiling(self) -> str:
        """Writes the runs recorded since the session started profiling (enable_profiling=True, or
        SessionOptions.enable_profiling) as Chrome-trace JSON, and stops profiling, as onnxruntime's:
        returns the file's name, "<profile_file_prefix>_<date>_<time>.json" in the working folder.
        Each run is an event with its signature and planning; each kernel an event named by its node
        with args op, members (a fused kernel's original nodes), bytes and engine. Open it in
        https://ui.perfetto.dev or chrome://tracing. Without profiling: "" (as onnxruntime)."""
        if not self._session.profiling:
            return ""
        stamp = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(self._profiling_start_ns / 1e9))
        path = f"{self._profile_prefix}_{stamp}.json"
        self._session.end_profiling(path)
        return path

    def get_profiling_start_time_ns(self) -> int:
        """When profiling started (time.time_ns()); 0 when the session is not profiling."""
        return self._profiling_start_ns if self._session.profiling else 0

    def get_modelmeta(self) -> ModelMetadata:
        """What the model says about itself (ModelProto's producer, domain, version, doc strings and
        metadata_props), as onnxruntime's ModelMetadata."""
        return ModelMetadata(self._session.metadata())

    def get_session_options(self) -> Any:
        return self._sess_options

    def get_provider_options(self) -> dict:
        """Per provider of this session, the options given for it (graphfuse reads none of them)."""
        providers = self.get_providers()
        given = self._provider_options
        return {p: {str(k): str(v) for k, v in (given[i] if i < len(given) else {}).items()}
                for i, p in enumerate(providers)}

    def get_overridable_initializers(self) -> list[NodeArg]:
        """None: graphfuse folds initializers into its plans (an input with a default is a constant)."""
        return []

    def set_providers(self, providers: Optional[Sequence[Any]] = None, provider_options: Optional[Sequence[Any]] = None) -> None:
        """As onnxruntime's, where the providers name this session's backend; another backend needs a
        new InferenceSession (its plans and prepared weights belong to one target)."""
        names = _provider_names(providers or [])
        if names and _PROVIDER_BACKEND[names[0]] != self._backend:
            raise Unimplemented(
                f"onnxruntime's set_providers to another backend ({providers[0]!r}): graphfuse compiles a session "
                f"for one backend ({self._backend}); create a new InferenceSession with those providers"
            )
        if provider_options is not None:
            self._provider_options = list(provider_options)

    def run_with_ort_values(self, output_names: Optional[Sequence[str]], input_dict_ort_values: Mapping[str, Any],
                            run_options: Any = None) -> list[OrtValue]:
        """run() over OrtValues: the outputs as OrtValues."""
        feeds = {k: (v.numpy() if isinstance(v, OrtValue) else v) for k, v in input_dict_ort_values.items()}
        return [OrtValue(a) for a in self.run(output_names, feeds, run_options)]

    def __getattr__(self, name: str) -> Any:
        if name in _UNSUPPORTED_SESSION:
            raise _unsupported(f"InferenceSession.{name}", _UNSUPPORTED_SESSION[name])
        raise AttributeError(f"'InferenceSession' object has no attribute {name!r}")

    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_providers(self) -> list[str]:
        return [p for p, b in _PROVIDER_BACKEND.items() if b == self._backend]

    @property
    def backend(self) -> str:
        return self._backend

    def _arrays(self, input_feed: Mapping[str, Any]) -> list[Any]:
        if not isinstance(input_feed, Mapping):
            raise TypeError(f"input_feed must be a dict of input name to array, not {type(input_feed).__name__}")
        names = {i.name for i in self._inputs}
        unknown = [k for k in input_feed if k not in names]
        if unknown:
            raise InvalidArgument(f"no input named {unknown[0]!r}; the model's inputs are {[i.name for i in self._inputs]}")
        missing = [i.name for i in self._inputs if i.name not in input_feed]
        if missing:
            raise InvalidArgument(f"missing input {missing[0]!r} (the model's inputs are {[i.name for i in self._inputs]})")
        return [_as_input(input_feed[i.name], i) for i in self._inputs]

    def run(
        self, output_names: Optional[Sequence[str]], input_feed: Mapping[str, Any], run_options: Any = None
    ) -> list[np.ndarray]:
        """The outputs named (None: all, in the model's order) for the inputs in input_feed
        (name -> numpy array, host DLPack tensor such as a torch tensor, or anything
        numpy.asarray takes). Outputs are numpy arrays; bf16 ones come back as float32.
        run_options: a RunOptions (terminate = True refuses the run)."""
        _check_run_options(run_options)
        if output_names is not None:
            for name in output_names:
                if name not in self._output_index:
                    raise InvalidArgument(
                        f"no output named {name!r}; the model's outputs are {[o.name for o in self._outputs]}"
                    )
        outputs = self._session.run(self._arrays(input_feed))
        if output_names is None:
            return outputs
        return [outputs[self._output_index[name]] for name in output_names]

    def io_binding(self) -> IOBinding:
        """Inputs and outputs bound to caller-owned arrays (see IOBinding)."""
        return IOBinding(self)

    def run_with_iobinding(self, iobinding: IOBinding, run_options: Any = None) -> None:
        """Runs on the binding's inputs; its bound outputs are written into their arrays, the
        others into new arrays (iobinding.get_outputs())."""
        _check_run_options(run_options)
        if iobinding._session is not self:
            raise InvalidArgument("the IOBinding belongs to another session")
        missing = [i.name for i in self._inputs if i.name not in iobinding._inputs]
        if missing:
            raise InvalidArgument(f"input {missing[0]!r} is not bound (the model's inputs are "
                                  f"{[i.name for i in self._inputs]})")
        bound = [iobinding._outputs.get(o.name) for o in self._outputs]
        made = self._session.run_into([iobinding._inputs[i.name] for i in self._inputs], bound)
        iobinding._results = {
            o.name: (bound[k] if made[k] is None else made[k])
            for k, o in enumerate(self._outputs) if o.name in iobinding._outputs
        }

    def explain(self, input_feed: Optional[Mapping[str, Any]] = None) -> Optional[dict]:
        """The fusion report of the plan for input_feed (planned now if need be; nothing runs),
        or without it of the latest plan: None before the first run of a model with symbolic
        dims. A dict: signature, kernels_before, kernels_after, launches_per_run, groups (name,
        kind, kernel_name, nodes, recomputed, epilogue), refusals (producer, consumer, code,
        message), kernel_choices (node, op, how: on the CPU, which engine runs each GEMM and
        why), planning_ms (import_ms, passes_ms, compile_ms, gemm_tuning_ms: of compile_ms, timing the
        CPU's GEMM engines once per machine), from_template (made from its shape
        class's template), in_place_inputs and in_place_outputs (those whose bound strided arrays
        are read or written in place: a KV cache, see IOBinding); and of the model: plans_made (the
        shapes planned so far), shape_classes (classes whose template makes their plans) and
        prepared_bytes (what they derived from the weights, shared)."""
        if input_feed is None:
            return self._session.explain()
        return self._session.explain(self._arrays(input_feed))

    def cache_stats(self) -> dict:
        """The plan cache: hits, plans_made, evictions, size, capacity, planning_ms (all planning
        so far), last_planning_ms (the latest run's: 0 when its plan was known), shape_classes and
        plans_from_template (plans made from a shape class's template: no import, no passes; see
        graphfuse/model.h, CompileOptions::shape_classes), and what the
        plans derived from the weights, made once and shared by every plan whatever its shapes:
        prepared_entries, prepared_bytes (the model's own weights not counted)."""
        return self._session.cache_stats()


class UnsupportedFeature(Unimplemented, AttributeError):
    """An onnxruntime feature graphfuse does not have, named in the message. It is a NotImplementedError
    (graphfuse.Unimplemented) and, so that hasattr() probes still answer False, an AttributeError."""


def _unsupported(what: str, why: str) -> UnsupportedFeature:
    return UnsupportedFeature(f"graphfuse does not support onnxruntime's {what}: {why}")


# onnxruntime names scripts reach for that graphfuse does not have, and what to do instead.
_UNSUPPORTED_MODULE = {
    "SparseTensor": "sparse tensors are not supported (give dense arrays)",
    "OrtDevice": "sessions read host memory; bind numpy arrays or host DLPack tensors",
    "OrtMemoryInfo": "sessions read host memory",
    "OrtArenaCfg": "graphfuse plans its memory per plan (no arena configuration)",
    "OrtAllocatorType": "graphfuse plans its memory per plan (no allocators)",
    "OrtMemType": "sessions read host memory",
    "SessionIOBinding": "use InferenceSession.io_binding()",
    "ExecutionOrder": "a plan runs its kernels in one order",
    "set_seed": "graphfuse's random ops take their seeds from the model",
    "register_execution_provider_library": "graphfuse's backends are built in (get_available_providers)",
    "get_ep_devices": "graphfuse's backends are built in (get_available_providers)",
    "ModelCompiler": "graphfuse compiles in InferenceSession (explain() shows the plan)",
    "LoraAdapter": "LoRA adapters are not supported",
    "AdapterFormat": "LoRA adapters are not supported",
    "training": "graphfuse runs inference only",
    "quantization": "graphfuse runs the model's own dtypes (f32, bf16, f16); quantize with onnxruntime",
    "transformers": "graphfuse fuses the exported graph itself; onnxruntime.transformers' optimizer is not needed",
}
_UNSUPPORTED_SESSION = {
    "run_async": "run() releases the GIL; call it from a thread",
    "get_tuning_results": "graphfuse has no kernel tuning results to export",
    "set_tuning_results": "graphfuse has no kernel tuning results to import",
    "run_with_ortvaluevector": "use run_with_ort_values",
}


def __getattr__(name: str) -> Any:
    if name in _UNSUPPORTED_MODULE:
        raise _unsupported(name, _UNSUPPORTED_MODULE[name])
    raise AttributeError(f"module 'graphfuse' has no attribute {name!r}")

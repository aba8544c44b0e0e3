"""Which device each op of our inference graphs would run on under tensorflow-metal-plugin.

TensorFlow places an op on the Apple GPU only if a kernel is registered for the GPU device type and the
op's dtypes: the plugin's own Metal kernels first, then TensorFlow's DEVICE_DEFAULT kernels (what every
PluggableDevice gets: Identity, Reshape, ReadVariableOp, While, and int32 arithmetic that keeps its
tensors in host memory). Anything else falls back to the CPU (soft placement). This module answers that
question for a GraphDef, from two registration lists (tests/data/metal_plugin_kernels.json, written by
tools/metal_plugin_kernels.py from the plugin's sdist), so it runs on any machine:

    >>> uses = graph_op_uses(concrete_function.graph.as_graph_def())
    >>> [p for p in place_all(uses, kernels) if p.leaves_gpu]     # the ops that would leave the GPU

Only the data path counts: ops that compute on the inputs or the weights, in the graph and in every
function it calls (the shared layer function, the long-input while loop). Ops that only compute shapes
(Shape, then int32 arithmetic on it) run on the host under every GPU backend, CUDA's included.

It also reads the graph TensorFlow runs after grappler (`optimized_graphs`) for fused MatMul kernels that
carry an activation (`fused_activations`) and for the chains the plugin's own graph pass would fuse
(`plugin_activation_chains`): tensorflow-metal's fused MatMul + BiasAdd + Relu is reported wrong in graph
mode (docs/precision-and-devices.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Their output describes a tensor's shape, not its values: what follows them is shape arithmetic.
SHAPE_OPS = frozenset(
    {"Shape", "ShapeN", "Size", "Rank", "VariableShape", "TensorListLength", "TensorListElementShape"}
)
# Values enter the graph here (besides the inputs): the weights.
SOURCE_OPS = frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd"})
CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
LOOP_OPS = frozenset({"While", "StatelessWhile"})
BRANCH_OPS = frozenset({"If", "StatelessIf"})
Scope = str  # "" for the graph itself, else a function name
NodeKey = tuple[Scope, str]


@dataclass(frozen=True)
class OpUse:
    """One op type with the dtypes of its type attributes, as it occurs on the data path of a graph."""

    op: str
    dtypes: tuple[tuple[str, str], ...]  # (attr, dtype) for every type attribute of the nodes
    data_args: tuple[str, ...]  # input/output argument names that carry data-path tensors
    count: int
    example: str  # one node, "function/node" or "node"

    def describe(self) -> str:
        dtypes = ", ".join(f"{a}={d}" for a, d in self.dtypes)
        return f"{self.op}({dtypes})" if dtypes else self.op


@dataclass(frozen=True)
class Placement:
    """Where TensorFlow would run an op under the plugin.

    where: "metal" (a kernel of the plugin), "tensorflow" (TensorFlow's own DEVICE_DEFAULT kernel, data in
    device memory), "host" (a DEVICE_DEFAULT kernel that keeps a data tensor in host memory: computed by
    the CPU) or "cpu" (no GPU kernel for these dtypes: the op falls back to the CPU).
    """

    use: OpUse
    where: str
    kernel: str = ""

    @property
    def leaves_gpu(self) -> bool:
        return self.where in ("host", "cpu")


@dataclass(frozen=True)
class KernelLists:
    """The plugin's registrations and TensorFlow's DEVICE_DEFAULT ones, as the regeneration script wrote
    them: constraints are (attr, allowed dtypes)."""

    plugin_version: str
    tensorflow_pin: str
    tensorflow_default_version: str
    plugin: tuple[dict[str, Any], ...]
    default: tuple[dict[str, Any], ...]

    @classmethod
    def load(cls, path: str | Path) -> KernelLists:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        plugin = tuple(
            {**k, "constraints": [[attr, [dtype]] for attr, dtype in k["constraints"]]}
            for k in data["plugin"]["kernels"]
        )
        return cls(
            plugin_version=data["plugin"]["version"],
            tensorflow_pin=data["plugin"]["tensorflow_pin"],
            tensorflow_default_version=data["tensorflow_default"]["version"],
            plugin=plugin,
            default=tuple(data["tensorflow_default"]["kernels"]),
        )


def _type_attrs(node: Any) -> dict[str, str]:
    import tensorflow as tf

    return {k: tf.dtypes.as_dtype(v.type).name for k, v in node.attr.items() if v.HasField("type")}


def _arg_names(node: Any) -> tuple[list[str], list[str]]:
    """The op def's argument name for each (non-control) input of `node`, and its output arg names."""
    from tensorflow.python.framework import op_def_registry

    op_def = op_def_registry.get(node.op)
    if op_def is None:
        return [], []

    def count(arg: Any) -> int:
        if arg.number_attr:
            return int(node.attr[arg.number_attr].i)
        if arg.type_list_attr:
            return len(node.attr[arg.type_list_attr].list.type)
        return 1

    inputs = [arg.name for arg in op_def.input_arg for _ in range(count(arg))]
    return inputs, [arg.name for arg in op_def.output_arg]


class _DataFlow:
    """Which nodes of a GraphDef (and of the functions it calls) compute on data: fixed point over calls
    and loops, a function's argument being data if any call site (or loop iteration) passes data."""

    def __init__(self, graph_def: Any) -> None:
        self.functions = {f.signature.name: f for f in graph_def.library.function}
        self.nodes: dict[Scope, list[Any]] = {"": list(graph_def.node)}
        self.nodes.update({name: list(f.node_def) for name, f in self.functions.items()})
        self.by_name = {(scope, n.name): n for scope, nodes in self.nodes.items() for n in nodes}
        self.data: dict[NodeKey, bool] = {}
        self.outputs: dict[NodeKey, list[bool]] = {}  # calls and loops: per output
        self.args: dict[NodeKey, bool] = {}  # (function, arg name)
        self._solve()

    def _ref(self, scope: Scope, ref: str) -> bool:
        """Whether the tensor named `ref` inside `scope` is data."""
        if scope and ":" not in ref and (scope, ref) not in self.by_name:
            return self.args.get((scope, ref), False)  # a function argument
        parts = ref.split(":")
        key = (scope, parts[0])
        index = int(parts[-1]) if len(parts) > 1 else 0
        if key in self.outputs:
            outs = self.outputs[key]
            return outs[index] if index < len(outs) else False
        return self.data.get(key, False)

    def _returns(self, function: str) -> list[bool]:
        f = self.functions[function]
        return [self._ref(function, f.ret[arg.name]) for arg in f.signature.output_arg]

    def _pass_args(self, function: str, flags: list[bool]) -> bool:
        changed = False
        for arg, flag in zip(self.functions[function].signature.input_arg, flags, strict=False):
            key = (function, arg.name)
            if flag and not self.args.get(key, False):
                self.args[key] = True
                changed = True
        return changed

    def _visit(self, scope: Scope, node: Any) -> bool:
        key = (scope, node.name)
        inputs = [self._ref(scope, ref) for ref in node.input if not ref.startswith("^")]
        changed = False
        if node.op in CALL_OPS:
            function = node.attr["f"].func.name
            changed |= self._pass_args(function, inputs)
            outs = self._returns(function)
        elif node.op in LOOP_OPS:
            body, cond = node.attr["body"].func.name, node.attr["cond"].func.name
            carried = [a or b for a, b in zip(inputs, self._returns(body), strict=False)]
            changed |= self._pass_args(body, carried) | self._pass_args(cond, carried)
            outs = carried
        elif node.op in BRANCH_OPS:
            branches = [node.attr[b].func.name for b in ("then_branch", "else_branch")]
            for branch in branches:
                changed |= self._pass_args(branch, inputs[1:])
            outs = [any(flags) for flags in zip(*(self._returns(b) for b in branches), strict=False)]
        else:
            outs = []
        if outs or node.op in CALL_OPS | LOOP_OPS | BRANCH_OPS:
            if self.outputs.get(key) != outs:
                self.outputs[key] = outs
                changed = True
            flag = any(outs) or any(inputs)
        elif node.op in SHAPE_OPS:
            flag = False
        elif node.op in SOURCE_OPS:
            flag = True
        elif node.op == "Placeholder":
            flag = _type_attrs(node).get("dtype") != "resource"
        elif node.op == "_Arg":
            flag = self.args.get((scope, node.name), False)
        else:
            flag = any(inputs)
        if self.data.get(key) != flag:
            self.data[key] = flag
            changed = True
        return changed

    def _solve(self) -> None:
        changed = True
        while changed:
            changed = False
            for scope, nodes in self.nodes.items():
                for node in nodes:
                    changed |= self._visit(scope, node)

    def data_args(self, scope: Scope, node: Any) -> tuple[str, ...]:
        """Argument names of `node` that carry data: its data inputs, and its outputs when it is data."""
        input_names, output_names = _arg_names(node)
        refs = [r for r in node.input if not r.startswith("^")]
        names = {name for name, ref in zip(input_names, refs, strict=False) if self._ref(scope, ref)}
        if self.data.get((scope, node.name), False):
            names |= set(output_names)
        return tuple(sorted(names))


def graph_op_uses(graph_def: Any) -> list[OpUse]:
    """Every op type (with its dtypes) on the data path of `graph_def` and the functions it calls."""
    flow = _DataFlow(graph_def)
    found: dict[tuple[str, tuple[tuple[str, str], ...], tuple[str, ...]], list[str]] = {}
    for scope, nodes in flow.nodes.items():
        for node in nodes:
            if not flow.data.get((scope, node.name), False):
                continue
            dtypes = tuple(sorted(_type_attrs(node).items()))
            key = (node.op, dtypes, flow.data_args(scope, node))
            found.setdefault(key, []).append(f"{scope}/{node.name}" if scope else node.name)
    return [
        OpUse(op=op, dtypes=dtypes, data_args=args, count=len(names), example=names[0])
        for (op, dtypes, args), names in sorted(found.items())
    ]


def _matches(kernel: dict[str, Any], use: OpUse) -> bool:
    """TensorFlow's rule: every type constraint of the registration names an attr of the node whose
    dtype is among the allowed ones."""
    dtypes = dict(use.dtypes)
    return kernel["op"] == use.op and all(
        dtypes.get(attr) in allowed for attr, allowed in kernel["constraints"]
    )


def place(use: OpUse, kernels: KernelLists) -> Placement:
    """Where `use` runs: a device-specific (plugin) kernel wins over DEVICE_DEFAULT, as in TensorFlow."""
    for kernel in kernels.plugin:
        if _matches(kernel, use):
            return Placement(use, "metal", kernel["kernel"])
    for kernel in kernels.default:
        if _matches(kernel, use):
            on_host = set(kernel["host_memory"]) & set(use.data_args)
            return Placement(use, "host" if on_host else "tensorflow", "DEVICE_DEFAULT")
    return Placement(use, "cpu")


def place_all(uses: Iterable[OpUse], kernels: KernelLists) -> list[Placement]:
    return [place(use, kernels) for use in uses]


# ------------------------------------------------------------------------ fused MatMul kernels after grappler
# What a fused contraction may fold in without an activation (the bias, oneDNN's residual add).
NOT_ACTIVATIONS = frozenset({"BiasAdd", "Add", "AddV2"})
# The activations tensorflow-metal-plugin 0.4.1's own graph pass folds into _FusedMatMul / _FusedConv2D
# (IsFusableActivation in src/tensorflow/core/common_runtime/metal/metal_graph.mm).
PLUGIN_FUSABLE_ACTIVATIONS = frozenset({"Relu", "Relu6", "Elu", "LeakyRelu", "Sigmoid", "Tanh"})


def _all_nodes(graph_def: Any) -> Iterator[tuple[Scope, Any]]:
    yield from (("", node) for node in graph_def.node)
    for function in graph_def.library.function:
        yield from ((function.signature.name, node) for node in function.node_def)


def fused_activations(graph_def: Any) -> list[str]:
    """Every fused MatMul or convolution (_FusedMatMul, _MklFusedMatMul, _MklNativeFusedMatMul, ...) in
    `graph_def` and its functions whose fused_ops carry an activation, as "scope/node: op [fused ops]"."""
    found = []
    for scope, node in _all_nodes(graph_def):
        fused_contraction = node.op.startswith("_") and "Fused" in node.op
        if not (fused_contraction and ("MatMul" in node.op or "Conv" in node.op)):
            continue
        fused = [s.decode() for s in node.attr["fused_ops"].list.s]
        if set(fused) - NOT_ACTIVATIONS:
            found.append(f"{scope}/{node.name}: {node.op} {fused}")
    return found


def plugin_activation_chains(graph_def: Any) -> list[str]:
    """MatMul (or Conv2D) -> BiasAdd -> activation chains that tensorflow-metal-plugin's graph pass would fold
    into one fused kernel, as "matmul -> bias -> activation" (each scope alone, every node taken to be on the
    GPU). Its rule, ported from metal_graph.mm (0.4.1): a BiasAdd whose first input is a MatMul or Conv2D
    read by nothing else, and whose only reader is one of PLUGIN_FUSABLE_ACTIVATIONS."""
    scopes: dict[Scope, list[Any]] = {}
    for scope, node in _all_nodes(graph_def):
        scopes.setdefault(scope, []).append(node)
    chains = []
    for nodes in scopes.values():
        by_name = {node.name: node for node in nodes}
        readers: dict[str, list[Any]] = {}
        for node in nodes:
            for ref in node.input:
                readers.setdefault(ref.lstrip("^").split(":")[0], []).append(node)
        for bias in nodes:
            if bias.op != "BiasAdd" or len(bias.input) != 2 or bias.input[0].startswith("^"):
                continue
            base = by_name.get(bias.input[0].split(":")[0])
            if base is None or base.op not in ("MatMul", "Conv2D") or len(readers.get(base.name, [])) != 1:
                continue
            after = readers.get(bias.name, [])
            if len(after) == 1 and after[0].op in PLUGIN_FUSABLE_ACTIVATIONS:
                chains.append(f"{base.name} -> {bias.name} -> {after[0].name} ({after[0].op})")
    return chains


def optimized_graphs(call: Callable[[], Any]) -> list[Any]:
    """The graphs TensorFlow ran for the tf.functions `call` instantiates, after grappler (and, on a Mac,
    after the Metal plugin's own graph pass): RunMetadata's post_optimization_graph. A function already
    instantiated with the same options before is not reported again."""
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        call()
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    return [graphs.post_optimization_graph for graphs in metadata.function_graphs]

"""Freezing: turn a Dynamo graph's lifted parameters and buffers into graph constants.

Dynamo hands a backend a graph in which every parameter and buffer is a *placeholder* (an
input) carrying the real tensor in ``example_inputs``. Fusions such as BatchNorm folding need
them as constants, so, like inductor's ``freezing=True``
(``torch._inductor.config.freezing``), this pass assumes inference: it replaces each such
placeholder by a ``get_attr`` node whose tensor is registered under the original fully
qualified name (``layer1.0.conv1.weight``, inside nested empty modules). Paths and plan ids are
therefore the same as with ``torch.fx.symbolic_trace``.

Consequences, as with inductor's freezing:

* the weights are assumed not to change after compilation; changing them in place needs a
  recompile (``torch._dynamo.reset()``) to be seen by an ONNX / TensorRT artifact;
* gradients do not flow to the parameters. So a graph that trains (``batch_norm`` with
  running statistics or ``dropout`` with ``training=True``; a ``batch_norm`` over its input's
  own statistics updates nothing and is written as the ops it computes:
  :mod:`embedl_dynamo.graph.batch_statistics`) or receives inputs that require grad is not frozen:
  :func:`inference_blocker` names the reason and the backend runs that graph eagerly, warning
  once. So does a graph whose in-place ops cannot be made functional exactly (a write through
  ``as_strided``; see :mod:`embedl_dynamo.graph.functionalize`); the others are made
  functional here, before any rewrite sees the graph. With ``write_back``, an input or buffer
  written into (a KV cache; also through a view) stays an input and its final value is
  returned, for the caller to copy back.

An autocast region that turns autocast off where it is off already changes nothing and is
dropped (:mod:`embedl_dynamo.graph.idle_autocast`). Then, as inductor's freezing folds
constants, the tensors the graph computes from no input and no weight (masks from ``arange``,
relative-position buckets) are computed once, in PyTorch, and become constants too
(:mod:`embedl_dynamo.graph.input_free`).

The user's tensors are never modified: they are ``detach()``-ed views (no copy).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from embedl_dynamo.graph.analysis import GraphAnalysis, analysis_of
from embedl_dynamo.graph.batch_statistics import decompose_batch_statistics, uses_batch_statistics
from embedl_dynamo.graph.functionalize import functionalize, mutation_blocker, output_alias
from embedl_dynamo.graph.idle_autocast import drop_idle_autocast
from embedl_dynamo.graph.input_free import fold_input_free
from embedl_dynamo.graph.output_views import OutputView, output_views
from embedl_dynamo.graph.scalar_inputs import bake_scalar, int_as_tensor, scalar_as_tensor
from embedl_dynamo.graph.strided_reads import gather_strided_reads, strided_read_blocker
from embedl_dynamo.graph.transpose_dims import nonnegative_transpose_dims
from embedl_dynamo.graph.view_writes import inputs_written_through_views

__all__ = ["FrozenGraph", "freeze", "inference_blocker", "is_lifted_constant"]

# (function, name of its "training" argument)
_TRAINING_FUNCTIONS: dict[Any, str] = {
    F.batch_norm: "training",
    torch.batch_norm: "training",
    F.dropout: "training",
    F.dropout1d: "training",
    F.dropout2d: "training",
    F.dropout3d: "training",
    F.alpha_dropout: "training",
    F.feature_alpha_dropout: "training",
    torch.dropout: "train",
    torch.alpha_dropout: "train",
    torch.feature_dropout: "train",
}
# position of the training flag when passed positionally
_TRAINING_POSITION: dict[Any, int] = {
    F.batch_norm: 5,
    torch.batch_norm: 5,
    F.dropout: 2,
    F.dropout1d: 2,
    F.dropout2d: 2,
    F.dropout3d: 2,
    F.alpha_dropout: 2,
    F.feature_alpha_dropout: 2,
    torch.dropout: 2,
    torch.alpha_dropout: 2,
    torch.feature_dropout: 2,
}
_DEFAULT_TRAINING = {F.batch_norm: False, F.dropout: True, F.alpha_dropout: False}


@dataclass
class FrozenGraph:
    """What :func:`freeze` returns.

    Attributes:
        gm: the new GraphModule; its placeholders are the user inputs only.
        user_inputs: indices into ``example_inputs`` of the inputs the graph still takes.
        int_inputs: those of them that are Python ints the graph takes as 0-d int64 tensors
            (pass ``torch.tensor(n)``).
        specialized: inputs (Python floats Dynamo passes as tensors) whose value the graph holds
            as a constant, by index: a call with another value must run the original graph.
        written: positions, among ``user_inputs``, of the inputs the graph writes in place;
            the graph returns their final values after its own outputs, in this order, and
            the caller copies each into its tensor.
        returned: outputs that are an input's tensor itself, by output position: the position
            among ``user_inputs`` of the input the caller returns there.
        views: outputs the caller regenerates as views after the call, by output position
            (:mod:`embedl_dynamo.graph.output_views`); an input they view is given by its
            position among ``user_inputs``.
    """

    gm: fx.GraphModule
    user_inputs: list[int]
    int_inputs: list[int] = dataclasses.field(default_factory=list)
    specialized: dict[int, float] = dataclasses.field(default_factory=dict)
    written: tuple[int, ...] = ()
    returned: dict[int, int] = dataclasses.field(default_factory=dict)
    views: dict[int, OutputView] = dataclasses.field(default_factory=dict)


def is_lifted_constant(node: fx.Node, value: Any) -> bool:
    """Whether a Dynamo placeholder is a lifted parameter or buffer (not a user input)."""
    if node.op != "placeholder" or not isinstance(value, torch.Tensor):
        return False
    if isinstance(value, nn.Parameter):
        return True
    tensor_dict = node.meta.get("tensor_dict") or {}
    if "_dynamo_static_input_type" in tensor_dict:
        return True
    # buffers are not always marked static (e.g. dynamic=True); their source says what they are
    name = _source_name(node) or ""
    return "._buffers[" in name or "._parameters[" in name


def _source_name(node: fx.Node) -> str | None:
    source = getattr(node.meta.get("grapharg"), "source", None)
    name = getattr(source, "name", None)
    if callable(name):
        name = name()
    return name if isinstance(name, str) else None


_TOKEN = re.compile(r"\.([A-Za-z_]\w*)|\[['\"]?([^'\"\]]+)['\"]?\]")
_CONTAINERS = {"_modules", "_parameters", "_buffers"}


def _source_fqn(node: fx.Node) -> str | None:
    """``L['self']._modules['layer1']._modules['0']._parameters['weight']`` -> ``layer1.0.weight``."""
    name = _source_name(node)
    if name is None:
        return None
    root = re.match(r"^[LG]\[['\"]([^'\"]+)['\"]\]", name)
    if root is None:
        return None
    parts = [] if root.group(1) == "self" else [root.group(1)]
    for attr, key in _TOKEN.findall(name[root.end() :]):
        token = attr or key
        if token not in _CONTAINERS:
            parts.append(token)
    fqn = ".".join(parts)
    valid = all(re.match(r"^[A-Za-z0-9_]+$", p) for p in parts)
    return fqn if parts and valid else None


def _training_flag(node: fx.Node) -> bool:
    name = _TRAINING_FUNCTIONS[node.target]
    if name in node.kwargs:
        return bool(node.kwargs[name])
    pos = _TRAINING_POSITION[node.target]
    if len(node.args) > pos:
        return bool(node.args[pos])
    return _DEFAULT_TRAINING.get(node.target, False)


def inference_blocker(
    gm: fx.GraphModule, example_inputs: Sequence[Any], analysis: GraphAnalysis | None = None
) -> str | None:
    """Why this graph must not be frozen for inference, or None when it may.

    Returns a reason when an op trains (``batch_norm``/``dropout`` with ``training=True``), when
    an in-place op or an output's aliasing cannot be kept exactly (read from ``analysis``,
    ``gm``'s, where the caller has it), or when grad mode is on and a user input or a parameter
    requires grad (freezing would detach the output, so ``backward()`` would fail).
    """
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _TRAINING_FUNCTIONS:
            if _training_flag(node) and not uses_batch_statistics(node):
                name = getattr(node.target, "__name__", str(node.target))
                return (
                    f"{name} runs in training mode (node {node.name}); call model.eval() to "
                    "compile for inference"
                )
    analysis = analysis_of(gm, analysis)
    mutation = mutation_blocker(
        gm, lambda node: _source_fqn(node) or node.name, write_back=True, analysis=analysis
    )
    mutation = mutation or output_alias(gm, analysis)
    if mutation is not None:
        return (
            f"{mutation}; it runs in PyTorch so PyTorch's in-place semantics hold (buffers "
            "updated in forward, inputs modified in place, writes through views)"
        )
    strided = strided_read_blocker(gm)
    if strided is not None:
        return f"{strided}; it runs in PyTorch"
    if torch.is_grad_enabled():
        # frozen weights would silently detach the output and break backward()
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for node, value in zip(placeholders, example_inputs):
            if isinstance(value, torch.Tensor) and value.requires_grad:
                if is_lifted_constant(node, value):
                    what = f"parameter {_source_fqn(node) or node.name}"
                else:
                    what = f"input {node.name}"
                return (
                    f"{what} requires grad while grad mode is on; wrap the call in "
                    "torch.no_grad() or torch.inference_mode() to compile for inference"
                )
    return None


_MODULE_NAMES = frozenset(dir(nn.Module))  # methods and attributes every module has


def _constant_path(path: str) -> str:
    """``path`` with each part that would shadow an ``nn.Module`` attribute given a trailing
    ``_`` (a tensor cached in a dict under ``"cpu"``: ``cache.cpu`` cannot be registered)."""
    return ".".join(p + "_" if p in _MODULE_NAMES else p for p in path.split("."))


def _set_attr(root: nn.Module, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    module = root
    for part in parents:
        child = getattr(module, part, None)
        if not isinstance(child, nn.Module):
            child = nn.Module()
            module.add_module(part, child)
        module = child
    if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
        module.register_buffer(leaf, value)
    elif isinstance(value, nn.Module):
        module.add_module(leaf, value)
    else:
        setattr(module, leaf, value)


def _get_attr(root: nn.Module, path: str) -> Any:
    value: Any = root
    for part in path.split("."):
        value = getattr(value, part)
    return value


def _has_attr(root: nn.Module, path: str) -> bool:
    try:
        _get_attr(root, path)
    except AttributeError:
        return False
    return True


def _replace_size_input(
    graph: fx.Graph,
    new: fx.Node,
    old: fx.Node,
    placeholders: list[fx.Node],
    example_inputs: Sequence[Any],
) -> bool:
    """Replace a symbolic-size placeholder (``s0``) by ``x.size(d)`` of a tensor input.

    With a dynamic batch, Dynamo passes the symbolic size as an extra input; reading it from
    the tensor keeps the graph a function of its tensor inputs (exportable with a dynamic axis).
    Returns False when no tensor input carries that size (the placeholder then stays an input).
    """
    symbol = str(old.meta.get("example_value", ""))
    if not new.users:
        graph.erase_node(new)
        return True
    for node, value in zip(placeholders, example_inputs):
        fake = node.meta.get("example_value")
        if not isinstance(value, torch.Tensor) or is_lifted_constant(node, value) or fake is None:
            continue
        for dim, size in enumerate(getattr(fake, "shape", ())):
            if str(size) == symbol:
                last = [n for n in graph.nodes if n.op == "placeholder"][-1]
                with graph.inserting_after(last):
                    size_node = graph.call_method("size", (_mapped(graph, node), dim))
                size_node.meta.update(new.meta)
                new.replace_all_uses_with(size_node)
                graph.erase_node(new)
                return True
    return False


def _mapped(graph: fx.Graph, old: fx.Node) -> fx.Node:
    return next(n for n in graph.nodes if n.op == "placeholder" and n.name == old.name)


def _kept_inputs(
    gm: fx.GraphModule, placeholders: list[fx.Node], write_back: bool, analysis: GraphAnalysis
) -> tuple[dict[int, fx.Node], dict[int, OutputView], set[fx.Node]]:
    """The outputs that are inputs themselves, the outputs regenerated as views, and the
    placeholders that stay inputs though they are parameters or buffers.

    With ``write_back`` the caller returns its own tensors where the graph returns an input or
    buffer as itself, writes back those written in place (directly or through a view), and
    regenerates views of them, so those stay inputs; without, a returned buffer is a constant
    output."""
    if not write_back:
        return {}, {}, set()
    returned, views = dict(analysis.returned_inputs), output_views(gm, analysis)
    kept = set(analysis.written_inputs.values()) | set(returned.values())
    kept |= inputs_written_through_views(gm, analysis)
    kept |= {placeholders[v.index] for v in views.values() if v.of_input}
    return returned, views, kept


def _attributes(gm: fx.GraphModule) -> nn.Module:
    """A module holding what ``gm``'s ``get_attr`` and ``call_module`` nodes read, by path."""
    root = nn.Module()
    for node in gm.graph.nodes:
        if node.op in ("get_attr", "call_module"):
            target = str(node.target)
            if not _has_attr(root, target):
                _set_attr(root, target, _get_attr(gm, target))
    return root


def _inference_form(frozen: fx.GraphModule, write_back: bool) -> tuple[int, ...]:
    """The frozen graph made functional and written for inference, in place: idle autocast
    regions dropped, in-place ops made functional, ``as_strided`` reads of storage written as
    gathers, ``transpose`` dims made non-negative, batch statistics written as ops, tensors computed from no input folded. The positions of the inputs written back."""
    drop_idle_autocast(frozen.graph)
    positions = functionalize(frozen, write_back)
    gather_strided_reads(frozen)
    nonnegative_transpose_dims(frozen)
    decompose_batch_statistics(frozen)
    fold_input_free(frozen)
    return positions


def freeze(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    write_back: bool = False,
    analysis: GraphAnalysis | None = None,
) -> FrozenGraph:
    """Replace lifted parameter/buffer placeholders by constants named by their original path.

    Args:
        gm: the graph Dynamo gave the backend; not modified.
        example_inputs: the real tensors Dynamo gave with it, one per placeholder.
        write_back: inputs (and buffers) the graph writes straight into stay inputs, and the
            graph returns their final values (``FrozenGraph.written``); without it such a
            write raises.
        analysis: ``gm``'s (:mod:`embedl_dynamo.graph.analysis`), where the caller has it.
            The frozen graph is another graph: it is analysed anew when made functional.

    Returns:
        A :class:`FrozenGraph` with a new GraphModule, its in-place ops made functional
        (:mod:`embedl_dynamo.graph.functionalize`), and the indices of the remaining inputs.

    Raises:
        ValueError: an in-place op cannot be made functional exactly (a write into an input,
            a parameter or a buffer, or through a view that is read later): the reason.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise ValueError(
            f"the graph has {len(placeholders)} placeholders but {len(example_inputs)} example "
            "inputs were given"
        )
    graph = fx.Graph()
    value_map: dict[fx.Node, fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, value_map))

    root = _attributes(gm)
    constants: dict[str, str] = {}
    user_inputs: list[int] = []
    int_inputs: list[int] = []
    specialized: dict[int, float] = {}
    returned, views, kept = _kept_inputs(gm, placeholders, write_back, analysis_of(gm, analysis))
    for index, (old, value) in enumerate(zip(placeholders, example_inputs)):
        new = value_map[old]
        if isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool):
            if _replace_size_input(graph, new, old, placeholders, example_inputs):
                continue
            if int_as_tensor(new):
                int_inputs.append(index)
        if old in kept or not is_lifted_constant(old, value):
            scalar_as_tensor(new, old)
            if bake_scalar(new, old, value):
                specialized[index] = float(value)
                continue
            user_inputs.append(index)
            continue
        fqn = _constant_path(_source_fqn(old) or old.name)
        base, suffix = fqn, 1
        while _has_attr(root, fqn) or fqn in constants.values():
            suffix += 1
            fqn = f"{base}_{suffix}"
        _set_attr(root, fqn, value.detach())
        with graph.inserting_before(new):
            const = graph.get_attr(fqn)
        const.meta.update(new.meta)
        new.replace_all_uses_with(const)
        graph.erase_node(new)
        constants[old.name] = fqn

    frozen = fx.GraphModule(root, graph, class_name=type(gm).__name__)
    frozen.meta.update(getattr(gm, "meta", {}))
    positions = _inference_form(frozen, write_back)
    users = {placeholders[index]: k for k, index in enumerate(user_inputs)}
    regenerated = {out: users[node] for out, node in returned.items() if node in users}
    views = {
        out: dataclasses.replace(v, index=users[placeholders[v.index]]) if v.of_input else v
        for out, v in views.items()
    }
    return FrozenGraph(frozen, user_inputs, int_inputs, specialized, positions, regenerated, views)

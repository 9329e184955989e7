"""ATen operations on DTensors become worker commands; their outputs' shapes come from meta
tensors on the controller (cached by the arguments' shapes)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from ..errors import DataDependentError
from ._worker import CALL
from .opaque_ref import GroupWire, OpaqueRef, OpaqueWire, RemoteProcessGroup, propagating

if TYPE_CHECKING:
    from ._client import _Client
    from ._dtensor import DTensor

_HERE = os.path.dirname(__file__)
_TORCH = os.path.dirname(torch.__file__)
#: torch code whose own local tensors stay local under ``activate()``: the optimizers'
#: scalar state (AdamW's step counter, read back with ``.item()``) and tensor printing
_LOCAL_CALLERS = (os.path.join(_TORCH, "optim", ""), os.path.join(_TORCH, "_tensor_str.py"))
#: frames between torch's caller and our mode: wrappers that disable dynamo
_PASS_THROUGH = (_HERE, os.path.join(_TORCH, "_dynamo", ""), os.path.join(_TORCH, "_compile.py"))
#: operations that read a value (a Python number or bool) out of a tensor
_VALUE_READS = {
    "aten::_local_scalar_dense": ".item(), float(t), int(t) or bool(t)",
    "aten::equal": "torch.equal",
    "aten::is_nonzero": "bool(t)",
    "aten::item": ".item()",
    "aten::allclose": "torch.allclose",
}


class _OpInfo(NamedTuple):
    name: str  # "aten::add_.Tensor": what the workers resolve
    written: tuple[tuple[int, str], ...]  # (position, name) of the args changed in place
    returns: tuple[tuple[int, str] | None, ...]  # per return: the written arg it is
    inplace_view: bool  # changes the shape of its input (squeeze_, t_...)
    seeded: bool  # random: gets a seed
    value_read: bool
    aten: bool


_infos: dict[Any, _OpInfo] = {}


def _info(func: Any) -> _OpInfo:
    info = _infos.get(func)
    if info is not None:
        return info
    schema = func._schema  # noqa: SLF001 - torch's (an OpOverload's)
    name = schema.name + ("." + schema.overload_name if schema.overload_name else "")
    written = []
    sets: dict[str, tuple[int, str]] = {}
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            written.append((i, a.name))
            for s in a.alias_info.before_set:
                sets[s] = (i, a.name)
    returns = []
    for r in schema.returns:
        where = None
        if r.alias_info is not None and r.alias_info.is_write:
            where = next((sets[s] for s in r.alias_info.before_set if s in sets), None)
        returns.append(where)
    tags = func.tags
    info = _OpInfo(
        name,
        tuple(written),
        tuple(returns),
        torch.Tag.inplace_view in tags,
        torch.Tag.nondeterministic_seeded in tags,
        schema.name in _VALUE_READS,
        func.namespace == "aten",
    )
    _infos[func] = info
    return info


def _arg(args: Any, kwargs: Any, pos: int, name: str) -> Any:
    return args[pos] if pos < len(args) else kwargs.get(name)


def value_error(what: str) -> DataDependentError:
    return DataDependentError(
        f"{what} needs the value of a DTensor, which lives on the workers: fetch it first "
        "(inspect(t, **coords), or await fetch_shard(t, **coords)) and use the local tensor"
    )


def stays_local(func: Any, args: Any, kwargs: Any) -> bool:
    """Whether an operation with no DTensor in it runs here, not on the mesh."""
    info = _info(func)
    if not info.aten or info.value_read or info.written:
        return True  # the profiler's ops; reading or changing a local tensor
    if kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "meta":
        return True
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type == "meta":
            return True
    f: Any = sys._getframe(2)  # noqa: SLF001 - the stdlib's
    while f is not None and f.f_code.co_filename.startswith(_PASS_THROUGH):
        f = f.f_back
    return f is not None and f.f_code.co_filename.startswith(_LOCAL_CALLERS)


_ours: dict[Any, bool] = {}  # code object -> whether it is ours or torch's
_lines: dict[tuple[Any, int], str] = {}


def issued_at() -> str:
    """The user's line that issued the current operation (first frame outside us and torch)."""
    f: Any = sys._getframe(2)  # noqa: SLF001 - the stdlib's
    while f is not None:
        code = f.f_code
        ours = _ours.get(code)
        if ours is None:
            path = code.co_filename
            ours = _ours[code] = (
                path.startswith(_HERE) or path.startswith(_TORCH) or "contextlib" in path
            )
        if not ours:
            where = _lines.get((code, f.f_lineno))
            if where is None:
                where = f"{code.co_filename}:{f.f_lineno} in {code.co_name}"
                if len(_lines) < 100_000:
                    _lines[code, f.f_lineno] = where
            return where
        f = f.f_back
    return "?"


class _Walk:
    """One pass over a call's arguments: the wire form, the cache key, the DTensors."""

    __slots__ = ("client", "dtensor", "key")

    def __init__(self, client: _Client | None) -> None:
        self.client = client
        self.key: list[Any] = []
        self.dtensor: DTensor | None = None

    def wire(self, obj: Any) -> Any:
        t = type(obj)
        if t is _DT:
            key = self.key
            key.append(obj.shape)
            key.append(obj.stride())
            key.append(obj.dtype)
            client = obj.client
            if self.client is None:
                self.client = client
                self.dtensor = obj
            elif client is not self.client:
                raise ValueError(
                    f"a DTensor of {client.procs} used with one of {self.client.procs}: "
                    "move it first with t.to_mesh(procs)"
                )
            return obj.ref
        if t is tuple or t is list:
            self.key.append(len(obj))
            return t([self.wire(x) for x in obj])
        if isinstance(obj, torch.Tensor):
            if isinstance(obj, _DT):
                raise TypeError(f"a subclass of DTensor ({t.__name__}) is not supported")
            self.key.append(("L", obj.shape, obj.stride(), obj.dtype))
            # Replicated to every shard. Copied now: the batch is pickled at a later flush,
            # and the caller may change the tensor meanwhile.
            return obj.detach().clone()
        if t is OpaqueRef:
            return OpaqueWire(self.wire(obj._key))  # noqa: SLF001 - its one field
        if t is RemoteProcessGroup:
            procs = self.client.procs if self.client is not None else None
            if procs is not None and obj.device_mesh is not procs and obj.device_mesh != procs:
                raise ValueError(f"{obj!r} is a group of another mesh than this call's ({procs!r})")
            self.key.append(("G", obj.dims))
            return GroupWire(obj.dims)
        if t is torch.Generator:
            raise TypeError(
                "a torch.Generator cannot go to the workers: seed with torch.manual_seed "
                "on the controller (each random op draws its shards' seeds from it)"
            )
        self.key.append(obj if t is not bool and t is not float else (t, obj))
        return obj


def _meta(obj: Any) -> Any:
    t = type(obj)
    if t is _DT:
        return torch.empty_strided(obj.shape, obj.stride(), dtype=obj.dtype, device="meta")
    if isinstance(obj, torch.Tensor):
        return torch.empty_strided(obj.shape, obj.stride(), dtype=obj.dtype, device="meta")
    if t is tuple or t is list:
        return t(_meta(x) for x in obj)
    if t is OpaqueRef:
        return OpaqueRef._create(_meta(obj._key))  # noqa: SLF001 - its one field
    return obj


def _template(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return ("T", out.shape, out.stride(), out.storage_offset(), out.dtype)
    if type(out) is OpaqueRef:
        return ("O", _template(out._key))  # noqa: SLF001 - its one field
    if isinstance(out, (tuple, list)):
        return ("Q", type(out), tuple(_template(o) for o in out))
    return ("V", out)


_templates: dict[Any, Any] = {}


def _infer(func: Any, args: Any, kwargs: Any, key: Any) -> Any:
    tpl = _templates.get(key)
    if tpl is not None:
        return tpl
    margs = _meta(args)
    mkwargs = {k: _meta(v) for k, v in kwargs.items()}
    if "device" in mkwargs:
        mkwargs["device"] = "meta"
    mkwargs.pop("generator", None)
    try:
        out = func(*margs, **mkwargs)
    except (NotImplementedError, RuntimeError) as e:
        if "data-dependent" in str(e) or "data dependent" in str(e) or "nonzero" in str(e):
            raise DataDependentError(
                f"{func}: its output shape depends on the values, which live on the "
                "workers; run it inside a @remote function with propagate= giving the shape"
            ) from None
        if isinstance(e, NotImplementedError) and "Meta" in str(e):
            raise NotImplementedError(
                f"{func}: torch has no meta kernel for it, so the controller cannot infer "
                "its output's shape (for some ops, e.g. unique or masked_select, the shape "
                "depends on the values); run it inside a @remote function with "
                "propagate= giving the shape"
            ) from None
        raise
    tpl = _template(out)
    if len(_templates) < 100_000:
        _templates[key] = tpl
    return tpl


def dispatch(func: Any, args: Any, kwargs: Any) -> Any:
    """Record ``func(*args, **kwargs)`` (an ATen op with a DTensor in it) for the workers."""
    info = _info(func)
    if info.value_read:
        raise value_error(f"{_VALUE_READS[func._schema.name]} (torch's {func})")  # noqa: SLF001 - torch's
    walk = _Walk(None)
    key = walk.key
    wargs = []
    for a in args:  # the common arguments inline: this runs for every op
        t = type(a)
        if t is _DT:
            client = a.client
            if walk.client is None:
                walk.client = client
            elif client is not walk.client:
                walk.wire(a)  # raises: another mesh
            key.append(a.shape)
            key.append(a.stride())
            key.append(a.dtype)
            wargs.append(a.ref)
        elif t is int or a is None:
            key.append(a)
            wargs.append(a)
        elif t is float:
            # With a tensor in, a float scalar (an lr, AdamW's bias correction) changes
            # values only, never shapes: keyed by its type, so new values hit the cache.
            key.append(float)
            wargs.append(a)
        else:
            wargs.append(walk.wire(a))
    wkwargs = {}
    for k, v in kwargs.items():
        if type(v) is float:
            key.append(float)
            wkwargs[k] = v
        else:
            wkwargs[k] = walk.wire(v)
    client = walk.client
    if client is None:
        raise TypeError(f"{func} reached the tensor engine without a DTensor in its arguments")
    return _record(client, func, info, args, kwargs, wargs, wkwargs, key)


def dispatch_factory(client: _Client, func: Any, args: Any, kwargs: Any) -> Any:
    """Record an operation without DTensors in it (a factory, or one on local tensors,
    which are replicated) as making a DTensor on ``client``'s mesh."""
    info = _info(func)
    walk = _Walk(client)
    wargs = walk.wire(args)
    wkwargs = {k: walk.wire(v) for k, v in kwargs.items()}
    return _record(client, func, info, args, kwargs, wargs, wkwargs, walk.key)


def _record(
    client: _Client,
    func: Any,
    info: _OpInfo,
    args: Any,
    kwargs: Any,
    wargs: Any,
    wkwargs: dict[str, Any],
    key: list[Any],
) -> Any:
    key.append(func)
    key.extend(kwargs)  # the names: which arguments the values belong to
    hkey = tuple(key)
    if info.returns or not info.written:
        tpl = _infer(func, args, kwargs, hkey)
    else:
        tpl = ("V", None)  # returns nothing (_foreach_add_, _fused_adamw_): no shapes to learn
    seed = 0
    if info.seeded:
        if kwargs.get("generator") is not None:
            raise TypeError(
                "a torch.Generator cannot go to the workers: seed with torch.manual_seed "
                "on the controller (each random op draws its shards' seeds from it)"
            )
        # Reproducible with torch.manual_seed on the controller: each random op draws a
        # seed s from the controller's RNG; shard r draws from a generator seeded s + r.
        seed = int(torch.randint(0, 2**62, (1,)).item())
    if "device" in wkwargs:
        wkwargs["device"] = None  # the mesh's device: each worker's own
    written: list[int] = []
    for pos, name in info.written:
        _ids(_arg(args, kwargs, pos, name), written)
    if info.inplace_view:
        _restride(func, args, kwargs)
    out_ids: list[int] = []
    if len(info.returns) == 1:
        alias = info.returns[0]
        if alias is not None:
            result = _arg(args, kwargs, *alias)
        else:
            result = _build(tpl, client)
        _ids(result, out_ids)
    elif info.returns:
        items = []
        for r, part in zip(info.returns, tpl[2], strict=True):
            items.append(_arg(args, kwargs, *r) if r is not None else _build(part, client))
        result = tuple(items)
        _ids(result, out_ids)
    else:
        result = None
    client.issue(
        (CALL, info.name, wargs, wkwargs, out_ids, written, issued_at(), seed, client.stream)
    )
    return result


def _ids(obj: Any, into: list[int]) -> None:
    t = type(obj)
    if t is _DT:
        into.append(obj.ref.i)
    elif t is tuple or t is list:
        for x in obj:
            _ids(x, into)
    elif t is OpaqueRef:
        _ids(obj._key, into)  # noqa: SLF001 - its one field


def _build(tpl: Any, client: _Client) -> Any:
    kind = tpl[0]
    if kind == "T":
        return _DT._make(client, tpl[1], tpl[2], tpl[3], tpl[4])
    if kind == "V":
        return tpl[1]
    if kind == "O":
        return OpaqueRef._create(_build(tpl[1], client))  # noqa: SLF001
    items = [_build(t, client) for t in tpl[2]]
    make = getattr(tpl[1], "_make", None)  # a namedtuple (psutil's pmem, torch's return types)
    return make(items) if make is not None else tpl[1](items)


def _restride(func: Any, args: Any, kwargs: Any) -> None:
    """An in-place view op (squeeze_, t_...) changes its input's shape: change the
    wrapper's too, as torch's own ``return_and_correct_aliasing`` does."""
    from torch.utils._mode_utils import no_dispatch

    with no_dispatch():
        meta_in_tls = torch._C._meta_in_tls_dispatch_include()  # noqa: SLF001 - torch's
        torch._C._set_meta_in_tls_dispatch_include(True)  # noqa: SLF001 - torch's
        try:
            func(*args, **kwargs)
        finally:
            torch._C._set_meta_in_tls_dispatch_include(meta_in_tls)  # noqa: SLF001 - torch's


def call_function(client: _Client, fn: Any, shape_fn: Any, args: Any, kwargs: Any) -> Any:
    """Record a user function (``@remote``) to run on every shard."""
    walk = _Walk(client)
    wargs = walk.wire(args)
    wkwargs = {k: walk.wire(v) for k, v in kwargs.items()}
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), torch.no_grad(), propagating():
        out = shape_fn(*_meta(args), **{k: _meta(v) for k, v in kwargs.items()})
    result = _build(_template(out), client)
    out_ids: list[int] = []
    _ids(result, out_ids)
    client.issue((CALL, fn, wargs, wkwargs, out_ids, [], issued_at(), 0, client.stream))
    return result


def fetching_call(client: _Client, fn: Any, args: Any, kwargs: Any) -> tuple[Any, ...]:
    """The workers' endpoint and its arguments that run ``fn`` on every worker after the
    commands recorded so far (which it sends), each DTensor argument as that worker's
    shard, and answer with what it returned (Monarch's ``remote(fn).call(...)`` and
    ``send(remote_fn, ...)``)."""
    walk = _Walk(client)
    wargs = walk.wire(args)
    wkwargs = {k: walk.wire(v) for k, v in kwargs.items()}
    client.flush()
    return client.workers.call_function, (fn, wargs, wkwargs), {}


def bind_dtensor() -> None:
    """Set this module's ``DTensor`` (imported late: a top-level import would be circular)."""
    global _DT
    from ._dtensor import DTensor

    _DT = DTensor


_DT: Any = None

"""A simulated accelerator on the CPU: device faults of the decode loop, found without a GPU.

Inside :class:`SimulatedAccelerator` every tensor is either **on the accelerator** or **on
the host**, tracked per tensor, while the data stays on the CPU. The accelerator is the
device ``cpu:0`` (:data:`ACCEL`): torch accepts it wherever a device is named and computes
on the CPU, but it is not equal to ``torch.device("cpu")``, so code that asks a tensor for
its device (``t.device``, answered by the simulation) and code that names none can be told
apart. The rules are the ones CUDA enforces:

- ``place(module)`` puts a module's parameters and buffers on the accelerator (as
  ``module.to("cuda")`` would);
- a factory call (``torch.tensor``, ``zeros``, ``arange``, ``rand``...) makes an
  accelerator tensor only when its ``device=`` names the accelerator; without ``device=``
  it makes a host tensor, as torch does on a CUDA machine;
- ``t.to(ACCEL)`` / ``t.to(other)`` moves to that device, ``t.cpu()`` to the host; any other
  op's result is where its inputs are;
- an op whose tensor inputs are on both devices raises :class:`DeviceMismatch` (host 0-dim
  tensors may meet accelerator tensors, as CPU scalars may on CUDA; indexing with host
  indices and copies between devices are allowed);
- ``torch.Generator`` is replaced by one that remembers its ``device=``; a random op
  whose generator is on another device than its result raises.

Tensors created before the mode was entered are host tensors unless ``place``d.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

ACCEL = torch.device("cpu", 0)
HOST = torch.device("cpu")
_TAG = "_sim_accelerator"

_FACTORIES = {
    torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.empty, torch.full,
    torch.arange, torch.rand, torch.randn, torch.randint, torch.randperm, torch.eye,
    torch.linspace, torch.logspace, torch.empty_strided, torch.from_numpy,
    torch.scalar_tensor, torch.tril_indices, torch.triu_indices,
}
_RANDOM = {torch.rand, torch.randn, torch.randint, torch.randperm, torch.multinomial,
           torch.Tensor.multinomial, torch.bernoulli, torch.normal, torch.Tensor.uniform_,
           torch.Tensor.normal_, torch.Tensor.exponential_, torch.Tensor.random_}
# ops that may take tensors on both devices (copies and host-side indices)
_CROSSING = {torch.Tensor.to, torch.Tensor.copy_, torch.Tensor.__setitem__,
             torch.Tensor.__getitem__, torch.Tensor.cpu,
             torch._has_compatible_shallow_copy_type}  # the last: a metadata query
_DESCRIPTORS = torch._C.TensorBase.__dict__


class DeviceMismatch(AssertionError):
    """An op met tensors on both devices (CUDA would raise here)."""


def on_accel(t: torch.Tensor) -> bool:
    return bool(getattr(t, _TAG, False))


def _tag(t: torch.Tensor, accel: bool) -> None:
    setattr(t, _TAG, accel)


def place(module: torch.nn.Module, accel: bool = True) -> torch.nn.Module:
    """``module`` on the simulated accelerator (``accel=False``: back on the host); its
    data stays where it is."""
    for t in [*module.parameters(), *module.buffers()]:
        _tag(t, accel)
    return module


def _is_accel(device) -> bool:
    if device is None:
        return False
    if isinstance(device, int):
        return False
    return torch.device(device) == ACCEL


class SimGenerator(torch.Generator):
    """A CPU generator that says it is on the device it was made for."""

    def __init__(self, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.sim_accel = _is_accel(device)

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return ACCEL if self.sim_accel else HOST


def _tensors(obj, out: list[torch.Tensor]) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _tensors(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _tensors(x, out)
    return out


def _name(func) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)


class SimulatedAccelerator(TorchFunctionMode):
    """Enter to run code as if ``place``d modules lived on an accelerator; see the module doc."""

    def __init__(self) -> None:
        super().__init__()
        self.checked_ops = 0  # ops that met an accelerator tensor (the check ran on them)
        self._saved_generator = None

    def __enter__(self):
        self._saved_generator = torch.Generator
        torch.Generator = SimGenerator  # type: ignore[misc]
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Generator = self._saved_generator  # type: ignore[misc]
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        owner = getattr(func, "__self__", None)
        if owner is _DESCRIPTORS["device"]:  # t.device
            return ACCEL if on_accel(args[0]) else HOST
        if isinstance(owner, type(_DESCRIPTORS["data"])) and func.__name__ == "__set__":
            func(*args, **kwargs)  # an attribute set: p.data = t moves p where t is
            if owner is _DESCRIPTORS["data"]:
                _tag(args[0], on_accel(args[1]))
            return None
        accel = self._placement(func, args, kwargs)
        self._check_generator(func, kwargs, accel, args)
        out = func(*args, **kwargs)
        for t in _tensors(out, []):
            _tag(t, accel)
        return out

    def _placement(self, func, args, kwargs) -> bool:
        """Whether ``func``'s result is on the accelerator; raises on mixed inputs."""
        if func is torch.Tensor.cpu:
            return False
        if func is torch.Tensor.to:
            return self._to_target(args, kwargs)
        if "device" in kwargs and kwargs["device"] is not None:
            return _is_accel(kwargs["device"])
        if func in _FACTORIES:
            return False
        inputs = _tensors(args, []) + _tensors(kwargs, [])
        accel = [t for t in inputs if on_accel(t)]
        if not accel:
            return False
        self.checked_ops += 1
        if func in _CROSSING:
            return on_accel(inputs[0])
        host = [t for t in inputs if not on_accel(t) and t.dim() > 0]
        if host:
            shapes = ", ".join(f"{'accelerator' if on_accel(t) else 'host'}{tuple(t.shape)}"
                               for t in inputs)
            raise DeviceMismatch(f"{_name(func)} got tensors on the host and on the "
                                 f"accelerator: {shapes}")
        return True

    @staticmethod
    def _to_target(args, kwargs) -> bool:
        self_t, rest = args[0], list(args[1:])
        for x in [*rest, kwargs.get("device"), kwargs.get("other")]:
            if isinstance(x, torch.Tensor):
                return on_accel(x)
            if isinstance(x, (torch.device, str)):
                try:
                    return _is_accel(x)
                except RuntimeError:  # a string that is not a device
                    continue
        return on_accel(self_t)  # only a dtype: stays where it is

    @staticmethod
    def _check_generator(func, kwargs, accel: bool, args) -> None:
        gen = kwargs.get("generator")
        if func not in _RANDOM or gen is None:
            return
        gen_accel = bool(getattr(gen, "sim_accel", False))
        if gen_accel != accel:
            where = "accelerator" if gen_accel else "host"
            raise DeviceMismatch(f"{_name(func)}: a generator on the {where} for a tensor on "
                                 f"the {'accelerator' if accel else 'host'}")

"""Int8 linear layers: a loaded model's ``nn.Linear`` modules replaced by int8 matmuls through oneDNN.

Weights are int8 with one scale per output channel, prepacked once for oneDNN. Activations are
quantized per row, each token with its own scale (symmetric, round(x / s) with s = max|x| / 127,
shifted by 128 into uint8 with zero point 128); the kernel runs at activation scale 1.0 and each
output row is then multiplied by its own scale. oneDNN's int8 matmul takes one activation scale a
call, and a shared scale would make a token's integers depend on the other rows in the pass; per
row, a token gets the same integers and the same int32 sums in a tree pass as in a one-token pass,
so the verifier stays lossless against the quantized model's own one-token loop. (A signed int8
activation with zero point 0 sends a one-row call down a slow oneDNN path; uint8 does not.)

Norms, attention, embeddings and the rest stay in the model's floating dtype. The kernels are
torch's (``torch.ops.onednn.qlinear_prepack`` / ``qlinear_pointwise``); they need a CPU with int8
dot products as torch detects them (:data:`INT8_DOT_PRODUCTS`: AVX-512 VNNI or AMX): without them
oneDNN's u8 x s8 products on AVX2 saturate in 16 bits and the sums are no longer exact, so such a
CPU is refused (:func:`cpu_refusal`; an AVX2-only EPYC, say), as is a torch build without the ops
and any device but the CPU. AVX-VNNI alone (no AVX-512) is refused too: torch.cpu does not detect
it, and it has not been checked here.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

__all__ = ["INT8_DOT_PRODUCTS", "QUANTIZATIONS", "Int8Linear", "QuantizeError", "check", "cpu_refusal",
           "int8_dot_products", "quantize", "quantized"]

QUANTIZATIONS = ("int8",)
ZERO_POINT = 128  # uint8 activations: a signed value v is stored as v + 128
LEVELS = 127  # symmetric: -127..127 for weights and activations alike
# the instruction sets whose int8 dot products (exact int32 sums) the int8 kernels need, one of them, as
# /proc/cpuinfo names them: torch.cpu detects these two (_is_vnni_supported, _is_amx_tile_supported)
INT8_DOT_PRODUCTS = ("avx512_vnni", "amx_tile")


class QuantizeError(ValueError):
    """A model cannot be quantized here; the message is one line naming what is missing."""


def check(kind: str, device: str | torch.device = "cpu") -> None:
    """Raise :class:`QuantizeError` unless ``kind`` can run on ``device`` with this torch build and CPU."""
    if kind not in QUANTIZATIONS:
        raise QuantizeError(f"unknown quantization {kind!r}; known: {', '.join(QUANTIZATIONS)}")
    if torch.device(device).type != "cpu":
        raise QuantizeError(f"--quantize int8 runs on the CPU (oneDNN's int8 kernels), not on {device}")
    onednn = getattr(torch.ops, "onednn", None)
    if not torch.backends.mkldnn.is_available() or not all(
            hasattr(onednn, op) for op in ("qlinear_prepack", "qlinear_pointwise")):
        raise QuantizeError(f"--quantize int8 needs torch's oneDNN int8 ops (torch.ops.onednn.qlinear_pointwise); "
                            f"this torch {torch.__version__} build has none")
    refused = cpu_refusal()
    if refused:
        raise QuantizeError(refused)


def int8_dot_products() -> frozenset[str]:
    """The :data:`INT8_DOT_PRODUCTS` this CPU has, as torch detects them (its cpuinfo library, what oneDNN runs on)."""
    detected = {"avx512_vnni": torch.cpu._is_vnni_supported(), "amx_tile": torch.cpu._is_amx_tile_supported()}
    return frozenset(flag for flag, present in detected.items() if present)


def cpu_refusal(flags: Iterable[str] | None = None) -> str | None:
    """The one-line refusal of a CPU without int8 dot products, None where int8 runs: ``flags`` are a CPU's
    instruction sets as /proc/cpuinfo names them (``goose.cpu.cpu_flags(path)``), default this CPU's as torch
    detects them (:func:`int8_dot_products`)."""
    have = int8_dot_products() if flags is None else frozenset(flags)
    if have & frozenset(INT8_DOT_PRODUCTS):
        return None
    return ("--quantize int8 needs a CPU with int8 dot products (AVX-512 VNNI or AMX: "
            f"{' or '.join(INT8_DOT_PRODUCTS)}); this one has neither (oneDNN's int8 sums on AVX2 saturate: not exact)")


class Int8Linear(nn.Module):
    """``nn.Linear``'s job in int8: per-channel int8 weights, per-row uint8 activations, oneDNN's kernel.

    Built from a float ``nn.Linear`` (its weights are read once and dropped). Inference only: the
    packed weights are not parameters, so neither ``state_dict`` nor ``.to()`` sees them.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()
        scales = weight.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / LEVELS
        integers = torch.round(weight / scales[:, None]).clamp_(-LEVELS, LEVELS).to(torch.int8)
        self.packed = torch.ops.onednn.qlinear_prepack(integers, None)
        self.scales = scales
        self.zero_points = torch.zeros(self.out_features, dtype=torch.int64)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()
        row_scales = rows.abs().amax(dim=1, keepdim=True).clamp_min_(torch.finfo(torch.float32).tiny) / LEVELS
        integers = torch.round(rows / row_scales).add_(ZERO_POINT).to(torch.uint8)
        sums = torch.ops.onednn.qlinear_pointwise(integers, 1.0, ZERO_POINT, self.packed, self.scales,
                                                  self.zero_points, None, 1.0, 0, torch.float32, "none", [], "")
        out = sums.mul_(row_scales) if self.bias is None else torch.addcmul(self.bias.float(), sums, row_scales)
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, int8"


def quantize(model: nn.Module, kind: str = "int8") -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (the output layer too) by an :class:`Int8Linear`, in place.

    The float weights each module held are freed as it is replaced. A tied output layer gets its own
    int8 copy; the input embedding stays a float table lookup. Returns ``model``.
    """
    check(kind, next(model.parameters()).device)
    names = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, Int8Linear(getattr(parent, child)))
    return model


def quantized(model: nn.Module) -> str | None:
    """``"int8"`` when ``model``'s linear layers run through :class:`Int8Linear`, else None."""
    return "int8" if any(isinstance(module, Int8Linear) for module in model.modules()) else None

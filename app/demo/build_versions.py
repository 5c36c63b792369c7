"""Build the demo's model versions through the builder into the registry (once)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from graylane.builder.build import run_build
from graylane.builder.spec import parse_spec
from graylane.registry import ModelNotRegistered, UnknownVersion, open_registry
from graylane.settings import Settings

__all__ = ["build_versions"]


def build_versions(
    settings: Settings,
    model: str,
    seeds: Mapping[str, int],
    *,
    size: str,
    precisions: tuple[str, ...] = ("fp32", "int8-dynamic"),
    progress: Callable[[str], None] = print,
    kv_cache: bool = False,
) -> None:
    """Build each version unless the registry already has its artifacts.

    ``kv_cache``: the demo GPT's decoder-with-past export (a generative model served
    by continuous batching)."""
    registry = open_registry(settings.db_url)
    for version, seed in seeds.items():
        try:
            if registry.list_artifacts(model, version):
                progress(f"    {model} {version}: already built")
                continue
        except (ModelNotRegistered, UnknownVersion):
            pass
        spec = parse_spec(
            {
                "model": model,
                "version": version,
                "strategy": "demo",
                "source": {"demo": size, "seed": seed, "kv_cache": kv_cache},
                "precisions": list(precisions),
                # Synthetic demo text, kept small so the demo starts fast; real builds
                # calibrate on >= 500 captured requests (graylane calib capture).
                "calibration": {
                    "generator": "demo-text",
                    "samples": 16,
                    "seq_len": 32,
                    "min_samples": 16,
                },
                # The demo's QoS ladder steps down to int8 knowingly under load, so it
                # accepts the degraded rungs of an untrained model (top-1 ~0.96-0.98);
                # real builds keep the 1 % default and partial quantization.
                "tolerances": {
                    "int8": {"min_top1_agreement": 0.95},
                    "int8-dynamic": {"min_top1_agreement": 0.95},
                },
                "validation": {
                    "generator": "demo-text",
                    "samples": 8,
                    "seed": 1,
                    "seq_len": 32,
                    "generation": {"prompts": 2, "new_tokens": 4},
                },
            },
            Path.cwd(),
        )
        report = run_build(
            spec, store=settings.artifact_dir, registry=registry, signing_key=settings.signing_key
        )
        servable = [v for v in report.variants if v.servable]
        progress(
            f"    {model} {version}: built {len(servable)} servable variant(s) "
            f"in {report.duration_s:.1f}s"
        )


SMOLLM2_SPEC = Path(__file__).resolve().parents[2] / "builder" / "examples" / "smollm2-gguf.yaml"
"""The builder's SmolLM2 example: the GGUF imported into ONNX, with weight-only rungs."""


def build_smollm2_onnx(
    settings: Settings,
    model: str,
    version: str,
    precisions: tuple[str, ...],
    *,
    gguf: Path,
    progress: Callable[[str], None] = print,
) -> None:
    """SmolLM2-135M-Instruct imported from ``gguf`` into ONNX by the builder, with the
    weight-only ``precisions`` of :data:`SMOLLM2_SPEC`, registered as ``model``/``version``;
    skipped when the registry already has its artifacts (the import itself is cached in
    the artifact store's source cache: a rebuild does not convert again)."""
    import yaml
    from rich.console import Console

    from graylane.builder.progress import RichProgress

    registry = open_registry(settings.db_url)
    try:
        if registry.list_artifacts(model, version):
            progress(f"    {model} {version}: already built")
            return
    except (ModelNotRegistered, UnknownVersion):
        pass
    data = yaml.safe_load(SMOLLM2_SPEC.read_text(encoding="utf-8"))
    data.update(
        model=model,
        version=version,
        precisions=list(precisions),
        source={"gguf": str(gguf)},
    )
    # a rung outside its tolerance is searched briefly here, not for the example's 15 min
    data["partial_quantization"] = {**data.get("partial_quantization", {}), "max_trials": 2}
    spec = parse_spec(data, SMOLLM2_SPEC.parent)
    report = run_build(
        spec,
        RichProgress(Console()),
        store=settings.artifact_dir,
        registry=registry,
        signing_key=settings.signing_key,
    )
    servable = [v.precision.value for v in report.variants if v.servable]
    progress(f"    {model} {version}: built {', '.join(servable)} in {report.duration_s:.1f}s")

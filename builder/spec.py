"""Build specs: what to build from which ONNX file, read from YAML or TOML.

A spec names the source model, its semantic version, the precision variants to
produce, the input shape profiles, the calibration and validation data, the
tolerances each variant must meet against the fp32 reference, and where the
artifacts go. :func:`load_spec` reads a file; :func:`parse_spec` turns an already
decoded mapping into a :class:`BuildSpec` and is free of I/O. Paths in a spec are
relative to the spec file's folder.

This module is the public surface; the types live in ``spec_types``, the reading and
parsing in ``spec_reader``, the typed field readers in ``spec_fields``.
"""

from __future__ import annotations

from graylane.artifacts.naming import Precision
from graylane.builder.spec_fields import SpecError
from graylane.builder.spec_reader import load_spec, parse_spec
from graylane.builder.spec_types import (
    DEFAULT_MIN_CALIBRATION_SAMPLES,
    DEFAULT_QUANTIZE_OPS,
    INT8_MIN_TOP1,
    BuildSpec,
    DataSpec,
    DemoSource,
    FileSource,
    GenerationCheck,
    Generator,
    GeneratorData,
    NpzData,
    PartialQuantizationSpec,
    TensorRTOptions,
    default_tolerances,
)

__all__ = [
    "DEFAULT_MIN_CALIBRATION_SAMPLES",
    "DEFAULT_QUANTIZE_OPS",
    "INT8_MIN_TOP1",
    "BuildSpec",
    "DataSpec",
    "DemoSource",
    "FileSource",
    "GenerationCheck",
    "Generator",
    "GeneratorData",
    "NpzData",
    "PartialQuantizationSpec",
    "Precision",
    "SpecError",
    "TensorRTOptions",
    "default_tolerances",
    "load_spec",
    "parse_spec",
]

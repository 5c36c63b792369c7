#!/usr/bin/env bash
# GPU path check, for a host with an NVIDIA GPU and TensorRT (CI does not run it).
#
#   1. builds TensorRT engines of the tiny demo GPT through the real builder path
#      (run_build -> compile_engines -> builder/tensorrt_build.build_engine),
#   2. compares each engine with its ONNX variant through Polygraphy,
#   3. runs the GPU tests (pytest -m gpu, and the TensorRT test files in full),
#   4. prints a one-line JSON summary as its last line.
#
# Exit status: 0 all passed, 1 something failed, 2 no NVIDIA GPU or no TensorRT here.
# PYTHON overrides the interpreter (default: .venv/bin/python, else python3).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi

skip() {
  echo "gpu-check: $1; nothing was run (this script needs an NVIDIA GPU and TensorRT)" >&2
  printf '{"ok": false, "skipped": true, "reason": "%s"}\n' "$1"
  exit 2
}

command -v nvidia-smi >/dev/null 2>&1 || skip "no nvidia-smi on PATH: no NVIDIA GPU or driver"
GPU="$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | head -n 1)"
[ -n "$GPU" ] || skip "nvidia-smi lists no GPU"
TRT="$("$PY" -c 'import tensorrt; print(tensorrt.__version__)' 2>/dev/null)" \
  || skip "the Python package tensorrt cannot be imported by $PY"
echo "gpu-check: $GPU, TensorRT $TRT" >&2

WORK="$(mktemp -d -t gpu-check.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

echo "==> engines through build_engine, compared with their ONNX variants (Polygraphy)" >&2
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PY" scripts/gpu_check.py "$WORK/build.json" >&2
build_rc=$?

echo "==> GPU tests" >&2
"$PY" -m pytest -q -p no:cacheprovider -m gpu --junitxml="$WORK/gpu.xml" tests >&2
"$PY" -m pytest -q -p no:cacheprovider --junitxml="$WORK/trt.xml" \
  tests/unit/test_tensorrt_engine.py tests/unit/test_builder_tensorrt.py >&2

"$PY" - "$WORK" "$build_rc" "$GPU" "$TRT" <<'PYEOF'
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path

work, build_rc, gpu, trt = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]

def counts(name):
    path = work / name
    if not path.is_file():
        return {"passed": 0, "failed": 1, "skipped": 0, "error": "no report"}
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    total, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
    failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    return {"passed": total - skipped - failed, "failed": failed, "skipped": skipped}

build_file = work / "build.json"
build = json.loads(build_file.read_text()) if build_file.is_file() else {"ok": False}
gpu_tests, trt_tests = counts("gpu.xml"), counts("trt.xml")
ok = (
    build_rc == 0 and build.get("ok") is True
    and gpu_tests["failed"] == 0 and gpu_tests["passed"] > 0 and gpu_tests["skipped"] == 0
    and trt_tests["failed"] == 0
)
name, _, cc = gpu.rpartition(",")
summary = {
    "ok": ok, "gpu": name.strip(), "compute_capability": cc.strip(), "tensorrt": trt,
    "engines": build.get("engines"), "polygraphy": build.get("polygraphy"),
    "gpu_tests": gpu_tests, "tensorrt_tests": trt_tests,
}
print(json.dumps(summary, separators=(",", ":")))
sys.exit(0 if ok else 1)
PYEOF

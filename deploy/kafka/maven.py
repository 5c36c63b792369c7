"""Download the broker jars once from Maven Central into the shared cache (`mvn` needed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from graylane.deploy.kafka.layout import (
    DOWNLOADED_RE,
    KAFKA_ARTIFACT,
    KAFKA_VERSION,
    LOG4J_VERSION,
    MARKER_NAME,
    POM_FILE,
    SCALA_VERSION,
    KafkaLocalError,
    cache_dir,
    file_lock,
    libs_dir,
    say,
)

__all__ = ["fetch", "is_fetched"]


def _which_mvn() -> str:
    mvn = os.environ.get("MVN") or shutil.which("mvn")
    if not mvn:
        raise KafkaLocalError(
            "Maven (`mvn`) is needed once to download the Kafka jars from Maven Central; "
            "install it (Debian: apt-get install -y maven) or set MVN=/path/to/mvn"
        )
    return mvn


def _read_marker() -> dict[str, object] | None:
    marker = cache_dir() / MARKER_NAME
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_fetched() -> bool:
    """True when the completion marker matches the pinned versions and every jar is there."""
    marker = _read_marker()
    if not marker or marker.get("kafka") != KAFKA_VERSION or marker.get("log4j") != LOG4J_VERSION:
        return False
    jars = marker.get("jars")
    if not isinstance(jars, list) or not jars:
        return False
    libs = libs_dir()
    return all((libs / str(j)).is_file() and (libs / str(j)).stat().st_size > 0 for j in jars)


def fetch(force: bool = False) -> Path:
    """Download kafka_2.13 + runtime deps + Log4j 2 binding into the cache; returns libs dir.

    Idempotent: returns at once when the completion marker lists jars that are all present.
    """
    if not force and is_fetched():
        return libs_dir()
    cache = cache_dir()
    with file_lock(cache.parent / f".kafka-{KAFKA_VERSION}.lock"):
        if not force and is_fetched():  # another process finished while we waited
            return libs_dir()
        return _fetch_locked(cache)


def _fetch_locked(cache: Path) -> Path:
    mvn = _which_mvn()
    cache.mkdir(parents=True, exist_ok=True)
    (cache / MARKER_NAME).unlink(missing_ok=True)
    pom = cache / "pom.xml"
    shutil.copyfile(POM_FILE, pom)
    staging = cache / "libs.partial"
    shutil.rmtree(staging, ignore_errors=True)
    say(f"fetch: resolving {KAFKA_ARTIFACT} + log4j {LOG4J_VERSION} from Maven Central")
    say(f"fetch: into {cache / 'libs'}")
    cmd = [
        mvn,
        "-B",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
        f"-Dkafka.version={KAFKA_VERSION}",
        f"-Dlog4j.version={LOG4J_VERSION}",
    ]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=cache,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
    )
    assert proc.stdout is not None
    transcript: list[str] = []
    downloads = 0
    for line in proc.stdout:
        line = line.rstrip("\n")
        transcript.append(line)
        if DOWNLOADED_RE.search(line):
            downloads += 1
            if downloads % 50 == 0:
                say(f"fetch: {downloads} files downloaded so far (Maven plugins + Kafka jars)")
        elif "copy-dependencies" in line and "---" in line:
            say("fetch: running maven-dependency-plugin:copy-dependencies")
    rc = proc.wait()
    if rc != 0:
        tail = "\n".join(transcript[-40:])
        raise KafkaLocalError(f"`{' '.join(cmd)}` failed (exit {rc}):\n{tail}")
    jars = sorted(p.name for p in staging.glob("*.jar"))
    if not any(j.startswith(f"kafka_{SCALA_VERSION}-{KAFKA_VERSION}") for j in jars):
        raise KafkaLocalError(f"Maven finished but kafka_{SCALA_VERSION} is missing in {staging}")
    libs = libs_dir()
    shutil.rmtree(libs, ignore_errors=True)
    staging.rename(libs)
    size = sum((libs / j).stat().st_size for j in jars)
    marker = {
        "kafka": KAFKA_VERSION,
        "scala": SCALA_VERSION,
        "log4j": LOG4J_VERSION,
        "jars": jars,
        "bytes": size,
        "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    tmp = cache / (MARKER_NAME + ".tmp")
    tmp.write_text(json.dumps(marker, indent=2) + "\n")
    tmp.rename(cache / MARKER_NAME)
    say(
        f"fetch: {len(jars)} jars, {size / 1e6:.1f} MB in {time.monotonic() - t0:.1f} s "
        f"({downloads} files downloaded)"
    )
    return libs

"""deploy/containers/engine_images: which of llama-server's shared libraries the image
carries (``ldd``'s answer, the C library's own left to the base) and where the set-up's
cache is read."""

from __future__ import annotations

from pathlib import Path

import pytest

from graylane.deploy.containers.engine_images import linked_libraries, llamacpp_cache
from graylane.deploy.containers.podman import ContainerToolError
from graylane.deploy.engines.layout import LLAMA_CPP_VERSION

LDD = """\
\tlinux-vdso.so.1 (0x00007ffd5b9e4000)
\tlibllama.so => /opt/llama/build/bin/libllama.so (0x00007f1c2a000000)
\tlibgomp.so.1 => /lib/x86_64-linux-gnu/libgomp.so.1 (0x00007f994bbb8000)
\tlibstdc++.so.6 => /lib/x86_64-linux-gnu/libstdc++.so.6 (0x00007f994b800000)
\tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x00007f994bad8000)
\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f994c892000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f994b61e000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f994c8c5000)
"""


def test_the_image_carries_every_library_but_the_c_librarys() -> None:
    assert linked_libraries(LDD) == {
        "libllama.so": Path("/opt/llama/build/bin/libllama.so"),
        "libgomp.so.1": Path("/lib/x86_64-linux-gnu/libgomp.so.1"),
        "libstdc++.so.6": Path("/lib/x86_64-linux-gnu/libstdc++.so.6"),
        "libgcc_s.so.1": Path("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
    }
    assert linked_libraries("\tstatically linked\n") == {}


def test_a_library_ldd_cannot_find_stops_the_build() -> None:
    with pytest.raises(ContainerToolError, match=r"libggml\.so"):
        linked_libraries(LDD + "\tlibggml.so => not found\n")


def test_the_cache_is_read_where_the_set_up_writes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRAYLANE_CACHE_DIR", str(tmp_path))
    cache = llamacpp_cache()
    assert cache.server == tmp_path / f"llama.cpp-{LLAMA_CPP_VERSION}" / "bin" / "llama-server"
    assert cache.model("q4_1") == (
        tmp_path / "models" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    monkeypatch.delenv("GRAYLANE_CACHE_DIR")
    assert llamacpp_cache().bin_dir.is_relative_to(Path.home() / ".cache" / "graylane")

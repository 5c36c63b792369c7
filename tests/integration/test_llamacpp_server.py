"""A real ``llama-server`` (built by the project, cached) on the real SmolLM2-135M GGUF,
started and broken through :class:`LlamaServer`: the endpoints Graylane's clients probe and
read, a greedy answer in English, and a kill followed by a restart on the same port."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support.llamacpp import StartLlamaServer

# Without "Answer in one word." this model's Q4_1 (and Q8_0) greedy answer is "L'Étoile, la
# Marseillaise, ..."; with it every rung answers "The capital of France is Paris." (or more).
CAPITAL = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


def _chat(url: str, messages: list[dict[str, str]], max_tokens: int = 32) -> str:
    resp = httpx.post(
        f"{url}/v1/chat/completions",
        json={"messages": messages, "max_tokens": max_tokens, "temperature": 0},
        timeout=60,
    )
    resp.raise_for_status()
    content = resp.json()["choices"][0]["message"]["content"]
    assert isinstance(content, str)
    return content


def test_llama_server_serves_the_model_and_comes_back_after_a_kill(
    smollm2_gguf: Path, start_llama_server: StartLlamaServer
) -> None:
    server = start_llama_server(smollm2_gguf, threads=2, slots=4, ctx=4096)
    url = server.url
    assert url.startswith("http://127.0.0.1:") and server.port > 0

    health = httpx.get(f"{url}/health", timeout=5)
    assert health.status_code == 200 and health.json() == {"status": "ok"}

    models = httpx.get(f"{url}/v1/models", timeout=5).json()
    assert [m["id"] for m in models["data"]] == ["SmolLM2-135M-Instruct.Q4_1"]

    answer = _chat(url, CAPITAL)
    assert "Paris" in answer, answer

    metrics = httpx.get(f"{url}/metrics", timeout=5).text
    assert "llamacpp:requests_processing" in metrics
    assert "llamacpp:tokens_predicted_total" in metrics

    slots = httpx.get(f"{url}/slots", timeout=5).json()
    assert [s["id"] for s in slots] == [0, 1, 2, 3]
    assert all(s["n_ctx"] == 1024 for s in slots)  # -c 4096 shared by -np 4

    port, pid = server.port, server.pid
    server.kill()
    assert not server.is_running()
    try:
        httpx.get(f"{url}/health", timeout=2)
        raise AssertionError("the killed server still answers")
    except httpx.TransportError:
        pass

    assert server.restart() == url
    assert server.port == port and server.pid != pid
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    assert _chat(url, CAPITAL) == answer  # greedy: the same answer again


def _open_stream(port: int, max_tokens: int) -> tuple[http.client.HTTPConnection, int]:
    """A streamed generation, read until its first few tokens came; the open connection
    and how many chunks were read."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = {
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    conn.request(
        "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
    )
    resp = conn.getresponse()
    assert resp.status == 200
    chunks = 0
    while chunks < 5:
        line = resp.fp.readline()
        assert line, "the stream ended early"
        chunks += line.startswith(b"data:")
    return conn, chunks


def _busy(url: str) -> list[bool]:
    return [bool(s["is_processing"]) for s in httpx.get(f"{url}/slots", timeout=5).json()]


def test_a_client_that_hangs_up_mid_stream_frees_its_slot_at_once(
    smollm2_gguf: Path, start_llama_server: StartLlamaServer
) -> None:
    server = start_llama_server(smollm2_gguf, threads=2, slots=2, ctx=2048)
    conn, _ = _open_stream(server.port, max_tokens=2000)
    assert _busy(server.url).count(True) == 1
    predicted_before = _metric(server.url, "llamacpp:tokens_predicted_total")

    assert conn.sock is not None
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    hung_up = time.monotonic()
    while any(_busy(server.url)):
        # It notices at its next token's write: a few ms here, never the 2000 tokens asked.
        assert time.monotonic() - hung_up < 5, "the slot still decodes for a client that left"
        time.sleep(0.01)
    assert _metric(server.url, "llamacpp:tokens_predicted_total") < predicted_before + 200


def _metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not in /metrics")


def test_the_lower_rungs_serve_and_still_answer_in_english(
    smollm2_q4_0_gguf: Path, smollm2_q2k_gguf: Path, start_llama_server: StartLlamaServer
) -> None:
    for rung in (smollm2_q4_0_gguf, smollm2_q2k_gguf):
        server = start_llama_server(rung, threads=2, slots=1, ctx=1024)
        assert "The capital of France is Paris" in _chat(server.url, CAPITAL, max_tokens=16)
        server.stop()


_ORPHAN = """
import sys, time
from pathlib import Path
from graylane.deploy.engines.server import LlamaServer
server = LlamaServer(Path(sys.argv[1]), slots=1, ctx=512, log_path=Path(sys.argv[2]))
server.start()
print(server.pid, flush=True)
sys.stdin.readline()  # the test looks at the server first, then lets this process end
if sys.argv[3] == "hang":
    time.sleep(600)
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")  # a zombie waiting for init to reap it runs no more


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while not _gone(pid):
        assert time.monotonic() < deadline, f"llama-server {pid} outlived its parent"
        time.sleep(0.05)


def test_a_server_never_outlives_the_process_that_started_it(
    smollm2_gguf: Path, tmp_path: Path
) -> None:
    root = Path(__file__).resolve().parents[2]
    for ending in ("exit", "hang"):  # interpreter exit without stop(); SIGKILL of the parent
        parent = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _ORPHAN,
                str(smollm2_gguf),
                str(tmp_path / f"{ending}.log"),
                ending,
            ],
            cwd=root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert parent.stdin is not None and parent.stdout is not None
        pid = int(parent.stdout.readline())
        assert not _gone(pid)
        parent.stdin.write("end\n")
        parent.stdin.close()
        if ending == "hang":
            parent.kill()
        parent.wait(timeout=30)
        _wait_gone(pid)

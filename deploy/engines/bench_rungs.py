#!/usr/bin/env python3
"""Decode speed and greedy answers of the model's rungs on this machine.

Usage::

    python deploy/engines/bench_rungs.py   # q4_1 q4_0 q8_0 q3_k_s q2_k, -t 1 and -t 2
    python deploy/engines/bench_rungs.py --rungs q4_1 q2_k --threads 2 --tokens 64

For every rung and thread count it starts one ``llama-server`` (4 slots) and streams
``/v1/chat/completions`` at temperature 0 with ``ignore_eos`` (every call yields exactly
``--tokens`` tokens): one stream alone, then 4 at once. It prints, per case, output tokens/s
(all tokens over the wall time of the round) and the decode rate of one stream (tokens after
the first over the time after the first), then each rung's greedy answers, then one JSON
line. The load generator runs on the same cores as the server: compare rungs with each
other, not with another machine.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from graylane.artifacts.naming import Precision
from graylane.deploy.engines.layout import quant_type, say
from graylane.deploy.engines.llamacpp import model
from graylane.deploy.engines.server import LlamaServer

__all__ = ["Case", "main", "stream_chat"]

PROMPT = "Write a short story about a robot who learns to paint."
QUESTIONS = (
    "What is the capital of France?",
    "What is the capital of France? Answer in one word.",
    "Name three colors of the rainbow.",
    "Why is the sky blue? Answer in one sentence.",
)
DEFAULT_RUNGS = (Precision.Q4_1, Precision.Q4_0, Precision.Q8_0, Precision.Q3_K_S, Precision.Q2_K)


@dataclass(frozen=True)
class Stream:
    tokens: int
    ttft_s: float
    total_s: float

    @property
    def decode_tok_s(self) -> float:
        after_first = self.total_s - self.ttft_s
        return (self.tokens - 1) / after_first if after_first > 0 and self.tokens > 1 else 0.0


@dataclass(frozen=True)
class Case:
    rung: str
    threads: int
    concurrency: int
    output_tok_s: float
    """All output tokens of a round over its wall time (median of the rounds)."""
    decode_tok_s_per_stream: float
    """Median over the streams of tokens after the first over the time after the first."""
    ttft_ms: float
    cpu_ms_per_token: float
    """The server's CPU time per output token (robust to other load on the machine)."""


def stream_chat(url: str, content: str, max_tokens: int, *, ignore_eos: bool) -> tuple[str, Stream]:
    """One streamed greedy chat completion: its text and its timings (a token per chunk)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=300)
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": ignore_eos,
    }
    t0 = time.perf_counter()
    conn.request(
        "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
    )
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    text, tokens, first = [], 0, 0.0
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        for choice in chunk.get("choices", []):
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                tokens += 1
                if tokens == 1:
                    first = time.perf_counter() - t0
                text.append(piece)
    total = time.perf_counter() - t0
    conn.close()
    return "".join(text), Stream(tokens=tokens, ttft_s=first, total_s=total)


def _round(url: str, concurrency: int, max_tokens: int) -> tuple[float, list[Stream]]:
    results: list[Stream] = []
    lock = threading.Lock()

    def one() -> None:
        _, stream = stream_chat(url, PROMPT, max_tokens, ignore_eos=True)
        with lock:
            results.append(stream)

    threads = [threading.Thread(target=one) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return sum(s.tokens for s in results) / wall, results


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (its threads included), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_round(
    server: LlamaServer, concurrency: int, tokens: int
) -> tuple[float, float, list[Stream]]:
    """One round: output tokens/s, server CPU ms per output token, the streams."""
    pid = server.pid or 0
    cpu0 = _cpu_seconds(pid)
    rate, streams = _round(server.url, concurrency, tokens)
    cpu_ms = 1000 * (_cpu_seconds(pid) - cpu0) / max(1, sum(s.tokens for s in streams))
    return rate, cpu_ms, streams


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_rungs.py", description=__doc__.split("\n")[0])
    parser.add_argument("--rungs", nargs="+", default=[p.value for p in DEFAULT_RUNGS])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slots", type=int, default=4)
    args = parser.parse_args(argv)

    rungs = [Precision(name.lower()) for name in args.rungs]
    paths = {p: model(p) for p in rungs}
    cases: list[Case] = []
    answers: dict[str, list[str]] = {}
    say(f"bench: load average before: {os.getloadavg()[0]:.2f}")
    for threads in args.threads:
        # Every rung's server up at once, measured in turn round after round: a load that
        # other processes put on the machine meanwhile falls on all rungs alike.
        servers = {p: LlamaServer(paths[p], threads=threads, slots=args.slots) for p in rungs}
        try:
            for server in servers.values():
                server.start()
                stream_chat(server.url, PROMPT, 8, ignore_eos=True)  # warm-up
            samples: dict[tuple[Precision, int], list[tuple[float, float, list[Stream]]]] = {}
            for r in range(args.rounds):
                for p, server in servers.items():
                    for concurrency in (1, args.slots):
                        got = measure_round(server, concurrency, args.tokens)
                        samples.setdefault((p, concurrency), []).append(got)
                say(
                    f"bench: -t {threads} round {r + 1}/{args.rounds} done "
                    f"(load average {os.getloadavg()[0]:.2f})"
                )
            for (p, concurrency), runs in samples.items():
                streams = [s for _, _, got in runs for s in got]
                case = Case(
                    rung=quant_type(p),
                    threads=threads,
                    concurrency=concurrency,
                    output_tok_s=round(statistics.median(rate for rate, _, _ in runs), 1),
                    decode_tok_s_per_stream=round(
                        statistics.median(s.decode_tok_s for s in streams), 1
                    ),
                    ttft_ms=round(1000 * statistics.median(s.ttft_s for s in streams), 0),
                    cpu_ms_per_token=round(statistics.median(cpu for _, cpu, _ in runs), 1),
                )
                cases.append(case)
                say(
                    f"bench: {case.rung:7s} -t {threads} x{concurrency}: "
                    f"{case.output_tok_s:6.1f} tok/s out, "
                    f"{case.decode_tok_s_per_stream:6.1f} tok/s per stream, "
                    f"TTFT {case.ttft_ms:.0f} ms, {case.cpu_ms_per_token:.1f} CPU ms/token"
                )
            if threads == args.threads[-1]:
                for p, server in servers.items():
                    answers[quant_type(p)] = [
                        stream_chat(server.url, q, 48, ignore_eos=False)[0].strip()
                        for q in QUESTIONS
                    ]
        finally:
            for server in servers.values():
                server.stop()

    print()
    header = "".join(f"  -t{t} x1  -t{t} x{args.slots}" for t in args.threads)
    print(f"{'rung':8s} {'MB':>6s}{header}   (output tokens/s, median of {args.rounds} rounds)")
    for p in rungs:
        row = [c for t in args.threads for c in cases if c.rung == quant_type(p) and c.threads == t]
        cells = "".join(f"  {c.output_tok_s:7.1f}" for c in row)
        print(f"{quant_type(p):8s} {paths[p].stat().st_size / 1e6:6.1f}{cells}")
    print()
    for label, texts in answers.items():
        for q, a in zip(QUESTIONS, texts, strict=True):
            print(f"{label:7s} {q!r}: {a!r}")
    print(json.dumps({"cases": [asdict(c) for c in cases], "answers": answers}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

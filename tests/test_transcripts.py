"""The HTTP transcripts users read (docs/http.md "Transcript", README's trimmed copy) are
what examples/fastapi_app.py answers: each ``curl`` of the transcript is sent to the
running example and its status, headers and body compared with the text."""

from __future__ import annotations

import asyncio
import re
import shlex
from pathlib import Path

import httpx
from test_examples_http import running

ROOT = Path(__file__).resolve().parent.parent
# Vary with the moment and the server: never compared.
_VARYING = {"date", "server"}


def _console(text: str, heading: str) -> str:
    section = text[text.index(heading) :]
    return section[section.index("```console") + len("```console") : section.index("\n```\n")]


def _exchanges(block: str) -> list[tuple[str, list[str]]]:
    """The transcript's commands, each with the lines it printed."""
    exchanges: list[tuple[str, list[str]]] = []
    for line in block.strip("\n").splitlines():
        if line.startswith("$ "):
            exchanges.append((line[2:], []))
        elif exchanges:
            exchanges[-1][1].append(line)
    return exchanges


def _request(command: str, base: str) -> tuple[dict[str, object], bool]:
    words = shlex.split(command.split("  #")[0])
    background = words[-1] == "&"
    words = words[:-1] if background else words
    method, url, headers, body = "GET", "", {}, None
    i = 1
    while i < len(words):
        word = words[i]
        if word in ("-X",):
            method, i = words[i + 1], i + 2
        elif word == "-H":
            name, _, value = words[i + 1].partition(": ")
            headers[name] = value
            i += 2
        elif word == "-d":
            body, i = words[i + 1], i + 2
        elif word in ("-o",):
            i += 2
        elif word.startswith("-"):
            i += 1
        else:
            url, i = word.replace("http://127.0.0.1:8000", base), i + 1
    return {"method": method, "url": url, "headers": headers, "content": body}, background


def _printed(response: httpx.Response) -> list[str]:
    status = f"HTTP/1.1 {response.status_code} {response.reason_phrase}"
    headers = [f"{k}: {v}" for k, v in response.headers.multi_items()]
    return [status, *headers, "", response.text, ""]


def _agree(expected: list[str], got: list[str]) -> None:
    def significant(lines: list[str]) -> list[str]:
        kept = [line for line in lines if line.split(":")[0].lower() not in _VARYING]
        while kept and not kept[-1]:
            kept.pop()  # the blank line between answers
        return kept

    want, have = significant(expected), significant(got)
    # A 409's Retry-After is the seconds the first request has run so far (at least 1):
    # how far it got when the duplicate arrived depends on the machine, so the number is
    # compared with the one its detail states and held to the rule's bounds (the first
    # request takes 2 s).
    retry = [line for line in have if line.startswith("retry-after: ")]
    if retry:
        seconds = int(retry[0].split(": ")[1])
        assert 1 <= seconds <= 2, retry
        assert f"retry after {seconds} s" in have[-1]
        pattern = re.compile(r"(retry-after: |retry after )\d+")
        want = [pattern.sub(r"\g<1>N", line) for line in want]
        have = [pattern.sub(r"\g<1>N", line) for line in have]
        # content-length follows the number's digits
        want = [re.sub(r"content-length: \d+", "content-length: L", line) for line in want]
        have = [re.sub(r"content-length: \d+", "content-length: L", line) for line in have]
    assert have == want


async def test_the_http_transcript_is_what_the_example_answers() -> None:
    block = _console((ROOT / "docs" / "http.md").read_text(), "## Transcript")
    async with running("fastapi_app.py", {}) as base, httpx.AsyncClient(timeout=20) as client:
        pending: list[asyncio.Task[httpx.Response]] = []
        for command, printed in _exchanges(block):
            request, background = _request(command, base)
            if background:
                pending.append(asyncio.create_task(client.request(**request)))  # type: ignore[arg-type]
                await asyncio.sleep(0.5)  # the first request is running when the next arrives
                continue
            _agree(printed, _printed(await client.request(**request)))  # type: ignore[arg-type]
        for task in pending:
            assert (await task).status_code == 201


def test_the_readme_transcript_is_the_http_transcript_trimmed() -> None:
    full = _exchanges(_console((ROOT / "docs" / "http.md").read_text(), "## Transcript"))
    short = _exchanges(_console((ROOT / "README.md").read_text(), "With `python examples/"))
    answers = [printed for _, printed in full if printed]
    shown = [printed for _, printed in short]
    # README shows the first four answers, each with a subset of their header lines.
    assert len(shown) == 4
    for trimmed, whole in zip(shown, answers, strict=False):
        assert trimmed[0] == whole[0]
        assert set(trimmed) <= set(whole), (trimmed, whole)

"""The live dashboard: one page, served by FastAPI, over the files a run writes.

``agentrl dashboard RUN_DIR [RUN_DIR ...]`` (or ``agentrl train ... dashboard=true``) serves
:func:`make_dashboard`'s app. The page (``page.html``, plain JavaScript, no build step) draws every
metric of ``metrics.jsonl`` with plotly.js, which the ``plotly`` wheel ships and this app serves
itself, so the page needs no network. It stays live through one Server-Sent Events stream for all runs: it sends
the lines appended to each ``metrics.jsonl`` and the sample files that appear (:mod:`.records`).

Routes, all ``GET`` (the app never writes), none taking a path from the request:

====================================  ==============================================================
``/``                                 the page
``/static/plotly.min.js``             plotly.js from the ``plotly`` package
``/api/runs``                         the sources: run directories and trajectory JSONL files
``/api/runs/{i}/metrics?offset=N``    the metric records from byte ``N`` on, and the next offset
``/api/stream?offsets=I:N,...``       Server-Sent Events for all runs: new metric records, sample lists
``/api/runs/{i}/config``              ``config.json`` of the run
``/api/runs/{i}/samples``             its sample files: ``[{kind, step}]``
``/api/runs/{i}/samples/{kind}/{n}``  one sample file's trajectories (``kind``: train, train.POLICY, eval)
``/api/runs/{i}/trajectories``        a trajectory JSONL source (``agentrl rollout --out``)
====================================  ==============================================================

Bound to 127.0.0.1 unless told otherwise, and then a token is required: as
``Authorization: Bearer TOKEN`` or as ``?token=TOKEN`` (the page passes on the one in its own
address, since a browser's ``EventSource`` cannot set headers).
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import AsyncIterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response, StreamingResponse

from agentrl.dashboard.records import KIND, finite, read_trajectories, sample_files, token_texts
from agentrl.server.app import AsciiJSONResponse

PUBLIC = frozenset({"/static/plotly.min.js", "/favicon.ico"})
"""Routes served without a token: plotly.js as its wheel ships it, and nothing."""
POLL_SECONDS = 0.5
"""How often the stream looks for new metric lines and sample files."""


class Source:
    """One thing the dashboard shows: a run directory, or a JSONL file of trajectories."""

    def __init__(self, path: str | Path):
        self.path = Path(path).resolve()
        if self.path.is_file() and self.path.suffix == ".jsonl":
            self.kind: Literal["run", "trajectories"] = "trajectories"
        elif self.path.is_dir() or not self.path.exists():  # a run that has not started writing yet
            self.kind = "run"
        else:
            raise ValueError(f"{path} is neither a run directory nor a .jsonl file of trajectories.")
        self.name = self.path.name

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    def metrics(self, offset: int) -> tuple[list[dict[str, Any]], int]:
        """The whole lines of ``metrics.jsonl`` from byte ``offset`` on; the offset after them."""
        if self.kind != "run" or not self.metrics_path.exists():
            return [], offset
        with self.metrics_path.open("rb") as f:
            f.seek(offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line being written is read next time
        records = []
        for line in data[:end].splitlines():
            try:
                records.append(finite(json.loads(line)))
            except ValueError:  # a torn line: skip it rather than stop the page
                continue
        return records, offset + end

    def samples(self) -> list[dict[str, Any]]:
        return [{"kind": kind, "step": step} for kind, step, _ in sample_files(self.path)] if self.kind == "run" else []


def make_dashboard(sources: Sequence[str | Path], *, tokens: Sequence[str] = (), tokenizer: Any = None) -> FastAPI:
    """The dashboard of ``sources`` (run directories or trajectory ``.jsonl`` files).

    ``tokens``: bearer tokens a request must carry (none: any client of the address it binds).
    ``tokenizer``: decodes token ids of trajectory files that were written without ``token_texts``.
    """
    if not sources:
        raise ValueError("The dashboard needs at least one run directory or trajectory file.")
    runs = [Source(s) for s in sources]
    token_list = [t for t in tokens if t]
    page = resources.files("agentrl.dashboard").joinpath("page.html").read_text()

    async def authorized(request: Request) -> None:
        if request.url.path in PUBLIC:  # the page's script tag cannot carry the token
            return
        presented = request.query_params.get("token")
        header = request.headers.get("authorization", "")
        if header.lower().startswith("bearer "):
            presented = header[7:].strip()
        if token_list and (
            presented is None or not sum(hmac.compare_digest(presented.encode(), t.encode()) for t in token_list)
        ):
            raise HTTPException(
                401, "Missing or wrong token: open the address the dashboard printed (it holds ?token=)."
            )

    def run_of(i: int) -> Source:
        if not 0 <= i < len(runs):
            raise HTTPException(404, f"No run {i}; this dashboard shows runs 0 to {len(runs) - 1}.")
        return runs[i]

    app = FastAPI(title="agentrl dashboard", dependencies=[Depends(authorized)])

    @app.get("/", response_class=HTMLResponse)
    async def index() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/static/plotly.min.js")
    async def plotly_js() -> FileResponse:
        return FileResponse(plotly_path(), media_type="application/javascript")

    @app.get("/api/runs")
    async def list_runs() -> list[dict[str, Any]]:
        return [{"id": i, "name": r.name, "kind": r.kind, "path": str(r.path)} for i, r in enumerate(runs)]

    @app.get("/api/runs/{i}/metrics")
    def metrics(i: int, offset: int = 0) -> JSONResponse:
        records, end = run_of(i).metrics(max(offset, 0))
        return AsciiJSONResponse({"records": records, "offset": end})

    @app.get("/api/stream")
    async def stream(request: Request, offsets: str = "") -> StreamingResponse:
        """One stream for every run (a browser holds few connections per server): ``offsets`` is
        ``RUN:BYTE,...``; each event's id is the same list, so a reconnect resumes where it was."""
        position = {i: 0 for i, r in enumerate(runs) if r.kind == "run"}
        for i, start in _offsets(request.headers.get("last-event-id") or offsets).items():
            if i in position:
                position[i] = start
        seen: dict[int, Any] = {}

        async def events() -> AsyncIterator[str]:
            yield "retry: 2000\n\n"
            while not await request.is_disconnected():
                for i in position:
                    records, position[i] = await asyncio.to_thread(runs[i].metrics, position[i])
                    if records:
                        yield _event("metrics", {"run": i, "records": records, "offset": position[i]}, position)
                    samples = await asyncio.to_thread(runs[i].samples)
                    if samples != seen.get(i):
                        seen[i] = samples
                        yield _event("samples", {"run": i, "samples": samples}, position)
                await asyncio.sleep(POLL_SECONDS)

        return StreamingResponse(events(), media_type="text/event-stream", headers={"cache-control": "no-cache"})

    @app.get("/api/runs/{i}/config")
    async def config(i: int) -> JSONResponse:
        path = run_of(i).path / "config.json"
        return AsciiJSONResponse(finite(json.loads(path.read_text())) if path.exists() else {})

    @app.get("/api/runs/{i}/samples")
    async def samples(i: int) -> list[dict[str, Any]]:
        return run_of(i).samples()

    # Plain functions: they read files and decode tokens, which FastAPI then does off the event loop.
    @app.get("/api/runs/{i}/samples/{kind}/{step}")
    def sample(i: int, kind: Annotated[str, PathParam(pattern=KIND.pattern)], step: int) -> JSONResponse:
        found = [p for k, n, p in sample_files(run_of(i).path) if k == kind and n == step]
        if not found:
            raise HTTPException(404, f"Run {i} has no {kind} sample of step {step}.")
        return AsciiJSONResponse(_with_texts(read_trajectories(found[0]), tokenizer))

    @app.get("/api/runs/{i}/trajectories")
    def trajectories(i: int, limit: int = 200) -> JSONResponse:
        run = run_of(i)
        if run.kind != "trajectories":
            raise HTTPException(404, f"Source {i} is a run directory; its trajectories are under /samples.")
        return AsciiJSONResponse(_with_texts(read_trajectories(run.path, min(max(limit, 1), 1000)), tokenizer))

    return app


def plotly_path() -> Path:
    """plotly.js as the ``plotly`` wheel ships it."""
    import plotly  # noqa: PLC0415  (only for its folder)

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.exists():
        raise FileNotFoundError(f"plotly.min.js is not in {path.parent}; reinstall plotly (pip install plotly).")
    return path


def _with_texts(records: list[dict[str, Any]], tokenizer: Any) -> list[dict[str, Any]]:
    for record in records:
        if not record.get("token_texts") and tokenizer is not None:
            record["token_texts"] = token_texts(tokenizer, record.get("token_ids", []))
    return records


def _event(name: str, data: Any, position: dict[int, int]) -> str:
    event_id = ",".join(f"{i}:{n}" for i, n in position.items())
    return f"event: {name}\nid: {event_id}\ndata: {json.dumps(data, default=str, ensure_ascii=True)}\n\n"


def _offsets(text: str) -> dict[int, int]:
    """``"0:123,1:0"`` -> ``{0: 123, 1: 0}``; anything malformed is left out."""
    found = {}
    for part in text.split(","):
        run, _, offset = part.partition(":")
        if run.isdigit() and offset.isdigit():
            found[int(run)] = int(offset)
    return found

"""The live dashboard of a real job: in headless Chromium (through Selenium) the page shows
the actors, their counts and rates moving, a blocked actor's mailbox, its stuck alert and
its stack on click, and a killed proc turning red (checked in screenshots too); and
``danaus dashboard --attach`` serves the same data from another process.

The browser test skips without chromium, chromedriver or selenium
(``scripts/install_browser.sh``, ``pip install selenium``)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import danaus
from danaus import config, dashboard, set_unhandled_fault_hook, this_host
from danaus.actors.seam import actor_process
from danaus.mesh._admin.server import admin_server

from .obs_actors import Busy

pytestmark = pytest.mark.timeout(180)

IDS = ["dashprocs[0].dashbusy[0]", "dashprocs[1].dashbusy[1]"]
HELPER = "<u>helper</u>"
#: the failed colour (--failed in dashboard.html)
RED = "rgba(211, 47, 47, 1)"
#: what the page shows for no figure (an en dash)
NONE = "\u2013"


def _browser_paths() -> tuple[str | None, str | None]:
    """Chromium and its driver: $DANAUS_CHROMIUM / $DANAUS_CHROMEDRIVER, else on PATH."""
    chromium = os.environ.get("DANAUS_CHROMIUM") or next(
        filter(None, map(shutil.which, ["chromium", "chromium-browser", "google-chrome"])), None
    )
    driver = os.environ.get("DANAUS_CHROMEDRIVER") or shutil.which("chromedriver")
    runnable = [p if p and os.access(p, os.X_OK) else None for p in (chromium, driver)]
    return runnable[0], runnable[1]


@pytest.fixture
def browser() -> Iterator[Any]:
    chromium, driver_path = _browser_paths()
    if chromium is None or driver_path is None:
        pytest.skip(
            "needs chromium and chromedriver (scripts/install_browser.sh, or set "
            "DANAUS_CHROMIUM and DANAUS_CHROMEDRIVER)"
        )
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium  # Selenium Manager cannot download here
    for arg in [
        "--headless=new",
        "--no-sandbox",  # root in a container
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
    ]:
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    try:
        yield driver
    finally:
        driver.quit()


class Page:
    """The dashboard in the browser; each look finds its elements afresh (the page redraws
    every second) and waits with a bound."""

    def __init__(self, driver: Any, shots: Path) -> None:
        self.driver = driver
        self.shots = shots

    def wait(self, what: str, cond: Callable[[], Any], timeout: float = 20) -> Any:
        from selenium.common.exceptions import (
            NoSuchElementException,
            StaleElementReferenceException,
        )
        from selenium.webdriver.support.ui import WebDriverWait

        wait = WebDriverWait(
            self.driver,
            timeout,
            poll_frequency=0.2,
            ignored_exceptions=[NoSuchElementException, StaleElementReferenceException],
        )
        try:
            return wait.until(lambda _: cond(), message=what)
        except Exception:
            self.shot("timed-out")
            raise

    def read(self, look: Callable[[], Any]) -> Any:
        """What ``look()`` sees once it sees it (the page may redraw under it)."""
        return self.wait("a look", lambda: (look(),))[0]

    def find(self, css: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, css)

    def text(self, css: str) -> str:
        return str(self.find(css).text)

    def number(self, css: str) -> float:
        """The number shown, -1 for none (a dash)."""
        text = self.text(css)
        return float(text) if text not in ("", NONE) else -1.0

    def figure(self, actor: str, column: str) -> float:
        return self.number(f'tr[data-actor-row="{actor}"] td.{column}')

    def chip(self, actor: str) -> Any:
        return self.find(f'#topology .actor[data-actor="{actor}"]')

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        assert self.driver.save_screenshot(str(path))
        return path


def _pixels(path: Path) -> Any:
    from matplotlib import image

    return image.imread(str(path))[..., :3]  # floats in [0, 1]


def _red(px: Any) -> int:
    return int(((px[..., 0] > 0.7) & (px[..., 1] < 0.3) & (px[..., 2] < 0.3)).sum())


def _green(px: Any) -> int:
    return int(((px[..., 1] > 0.4) & (px[..., 0] < 0.3) & (px[..., 2] < 0.3)).sum())


def _non_trivial(path: Path) -> Any:
    assert path.stat().st_size > 10_000, f"{path} is a near-empty PNG"
    px = _pixels(path)
    assert px.shape[0] > 500 and px.shape[1] > 800, px.shape
    assert px.std() > 0.05, f"{path} is (nearly) one colour"
    return px


async def test_the_page_shows_the_job_live_and_a_killed_proc_turns_red(
    browser: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config, "stuck_warn_after", 1.0)  # the controller's "stuck"
    failed = threading.Event()
    old = set_unhandled_fault_hook(lambda f: failed.set())
    page = Page(browser, tmp_path)
    # the procs report endpoints running over 1 s, with their stacks
    env = {"DANAUS_STUCK_WARN_AFTER": "1", "DANAUS_HEARTBEAT_INTERVAL": "0.25"}
    try:
        async with this_host().spawn_procs(
            per_host={"procs": 2}, name="dashprocs", env=env
        ) as procs:
            busy = await procs.spawn("dashbusy", Busy)
            # releases busy's blocked endpoint; its name is markup, shown as text
            helper = await procs.spawn(HELPER, Busy)
            await busy.ok.call()
            with dashboard(0) as server:
                assert server.url.startswith(f"http://127.0.0.1:{server.port}/")
                await asyncio.to_thread(browser.get, server.url)
                await asyncio.to_thread(
                    page.wait,
                    "the actors shown",
                    lambda: all(page.chip(a).is_displayed() for a in IDS),
                )
                await asyncio.to_thread(
                    page.wait,
                    "the controller named",
                    lambda: page.text("#controller").startswith(f"controller pid {os.getpid()} "),
                )
                await asyncio.to_thread(
                    page.wait,
                    "user text as text, not markup",
                    lambda: (
                        page.text(f'#topology .actor[data-actor="dashprocs[0].{HELPER}[0]"]')
                        == f"dashprocs[0].{HELPER}[0]"
                        and not page.driver.find_elements("css selector", "u")
                    ),
                )
                start = _non_trivial(await asyncio.to_thread(page.shot, "start"))
                assert _green(start) > 1000, "no healthy (green) nodes in the picture"
                await _counts_and_rates_move(page, busy)
                await _a_blocked_actor_is_busy_then_stuck_with_its_stack(page, busy, helper)
                before = _red(_pixels(await asyncio.to_thread(page.shot, "before-kill")))

                os.kill(procs.pids[1], signal.SIGKILL)
                assert await asyncio.to_thread(failed.wait, 30), "the kill was not noticed"
                node = '#topology .proc[data-procs="dashprocs"][data-rank="1"]'
                await asyncio.to_thread(
                    page.wait,
                    "the killed proc red",
                    lambda: "health-failed" in page.find(node).get_attribute("class"),
                )
                await asyncio.to_thread(
                    page.wait,
                    "red, its actor as last seen in red too, the other proc's still green",
                    lambda: (
                        page.find(node).value_of_css_property("background-color") == RED
                        and "health-failed" in page.chip(IDS[1]).get_attribute("class")
                        and "health-idle" in page.chip(IDS[0]).get_attribute("class")
                    ),
                )
                await asyncio.to_thread(
                    page.wait,
                    "the failure's report",
                    lambda: any(
                        "of mesh dashbusy, ranks 1" in card.text and "SIGKILL" in card.text
                        for card in page.driver.find_elements("css selector", "#failures .card")
                    ),
                )
                after = _non_trivial(await asyncio.to_thread(page.shot, "after-kill"))
                assert _red(after) > before + 2000, "the picture shows no new red"
    finally:
        set_unhandled_fault_hook(old)


async def _counts_and_rates_move(page: Page, busy: Any) -> None:
    before = await asyncio.to_thread(page.read, lambda: page.figure(IDS[0], "handled"))
    stop = asyncio.Event()

    async def traffic() -> None:
        while not stop.is_set():
            await busy.ok.call()

    task = asyncio.create_task(traffic())
    try:
        await asyncio.to_thread(
            page.wait,
            "handled counts and rates rising",
            lambda: (
                page.figure(IDS[0], "handled") >= before + 10
                and page.figure(IDS[0], "rate") > 0
                and page.figure(IDS[1], "rate") > 0
                and page.number("#total-rate") > 0
            ),
        )
    finally:
        stop.set()
        await task
    # the actors' total goes on counting
    total = await asyncio.to_thread(page.read, lambda: page.number("#total-handled"))
    await busy.ok.call()
    await asyncio.to_thread(
        page.wait, "the total counting", lambda: page.number("#total-handled") > total
    )


async def _a_blocked_actor_is_busy_then_stuck_with_its_stack(
    page: Page, busy: Any, helper: Any
) -> None:
    blocked = busy.block.call()
    queued = [busy.ok.call() for _ in range(3)]  # they wait in its mailbox
    await asyncio.to_thread(
        page.wait,
        "a mailbox of 3 and a stuck actor",
        lambda: (
            page.figure(IDS[0], "mailbox") >= 3
            and "health-stuck" in page.chip(IDS[0]).get_attribute("class")
        ),
    )
    await asyncio.to_thread(
        page.wait,
        "the mailbox depth on the actor's node",
        lambda: page.text(f'#topology .actor[data-actor="{IDS[0]}"] .mailbox') == "3",
    )
    await asyncio.to_thread(
        page.wait,
        "the stuck alert with its stack",
        lambda: any(
            IDS[0] in card.text and "_gate.wait(60)" in card.text
            for card in page.driver.find_elements("css selector", "#stuck .card.stuck")
        ),
    )

    def click() -> bool:
        page.chip(IDS[0]).click()
        return True

    await asyncio.to_thread(page.wait, "a click", click)
    await asyncio.to_thread(
        page.wait,
        "the clicked actor's stack first",
        lambda: (
            IDS[0] in page.text("#stack .card .head")
            and "_gate.wait(60)" in page.text("#stack .card pre")
            and IDS[0] in page.text("#stack-title")
        ),
    )
    await asyncio.to_thread(page.shot, "stack")
    await helper.release.call()
    assert list((await blocked).values()) == ["released", "released"]
    for q in queued:
        await q


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read()


def _first_event(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "events", timeout=30) as r:
        for line in r:
            if line.startswith(b"data: "):
                return dict(json.loads(line[6:]))
    raise AssertionError("the event stream ended")


async def _printed_url(tool: asyncio.subprocess.Process) -> str:
    assert tool.stdout is not None
    while line := (await tool.stdout.readline()).decode():
        if line.startswith("http://"):
            return line.strip()
    raise AssertionError(f"danaus dashboard exited ({await tool.wait()}) without a URL")


async def test_attach_serves_the_same_data_from_another_process(tmp_path: Path) -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}, name="dashattach") as procs:
        busy = await procs.spawn("dashbusy", Busy)
        await busy.ok.call()
        admin = admin_server(timeout=30)
        assert admin is not None, "the controller started no admin endpoint"
        key_file = tmp_path / "key"
        key_file.write_text(actor_process.job_key().hex())
        tool = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "danaus", "dashboard", "--attach", admin.addr],
            *["--key-file", str(key_file)],
            cwd=Path(danaus.__file__).parent.parent,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(60):
                url = await _printed_url(tool)
            with dashboard(0) as local:

                def look() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
                    status, body = _get(url + "snapshot")
                    assert status == 200, body
                    _, mine = _get(local.url + "snapshot")
                    return json.loads(body), json.loads(mine), _first_event(url)

                theirs, mine, event = await asyncio.to_thread(look)
                for server in [url, local.url]:
                    await asyncio.to_thread(_refusals, server)
        finally:
            if tool.returncode is None:
                tool.terminate()
            async with asyncio.timeout(30):
                _, err = await tool.communicate()
    assert tool.returncode == 0, err

    def ours(snap: dict[str, Any]) -> list[tuple[str, int, str]]:
        return sorted(
            (a["actor"], a["handled_total"], a["health"])
            for a in snap["actors"]
            if a["procs"] == "dashattach"
        )

    assert ours(theirs) == ours(mine) == ours(event) == [("dashattach[0].dashbusy[0]", 1, "idle")]
    assert theirs["controller"]["pid"] == mine["controller"]["pid"] == os.getpid()


def _refusals(url: str) -> None:
    status, body = _get(url + "stacks?procs=dashattach&rank=0")
    assert status == 200 and any(s["thread"] == "MainThread" for s in json.loads(body))
    for path, code in [
        ("no-such-page", 404),
        ("stacks?procs=dashattach&rank=one", 400),
        ("stacks?rank=0", 400),
        ("stacks?procs=dashattach&rank=7", 404),
        ("stacks?procs=no-such-mesh&rank=0", 404),
    ]:
        got, body = _get(url + path)
        assert got == code, (url + path, got, body)
    assert _get(url.rsplit("/", 2)[0] + "/snapshot")[0] == 403  # without the token
    assert _get(url + "snapshot")[0] == 200  # and it goes on serving


@pytest.mark.slow
async def test_the_training_view_shows_a_trainers_plan_and_its_loss_curve(
    browser: Any, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from danaus.parallel import parallelize, plan

    from . import parallel_models as pm

    page = Page(browser, tmp_path)
    batches = [pm.padded_lm_batch(seed=i) for i in range(5)]
    async with this_host().spawn_procs(per_host={"procs": 2}, name="dashtrain") as procs:
        p = await plan(pm.gpt2(), procs, sample=batches[0], pp=2, microbatches=2)
        trainer = parallelize(pm.gpt2(), procs, p, optimizer=pm.adamw)
        losses = await trainer.fit(batches)
        with dashboard(0) as server:
            # the same picture as data, for tools
            event = await asyncio.to_thread(_first_event, server.url)
            # (the controller's other live trainers, from tests before, are shown too)
            mine = trainer.picture()["name"]
            (shown,) = [t for t in event["sections"]["trainers"] if t["name"] == mine]
            assert (shown["state"], shown["steps"], shown["procs"]) == ("ready", 5, "dashtrain")
            assert [h[1] for h in shown["history"]] == losses
            assert [s["ranks"] for s in shown["plan"]["stages"]] == [[0], [1]]
            # and danaus top draws the same trainer in a line of its own
            from danaus.tools._top_model import View
            from danaus.tools._top_render import render

            [line] = [
                ln.text
                for ln in render(event, View(source="x"), 300, 60)
                if ln.text.startswith(mine)
            ]
            assert line.startswith(f"{mine}  ready  pp=2  step 5  loss {losses[-1]:.4g}  ")
            card = f'#training .trainer[data-trainer="{mine}"]'
            await asyncio.to_thread(browser.get, server.url)
            await asyncio.to_thread(
                page.wait,
                "the trainer's plan",
                lambda: (
                    page.find("#training-section").is_displayed()
                    and page.text(f"{card} .head").startswith("pp=2 · 2 microbatches")
                    and "5 steps · estimated" in page.text(f"{card} .muted")
                ),
            )
            rows = page.read(
                lambda: [
                    [td.text for td in tr.find_elements("css selector", "td")]
                    for tr in page.driver.find_elements("css selector", f"{card} tbody tr")
                ]
            )
            first, last = p.stages
            assert [r[:4] for r in rows] == [
                ["0", f"0..{first.last}", "0", "no"],
                ["1", f"{last.first}..{last.last}", "1", "no"],
            ]
            points = page.read(
                lambda: (
                    page.find(f'{card} .chart[data-what="loss"] polyline')
                    .get_attribute("points")
                    .split()
                )
            )
            assert len(points) == 5  # one a step
            ys = [float(pt.split(",")[1]) for pt in points]
            # the loss fell: its last point is drawn lower (larger y) than its first
            assert losses[-1] < losses[0] and ys[-1] > ys[0]
            caption = page.text(f'{card} .chart[data-what="loss"] .caption')
            assert caption.startswith(f"loss: {losses[-1]:.4f} at step 5"), caption
            assert "at step 5" in page.text(f'{card} .chart[data-what="tokens/s"] .caption')
            # the plan drawn, as plan.html() draws it: opened, it shows the estimated
            # schedule (a forward and a backward per microbatch per stage), and stays
            # open through the view's refreshes
            page.read(lambda: page.find(f"{card} details.plan-picture summary").click())

            def drawn() -> list[Any]:
                script = (
                    "const d = document.querySelector(arguments[0] + ' details.plan-picture');"
                    "if (!d || !d.open) return [];"
                    "const r = d.querySelector('.picture').shadowRoot;"
                    "return [...r.querySelectorAll('svg.schedule rect.op')].map("
                    "(b) => [b.getAttribute('data-kind'), b.getBoundingClientRect().width]);"
                )
                return list(page.driver.execute_script(script, card))

            await asyncio.to_thread(page.wait, "the plan picture", lambda: len(drawn()) == 8)
            assert all(w > 0 for _, w in drawn()) and {k for k, _ in drawn()} == {"F", "B"}
            # mark the card drawn now; a refresh draws a new one, with the picture open
            page.driver.execute_script("document.querySelector(arguments[0]).old = 1", card)
            await asyncio.to_thread(
                page.wait,
                "the view refreshed",
                lambda: page.driver.execute_script(
                    "return !document.querySelector(arguments[0]).old", card
                ),
            )
            assert len(drawn()) == 8
            await trainer.stop()
            await asyncio.to_thread(
                page.wait,
                "the trainer shown stopped",
                lambda: page.find(card).get_attribute("data-state") == "stopped",
            )
            await asyncio.to_thread(page.shot, "training")


def test_a_saved_plan_picture_draws_in_the_browser(browser: Any, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from danaus.parallel import Plan, StagePlan

    stages = tuple(
        StagePlan(2 * k, 2 * k + 1, 2**20, t, (k + 2) * 2**20, ranks=(k, k + 2))
        for k, t in enumerate([0.01, 0.02])
    )
    plan = Plan(
        dp=2, pp=2, tp=1, microbatches=4, stages=stages, estimated_step_s=0.1,
        peak_bytes_per_proc=3 * 2**20, memory_per_proc=4 * 2**20, why="measured <here>",
    )  # fmt: skip
    path = tmp_path / "plan.html"
    plan.save_html(path)
    page = Page(browser, tmp_path)
    browser.get(path.as_uri())
    page.wait("the page drawn", lambda: page.text("h1") == "Plan: dp=2 x pp=2, 4 microbatches")
    boxes = browser.find_elements("css selector", "svg.schedule rect.op")
    assert len(boxes) == 2 * 2 * 4
    # drawn, not just present: each box has a size, forwards left of their backwards
    sizes = [(b.get_attribute("data-kind"), b.rect) for b in boxes]
    assert all(r["width"] > 0 and r["height"] > 0 for _, r in sizes)
    first_b = min(r["x"] for k, r in sizes if k == "B")
    first_f = min(r["x"] for k, r in sizes if k == "F")
    assert first_f < first_b
    cells = [td.text for td in browser.find_elements("css selector", "table.grid td")]
    assert cells == ["rank 0", "rank 1", "rank 2", "rank 3"]  # replica by stage
    assert "the stages idle" in page.text("#bubble")
    assert page.text("pre") == "measured <here>"  # text, not markup
    _non_trivial(page.shot("plan"))

"""The status page in Debian's real Chromium (B91-B93), at a phone's width
(390 px) and at 1280 and 1920 px, with 0, 20 and 2,000 actors parked.

The pool is saturated for real: ateapi-sim with one worker that an actor
holds for the whole test, so every other actor is refused with
ResourceExhausted and its request parks; parkload plays Envoy, holding one
ext_proc stream per actor. The truth is what the test holds and what the
simulator answered: a phase counts as reached when the simulator's answer log
shows every held actor refused, and the page's totals must then be exactly
that many. In each phase and at each width the test asserts that nothing
scrolls sideways (the page, and every card) and that the three SVG charts are
there and draw something, and writes a screenshot of the whole page into
its output directory (the paths are printed; `pytest -s` shows them).
"""

import json
import pathlib
import signal
import subprocess
import time
import urllib.request

import pytest

from chromium import Chromium
from conftest import BIN, start, stop, word_after
from envoy_stack import free_port

WIDTHS = (390, 1280, 1920)
PHASES = (0, 20, 2000)
LOT = 2500
# Scripted actors that park once and are served at their retry: parked waits
# that end, for the wait chart.
WARM = [f"demo/warm-{i}" for i in range(5)]
SCRIPT = "".join(f"{a} ResourceExhausted 0s - false no free workers available\n"
                 f"{a} OK 0s 10.0.0.9 true -\n" for a in WARM)
# What the page may weigh however many actors park (B93): its lists are
# bounded, 50 + 50 + 20 rows, 100 recent requests, 300 samples: at its
# largest (the longest names, a full ring; src/admin/status.rs's B93 test)
# 108 KB of JSON and 159 KB of HTML.
MAX_JSON = 128 * 1024
MAX_HTML = 192 * 1024
TIMEOUT = 120

MEASURE = """(() => {
  const charts = ['chart-parked', 'chart-verdicts', 'chart-waits'].map(id => {
    const svg = document.getElementById(id);
    if (!svg) return {id, present: false};
    const box = svg.getBoundingClientRect();
    return {id, present: true, width: box.width, height: box.height,
            grid: svg.querySelectorAll('path.grid').length,
            lines: [...svg.querySelectorAll('path.line')].map(p => p.getTotalLength())};
  });
  const cards = [...document.querySelectorAll('.card')].map(card => ({
    card: card.id || card.querySelector('h2').textContent,
    scrollWidth: card.scrollWidth, clientWidth: card.clientWidth}));
  return {origin: performance.timeOrigin, scrollWidth: document.documentElement.scrollWidth,
          innerWidth: window.innerWidth, cards, charts,
          parked: document.getElementById('parking-active').textContent};
})()"""


def poll(what, check, timeout=TIMEOUT, interval=0.25):
    deadline = time.monotonic() + timeout
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout}s")
        time.sleep(interval)


def fetch(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read()


def parkload(target, *args):
    result = subprocess.run([f"{BIN}/parkload", "--target", target, "--json", "--progress", "0", *args],
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["verdicts"]


def refused(answer_log):
    """The actors the simulator has answered ResourceExhausted."""
    actors = set()
    for line in answer_log.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("code") == "ResourceExhausted":
            actors.add(entry["actor"])
    return actors


@pytest.fixture(scope="module")
def saturated(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("statusz")
    (tmp / "sim.script").write_text(SCRIPT)
    answer_log = tmp / "answers.jsonl"
    answer_log.touch()
    sim, line = start([f"{BIN}/ateapi-sim", "--listen", "127.0.0.1:0", "--workers", "1", "--actors", "2100",
                       "--idle-suspend", "1h", "--restore-latency", "50ms", "--script", str(tmp / "sim.script"),
                       "--answer-log", str(answer_log)], "listening on")
    router = None
    holders = []
    try:
        for _ in range(3):  # another process may take the free port first
            argv = [f"{BIN}/atenet-router", "serve", "--ateapi-insecure", "--ateapi-address",
                    word_after(line, "listening on "), "--port-extproc", "0",
                    "--metrics-listen-addr", "127.0.0.1:0", "--status-port", str(free_port()),
                    "--drain-delay", "0s", "--envoy-admin-address", "", "--drain-complete-file", "",
                    "--parked-request-max", str(LOT), "--parked-request-budget", "10m",
                    # Few ResumeActor calls while thousands are parked.
                    "--parked-request-retry-interval", "2s", "--parked-request-retry-factor", "2"]
            try:
                router, serving = start(argv, "serving")
                break
            except RuntimeError:
                continue
        assert router, "the router did not start"
        status = word_after(serving, "status ").rstrip("/")
        yield {"extproc": word_after(serving, "ext_proc on "), "status": status, "answers": answer_log,
               "holders": holders, "shots": tmp_path_factory.mktemp("statusz-screenshots")}
    finally:
        for holder in holders:
            holder.send_signal(signal.SIGTERM)
            holder.wait(timeout=30)
        if router and router.poll() is None:
            stop(router)
        stop(sim)


def page(status):
    return json.loads(fetch(f"{status}?format=json"))


def look(browser, url, width, shot):
    """Loads the page at `width`, measures it and writes its screenshot: of
    one document (open holds it still; the refresh it would do meanwhile is
    refused)."""
    browser.open(url, width, 900)
    measured = browser.evaluate(MEASURE)
    browser.screenshot(shot)
    assert browser.evaluate("performance.timeOrigin") == measured["origin"], "the page was replaced"
    return measured


def test_the_page_fits_and_charts_at_every_width_with_0_20_and_2000_parked(saturated):
    extproc, status, answers = saturated["extproc"], saturated["status"], saturated["answers"]
    # One actor takes the only worker for the whole test; traffic for the
    # charts: routed and unknown actors, and five parks that are served.
    assert parkload(extproc, "--count", "1", "--actors", "demo/actor-0") == {"200 routed": 1}
    sent = parkload(extproc, "--count", "100", "--concurrency", "4", "--distribution", "round-robin",
                    "--actors", "demo/actor-0,demo/nobody")
    assert sent == {"200 routed": 50, "404 atenet_not_found": 50}, sent
    warm = parkload(extproc, "--count", "5", "--concurrency", "5", "--distribution", "round-robin",
                    "--actors", ",".join(WARM))
    assert warm == {"200 routed": 5}, warm
    assert set(WARM) <= refused(answers), "each warm actor parked once"
    shown = page(status)
    assert shown["verdicts"] == {"routed": 56, "shed": 0, "budget_exhausted": 0, "error": 50}, shown["verdicts"]
    # The samples after the warm parks ended, before any screenshot: every
    # chart has something to draw.
    poll("a sample with the warm parks' waits",
         lambda: any(w is not None for w in page(status)["history"]["wait_p50_seconds"]))
    history = page(status)["history"]
    assert set(history) == documented_history_keys(), "docs/metrics.md describes the JSON's history"
    columns = [v for v in history.values() if isinstance(v, list)]
    assert len(columns) == 9 and len({len(c) for c in columns}) == 1, "one array per series, of one length"

    held = 0
    with Chromium() as browser:
        for parked in PHASES:
            if parked > held:
                saturated["holders"].append(subprocess.Popen(
                    [f"{BIN}/parkload", "--target", extproc, "--hold", str(parked - held), "--distribution",
                     "round-robin", "--actors", f"demo/actor-{{{held + 1}..{parked}}}", "--request-timeout", "30m",
                     "--progress", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                held = parked
            wanted = {f"demo/actor-{i}" for i in range(1, parked + 1)}
            poll(f"the simulator refusing all {parked} held actors", lambda: wanted <= refused(answers))
            # Refused, then parked: the page follows within moments.
            poll(f"{parked} parked on the page", lambda: page(status)["parking"]["active"] == parked, timeout=30)
            shown = page(status)
            listed = min(parked, 50)
            assert (shown["flights"], shown["parked_actors_total"]) == (parked, parked), "B92, B93"
            assert (len(shown["oldest_flights"]), shown["oldest_flights_more"]) == (listed, parked - listed)
            assert (len(shown["parked_actors"]), shown["parked_actors_more"]) == (listed, parked - listed)
            assert {a["actor"] for a in shown["parked_actors"]} <= wanted
            assert (shown["atespaces_total"], shown["atespaces_more"]) == ((1, 0) if parked else (0, 0))
            json_bytes, html_bytes = len(fetch(f"{status}?format=json")), len(fetch(status))
            print(f"{parked} parked: JSON {json_bytes} B, HTML {html_bytes} B")
            assert json_bytes <= MAX_JSON and html_bytes <= MAX_HTML, "B93: the page is bounded"

            for width in WIDTHS:
                shot = saturated["shots"] / f"statusz-{parked}-parked-{width}px.png"
                m = look(browser, status, width, shot)
                print(f"screenshot: {shot}")
                where = f"{parked} parked, {width} px"
                # A phone widens its layout viewport to fit a page that is too wide.
                assert m["innerWidth"] == width, f"{where}: the page is {m['innerWidth']} px wide"
                assert m["scrollWidth"] <= m["innerWidth"], f"{where}: the page scrolls sideways: {m['scrollWidth']}"
                wide = [c for c in m["cards"] if c["scrollWidth"] > c["clientWidth"]]
                assert not wide, f"{where}: cards wider than their box: {wide}"
                assert m["parked"] == f"{parked:,}", where
                for chart in m["charts"]:
                    assert chart["present"], f"{where}: {chart['id']} missing"
                    assert chart["width"] > 100 and chart["height"] > 50, f"{where}: {chart}"
                    assert chart["grid"] == 3 and any(length > 0 for length in chart["lines"]), f"{where}: {chart}"
                assert pathlib.Path(shot).stat().st_size > 10_000, f"{where}: an empty screenshot"


def documented_history_keys():
    """The keys docs/metrics.md lists for the JSON's `history`."""
    text = (pathlib.Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    start = text.index("`history` (")
    described = text[start:text.index(")", start)]
    return set(described.split("`")[3::2]) - {"null"}

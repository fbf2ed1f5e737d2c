"""The shipped monitoring, end to end: Debian's real Prometheus server scrapes a
real router with the shipped scrape config (packaging/prometheus/prometheus.yml)
and evaluates the shipped rules (alerts.yml). Through Prometheus' HTTP API the
tests check that every series the alerts and the Grafana dashboard query exists
(names and label matchers are read from the expressions themselves, so a renamed
metric or label fails here), that every rule evaluates, that
AtenetRouterShedding fires when the router sheds, that AtenetRouterAttemptStuck
fires while the simulator holds a ResumeActor call, that
AtenetRouterCertificateExpiry fires for the router's client certificate to the
simulator (mTLS, a certificate valid for 2 days, made by the openssl command),
and that AtenetRouterDown fires when the router goes away.

The copies handed to Prometheus differ from the shipped files only where a test
must: the scrape target (the router started here), 1 s scrape and evaluation
intervals, a shorter `for:` on the alerts driven to firing (FAST_FOR), and
AtenetRouterAttemptStuck's 120 s threshold lowered to STUCK_AFTER seconds.
"""

import calendar
import json
import pathlib
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import yaml

from conftest import BIN, router_args, start, stop, word_after
from envoy_stack import free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "packaging/prometheus"
DASHBOARD = ROOT / "packaging/grafana/atenet-router-dashboard.json"
RUNBOOK = ROOT / "docs/runbook.md"
METRICS_DOC = ROOT / "docs/metrics.md"
JOB = "atenet-router"

# The alerts this file drives to firing, with the `for:` their copies get.
FAST_FOR = {"AtenetRouterShedding": "5s", "AtenetRouterDown": "3s", "AtenetRouterAttemptStuck": "2s",
            "AtenetRouterCertificateExpiry": "2s"}
# AtenetRouterAttemptStuck's threshold in the copy: the simulator holds
# demo/stuck's ResumeActor call for STUCK_HOLD, far longer.
STUCK_AFTER = 3
STUCK_HOLD = 60

# demo/parks parks once and is served; demo/internal is an unexpected
# control-plane error; demo/full never gets a worker, so with a lot of one
# slot every caller but one is shed and the one exhausts its budget.
SCRIPT = """
demo/parks     ResourceExhausted  0s  -         false  no free workers available
demo/parks     OK                 0s  10.0.0.9  true   -
demo/internal  Internal           0s  -         false  boom
demo/full      ResourceExhausted  0s  -         false  no free workers available
demo/stuck     OK                 {hold}s  10.0.0.9  true   -
""".format(hold=STUCK_HOLD)

# AtenetRouterShedding needs rate(...[5m]) > 1/s, i.e. over 300 sheds in the
# window; ask for ten times that.
SHED_REQUESTS = 3000
MIN_SHED = 1000

# Bounded waits: generous, since the machine may be busy; every wait polls.
STARTUP_TIMEOUT = 60
SCRAPE_TIMEOUT = 60
ALERT_TIMEOUT = 90


def poll(what, check, timeout, ok=bool, interval=0.2):
    """Calls check() until ok(its result); fails after timeout, showing the last
    result (or error) seen."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            last = check()
            if ok(last):
                return last
        except (OSError, urllib.error.URLError) as e:
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout}s; last seen: {last!r}")
        time.sleep(interval)


# --- PromQL: the series an expression selects -------------------------------

KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.I)
STRING = r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`'
MATCHERS = r"\{(?:[^{}\"'`]|" + STRING + r")*\}"
TOKEN = re.compile(
    r"(?P<string>" + STRING + r")"
    r"|(?<![\w.:])(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)\s*(?P<matchers>" + MATCHERS + r")?(?P<call>\s*\()?"
    r"|(?P<bare>" + MATCHERS + r")"
)


def selectors(expr):
    """The vector selectors of a PromQL expression, as `name{matchers}` strings.

    Enough of PromQL for rules and dashboards: grouping clauses, ranges and
    string literals are skipped; an identifier followed by `(` is a function;
    any other identifier, with or without `{...}`, is a metric selector.
    """
    expr = GROUPING.sub(" ", expr)
    expr = re.sub(r"\[[^\[\]]*\]", " ", expr)
    found = []
    for m in TOKEN.finditer(expr):
        if m.group("bare"):
            found.append(m.group("bare"))
        elif m.group("name") and not m.group("call") and m.group("name").lower() not in KEYWORDS:
            found.append(m.group("name") + (m.group("matchers") or ""))
    return found


def test_selector_extraction():
    assert selectors('max by (namespace, pod) (atenet_router_parking_active) / max(x{a="b"})') == [
        "atenet_router_parking_active", 'x{a="b"}']
    assert selectors('sum(rate(m_count{code!~"OK|A"}[5m])) > 0.05 and on (pod) up == 0 or absent(up{job="j"})') == [
        'm_count{code!~"OK|A"}', "up", 'up{job="j"}']
    assert selectors('histogram_quantile(0.99, sum by (le) (rate(h_bucket{n=~"$ns",o="}"}[5m])))') == [
        'h_bucket{n=~"$ns",o="}"}']
    assert selectors("1e3 * offset_thing offset 5m") == ["offset_thing"]


# --- What the shipped files query -------------------------------------------

def shipped_rules():
    rules = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())
    return [rule for group in rules["groups"] for rule in group["rules"]]


def dashboard():
    return json.loads(DASHBOARD.read_text())


def dashboard_exprs():
    exprs = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                exprs.append(node["expr"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(dashboard().get("panels", []))
    assert exprs, "the dashboard has no Prometheus queries"
    return exprs


def dashboard_variable_queries():
    """(selector, label) for each `label_values(selector, label)` variable."""
    out = []
    for var in dashboard().get("templating", {}).get("list", []):
        query = var.get("query")
        if var.get("type") == "query":
            query = query.get("query") if isinstance(query, dict) else query
            m = re.fullmatch(r"\s*label_values\((.+),\s*(\w+)\)\s*", query or "")
            assert m, f"dashboard variable {var['name']}: unsupported query {query!r}"
            out.append((m.group(1), m.group(2)))
    return out


def instantiate(expr):
    """A dashboard expression as Grafana sends it with every value selected."""
    variables = {v["name"] for v in dashboard().get("templating", {}).get("list", [])}

    def value(m):
        name = m.group(1) or m.group(2)
        if name in ("__rate_interval", "__interval", "__range"):
            return "1m"
        assert name in variables, f"{expr!r} uses undefined variable ${name}"
        return ".+"

    return re.sub(r"\$(?:(\w+)|\{(\w+)(?::\w+)?\})", value, expr)


def queried_series():
    """Every selector the alerts and the dashboard use, instantiated."""
    found = {}
    for rule in shipped_rules():
        for sel in selectors(rule["expr"]):
            found.setdefault(sel, f"alert {rule['alert']}")
    for expr in dashboard_exprs():
        for sel in selectors(instantiate(expr)):
            found.setdefault(sel, "dashboard")
    for sel, _ in dashboard_variable_queries():
        found.setdefault(instantiate(sel), "dashboard variable")
    return found


# --- A real Prometheus -------------------------------------------------------

class Prometheus:
    def __init__(self, proc, base, log):
        self.proc, self.base, self.log = proc, base, log

    def log_tail(self):
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])

    def api(self, path, **params):
        url = f"{self.base}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{url}: HTTP {e.code}: {e.read().decode(errors='replace')}") from None
        assert body["status"] == "success", body
        return body["data"]

    def alerts(self, name):
        return [a for a in self.api("alerts")["alerts"] if a["labels"]["alertname"] == name]

    def firing(self, name):
        assert self.proc.poll() is None, "prometheus exited:\n" + self.log_tail()
        return [a for a in self.alerts(name) if a["state"] == "firing"]


def write_config_copies(tmp, router_metrics):
    """The shipped config and rules, rewritten only where the test must.

    Returns the target labels of the router's job."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config["global"]["scrape_interval"] = "1s"
    config["global"]["evaluation_interval"] = "1s"
    config["global"].pop("scrape_timeout", None)
    assert config["rule_files"] == ["alerts.yml"], "the config loads alerts.yml from beside itself"
    jobs = [job for job in config["scrape_configs"] if job["job_name"] == JOB]
    assert len(jobs) == 1, f"expected one scrape job named {JOB}, the name the alerts and dashboard use"
    job = jobs[0]
    for key in ("scrape_interval", "scrape_timeout"):
        if key in job:
            job[key] = "1s"
    (static,) = job["static_configs"]
    static["targets"] = [router_metrics]
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))

    rules = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())
    shortened = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") in FAST_FOR:
                rule["for"] = FAST_FOR[rule["alert"]]
                shortened.add(rule["alert"])
    assert shortened == set(FAST_FOR), f"alerts.yml lacks {set(FAST_FOR) - shortened}"
    (stuck,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "AtenetRouterAttemptStuck"]
    assert stuck["expr"].strip().endswith("> 120"), stuck["expr"]
    stuck["expr"] = stuck["expr"].strip()[:-len("120")] + str(STUCK_AFTER)
    (tmp / "alerts.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    return static.get("labels", {})


def start_prometheus(tmp):
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    assert pathlib.Path(binary).exists(), "prometheus missing: make deps installs Debian's prometheus package"
    log = tmp / "prometheus.log"
    for _ in range(3):  # another process may grab the free port first
        base = f"http://127.0.0.1:{free_port()}"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
                 f"--web.listen-address={base[len('http://'):]}"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        prom = Prometheus(proc, base, log)

        def ready():
            if proc.poll() is not None:
                return "exited"
            with urllib.request.urlopen(f"{base}/-/ready", timeout=5) as r:
                return r.status

        try:
            if poll("ready prometheus", ready, STARTUP_TIMEOUT, ok=lambda r: r in ("exited", 200)) == 200:
                return prom
        except AssertionError:
            proc.kill()
            proc.wait()
            raise AssertionError("prometheus never got ready:\n" + prom.log_tail()) from None
        if "address already in use" not in prom.log_tail():
            raise AssertionError("prometheus exited:\n" + prom.log_tail())
    raise AssertionError("prometheus found no free port:\n" + prom.log_tail())


def parkload(target, actors, count, concurrency):
    result = subprocess.run(
        [f"{BIN}/parkload", "--target", target, "--count", str(count), "--concurrency", str(concurrency),
         "--actors", actors, "--json", "--progress", "0"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["verdicts"]


def openssl(directory, *args):
    return subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, text=True).stdout


def make_pki(directory):
    """A CA; the simulator's certificate for ateapi.test; the router's client
    bundle, valid for 2 days (inside AtenetRouterCertificateExpiry's 14).
    Returns the client certificate's notAfter as Unix seconds, as openssl
    prints it."""
    openssl(directory, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=ca")
    for name, ext in (("ateapi", "subjectAltName=DNS:ateapi.test"), ("router", "extendedKeyUsage=clientAuth")):
        (directory / f"{name}.ext").write_text(ext + "\n")
        openssl(directory, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        openssl(directory, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")
    (directory / "router.bundle").write_text((directory / "router.crt").read_text()
                                             + (directory / "router.key").read_text())
    end = openssl(directory, "x509", "-in", "router.crt", "-noout", "-enddate").strip()
    return calendar.timegm(time.strptime(end.removeprefix("notAfter="), "%b %d %H:%M:%S %Y GMT"))


@pytest.fixture(scope="module")
def monitored():
    """ateapi-sim, a router with a one-slot lot, and Prometheus scraping it,
    after traffic that makes every labelled series appear and sheds."""
    with tempfile.TemporaryDirectory(prefix="atenet-prometheus-") as tmpdir:
        tmp = pathlib.Path(tmpdir)
        (tmp / "sim.script").write_text(SCRIPT)
        client_not_after = make_pki(tmp)
        sim, line = start([f"{BIN}/ateapi-sim", "--listen", "127.0.0.1:0", "--actors", "0",
                           "--script", str(tmp / "sim.script"), "--tls-cert", str(tmp / "ateapi.crt"),
                           "--tls-key", str(tmp / "ateapi.key"), "--tls-client-ca", str(tmp / "ca.crt")],
                          "listening on")
        router = prom = None
        try:
            args = router_args(word_after(line, "listening on "),
                               "--ateapi-ca-file", str(tmp / "ca.crt"),
                               "--ateapi-client-cert", str(tmp / "router.bundle"),
                               "--ateapi-server-name", "ateapi.test",
                               "--parked-request-max", "1",
                               "--parked-request-budget", "1s",
                               "--parked-request-retry-interval", "20ms")
            args.remove("--ateapi-insecure")
            router, line = start(args, "serving")
            extproc = word_after(line, "ext_proc on ")
            metrics = word_after(line, "metrics on http://").split("/")[0]
            labels = write_config_copies(tmp, metrics)
            prom = start_prometheus(tmp)

            (target,) = poll("successful scrape of the router",
                             lambda: [t for t in prom.api("targets")["activeTargets"] if t["labels"]["job"] == JOB],
                             SCRAPE_TIMEOUT, ok=lambda ts: any(t["health"] == "up" for t in ts))
            assert target["labels"]["instance"] == metrics

            verdicts = {
                "parks": parkload(extproc, "demo/parks", 1, 1),
                "internal": parkload(extproc, "demo/internal", 1, 1),
                "full": parkload(extproc, "demo/full", SHED_REQUESTS, 32),
            }
            assert verdicts["parks"] == {"200 routed": 1}, verdicts
            assert verdicts["internal"] == {"500 atenet_resume_error": 1}, verdicts
            assert verdicts["full"].get("503 atenet_lot_full", 0) >= MIN_SHED, verdicts
            assert verdicts["full"].get("503 atenet_budget_exhausted", 0) >= 1, verdicts

            yield {"prom": prom, "router": router, "metrics": metrics, "labels": labels, "extproc": extproc,
                   "client_not_after": client_not_after}
        finally:
            if prom:
                prom.proc.terminate()
                try:
                    prom.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    prom.proc.kill()
                    prom.proc.wait()
            if router and router.poll() is None:
                stop(router)
            stop(sim)


def test_rules_load_and_evaluate(monitored):
    prom = monitored["prom"]
    shipped = {rule["alert"]: rule for rule in shipped_rules()}

    loaded = poll("evaluation of every shipped rule",
                  lambda: {r["name"]: r for g in prom.api("rules")["groups"] for r in g["rules"]},
                  SCRAPE_TIMEOUT,
                  ok=lambda rules: set(rules) == set(shipped) and all(r["health"] != "unknown" for r in rules.values()))
    for name, rule in loaded.items():
        assert rule["health"] == "ok", f"{name}: {rule.get('lastError')}"
        assert rule["labels"] == shipped[name]["labels"]
        assert rule["annotations"] == shipped[name]["annotations"]


def test_every_queried_series_exists(monitored):
    prom = monitored["prom"]
    wanted = queried_series()
    assert any(sel.startswith("up{") for sel in wanted), "no alert watches the scrape itself"

    # Series appear with the scrape after the traffic that creates them;
    # on failure the message lists the selectors without series.
    poll("series for every selector the alerts and the dashboard use",
         lambda: {sel: where for sel, where in wanted.items() if not prom.api("series", **{"match[]": sel})},
         SCRAPE_TIMEOUT, ok=lambda missing: not missing)

    for selector, label in dashboard_variable_queries():
        series = prom.api("series", **{"match[]": instantiate(selector)})
        assert all(s.get(label) for s in series), f"{selector} series lack the {label} label"
    # The router's series carry the target labels the alerts group by.
    for series in prom.api("series", **{"match[]": "atenet_router_parking_active"}):
        for key, value in monitored["labels"].items():
            assert series.get(key) == value, series


def test_every_dashboard_query_returns_data(monitored):
    prom = monitored["prom"]
    for expr in dashboard_exprs():
        query = instantiate(expr)
        poll(f"data for the dashboard query {query}",
             lambda: prom.api("query", query=query)["result"], SCRAPE_TIMEOUT)


def test_shedding_fires_the_alert(monitored):
    prom, labels = monitored["prom"], monitored["labels"]
    try:
        (alert,) = poll("firing AtenetRouterShedding", lambda: prom.firing("AtenetRouterShedding"), ALERT_TIMEOUT)
    except AssertionError as e:
        raise AssertionError(f"{e}\nrate now: "
                             f"{prom.api('query', query='rate(atenet_router_parking_rejected_total[5m])')}") from None
    assert alert["labels"] == {"alertname": "AtenetRouterShedding", "severity": "critical", **labels}
    assert float(alert["value"]) > 1
    assert alert["annotations"]["summary"] == f"atenet-router {labels['pod']} sheds requests: lot full"
    assert alert["annotations"]["runbook_url"] == f"{runbook_base()}#atenetroutershedding"


def test_an_attempt_ateapi_holds_fires_the_alert(monitored):
    """The truth is the test's clock: the attempt started after the request
    was sent, so the alert's value (its age) is at most the time since."""
    prom, labels = monitored["prom"], monitored["labels"]
    assert not prom.alerts("AtenetRouterAttemptStuck"), "no attempt runs long before demo/stuck's"
    sent = time.monotonic()
    client = subprocess.Popen(
        [f"{BIN}/parkload", "--target", monitored["extproc"], "--count", "1", "--actors", "demo/stuck",
         "--progress", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        (alert,) = poll("firing AtenetRouterAttemptStuck", lambda: prom.firing("AtenetRouterAttemptStuck"),
                        ALERT_TIMEOUT)
        assert STUCK_AFTER < float(alert["value"]) <= time.monotonic() - sent
        assert alert["labels"] == {"alertname": "AtenetRouterAttemptStuck", "severity": "warning", **labels}
        assert alert["annotations"]["runbook_url"] == f"{runbook_base()}#atenetrouterattemptstuck"
    finally:
        # The simulator answers at STUCK_HOLD; the router then ends the flight.
        client.wait(timeout=STUCK_HOLD + ALERT_TIMEOUT)
    poll("the attempt's answer, seen by Prometheus",
         lambda: prom.api("query", query="atenet_router_oldest_attempt_seconds")["result"], SCRAPE_TIMEOUT,
         ok=lambda result: result and all(float(r["value"][1]) == 0 for r in result))


def test_a_certificate_near_its_expiry_fires_the_alert(monitored):
    """The router's client certificate to the simulator is valid for 2 days:
    the alert fires for it, its value that certificate's notAfter."""
    prom, labels = monitored["prom"], monitored["labels"]
    (alert,) = poll("firing AtenetRouterCertificateExpiry",
                    lambda: prom.firing("AtenetRouterCertificateExpiry"), ALERT_TIMEOUT)
    assert alert["labels"] == {"alertname": "AtenetRouterCertificateExpiry", "severity": "warning",
                               "certificate": "ateapi_client", **labels}
    assert float(alert["value"]) == monitored["client_not_after"]
    assert alert["annotations"]["summary"].startswith(f"atenet-router {labels['pod']}: its ateapi_client certificate "
                                                      "expires ")
    assert alert["annotations"]["runbook_url"] == f"{runbook_base()}#atenetroutercertificateexpiry"


def router_not_down(prom):
    """A scraped router raises no AtenetRouterDown (absent() may be pending
    for a moment before the first scrape, never after)."""
    poll("AtenetRouterDown clear while the router is scraped",
         lambda: prom.alerts("AtenetRouterDown"), SCRAPE_TIMEOUT, ok=lambda alerts: not alerts)


def test_router_down_fires_the_alert(monitored):
    prom, labels = monitored["prom"], monitored["labels"]
    router_not_down(prom)
    stop(monitored["router"])
    (alert,) = poll("firing AtenetRouterDown", lambda: prom.firing("AtenetRouterDown"), ALERT_TIMEOUT)
    assert alert["labels"] == {"alertname": "AtenetRouterDown", "severity": "critical", "job": JOB,
                               "instance": monitored["metrics"], **labels}
    assert alert["annotations"]["summary"] == f"atenet-router {labels['pod']} ({monitored['metrics']}) is down"


# --- Runbooks -------------------------------------------------------------------

def github_anchor(heading):
    """The anchor GitHub (and GitLab) give a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def heading_anchors(text):
    anchors, fenced = set(), False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)):
            anchors.add(github_anchor(m.group(1)))
    return anchors


def test_github_anchor():
    assert heading_anchors("## `AtenetRouterDown`\n```\n# Runbook: X\n```\n") == {"atenetrouterdown"}


# The one command docs/metrics.md gives to set the runbooks' base: a sed over
# the rules and their unit tests, replacing the shipped base.
RUNBOOK_SED = re.compile(r"^sed -i 's\|(?P<shipped>[^|]+)\|(?P<yours>[^|]+)\|' \\\n\s+(?P<files>.+)$", re.M)


def runbook_base():
    """The base every shipped runbook_url starts with, as docs/metrics.md states it."""
    command = RUNBOOK_SED.search(METRICS_DOC.read_text())
    assert command, "docs/metrics.md gives the sed command that sets the runbooks' base"
    return command["shipped"]


def test_every_alert_links_its_runbook_by_an_absolute_url():
    base = runbook_base()
    parsed = urllib.parse.urlparse(base)
    assert parsed.scheme == "https" and parsed.netloc and parsed.path.endswith("/docs/runbook.md"), base
    anchors = heading_anchors(RUNBOOK.read_text())
    for rule in shipped_rules():
        url = rule["annotations"].get("runbook_url")
        assert url == f"{base}#{rule['alert'].lower()}", rule["alert"]
        assert url.split("#", 1)[1] in anchors, \
            f"docs/runbook.md has no heading '{rule['alert']}' for {rule['alert']}'s runbook_url"
    tested = re.findall(r'runbook_url: "([^"]+)"', (PROMETHEUS_DIR / "alerts_test.yml").read_text())
    assert tested and all(url.startswith(f"{base}#") for url in tested), tested


def test_the_documented_command_sets_every_runbook_base(tmp_path):
    """docs/metrics.md's command, run as written over a copy of the rules:
    every runbook_url then has the operator's base, and the rules' unit tests
    still pass with it."""
    command = RUNBOOK_SED.search(METRICS_DOC.read_text())
    shutil.copytree(PROMETHEUS_DIR, tmp_path / "packaging/prometheus")
    subprocess.run(["bash", "-c", command[0]], cwd=tmp_path, check=True)
    copied = tmp_path / "packaging/prometheus"
    rules = yaml.safe_load((copied / "alerts.yml").read_text())
    for rule in (r for group in rules["groups"] for r in group["rules"]):
        assert rule["annotations"]["runbook_url"] == f"{command['yours']}#{rule['alert'].lower()}"
    assert runbook_base() not in (copied / "alerts_test.yml").read_text()
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool missing: make deps-test installs Debian's prometheus package")
    result = subprocess.run([promtool, "test", "rules", "alerts_test.yml"], cwd=copied, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr

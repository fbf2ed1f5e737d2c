"""B102 through real Envoys: Envoy pings every connection to a router and
closes one whose router has hung, so that the streams on it are retried on
another router; the router's gRPC server takes those pings from a
connection whose streams are all parked without calling them abuse.

The truth is what the client got, what the echo worker recorded and
Envoy's own counters (its keepalive timeouts, its retried streams, the
streams each router host holds), never the router's.

Every actor here is scripted (tests/system/envoy_stack.py): refused
ResourceExhausted a fixed number of times, one every 250 ms of its
flight's fixed retry interval, then resumed, so that a request parks for
a known number of refusals, whichever router serves them.
"""

import http.client
import os
import signal
import threading
import time

from envoy_stack import LOOPBACK, FleetStack, Stack, admin_stats

WORKER = "127.0.1.1"  # the echo worker's first host: the sim's worker 0
# A fixed retry interval, and a budget far beyond what any wait here takes.
# The script refuses each actor on its own, not a pool: every flight retries
# on its own (in a saturation group the oldest would take every probe).
ROUTER_FLAGS = ["--parked-request-budget", "60s", "--parked-request-retry-interval", "250ms",
                "--parked-request-retry-factor", "1", "--parked-request-retry-jitter", "0",
                "--parked-request-dispatch", "per-flight"]


def script(actors, refusals):
    """Each actor refused `refusals` times, then resumed on the worker (more
    than once: a hung router may have taken an answer that never reached
    anyone)."""
    lines = []
    for actor in actors:
        lines += [f"{actor} ResourceExhausted 0s - false no free workers available"] * refusals
        lines += [f"{actor} OK 0s {WORKER} true -"] * 8
    return "\n".join(lines) + "\n"


def request(port, actor, outcomes, lock):
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=120)
    started = time.monotonic()
    try:
        conn.request("GET", "/", headers={"ate-target-actor": actor, "x-client-request-id": actor})
        response = conn.getresponse()
        response.read()
        outcome = (response.status, response.getheader("x-atenet-reason"))
    except OSError as e:
        outcome = (repr(e), None)
    finally:
        conn.close()
    with lock:
        outcomes[actor] = (*outcome, round(time.monotonic() - started, 1))


def send_all(port, actors):
    """One request per actor, all at once; returns the threads and the
    outcomes they fill in: {actor: (status, x-atenet-reason, seconds)}."""
    outcomes, lock = {}, threading.Lock()
    threads = [threading.Thread(target=request, args=(port, a, outcomes, lock), daemon=True) for a in actors]
    for t in threads:
        t.start()
    return threads, outcomes


def wait_until(what, check, timeout=60):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        time.sleep(0.05)


def served_once(records, outcomes):
    """The actors whose request got the worker's 200 and was recorded by it
    exactly once, for that actor."""
    return {actor for actor, (status, reason, _) in outcomes.items()
            if status == 200 and reason is None
            and [r["actor"] for r in records if r["request_id"] == actor] == [actor]}


def test_b102_a_hung_routers_streams_are_retried_on_another_router():
    """Two routers behind one Envoy, twelve requests parked across them;
    one router is stopped (SIGSTOP: its process frozen, its kernel still
    holding the connections, as `docker pause` does). Every request is
    served: Envoy's keepalive closes the hung router's connection, and the
    streams it held are retried on the other router, which resumes their
    actors. Seen failing with the keepalive taken out of the bootstrap:
    the frozen router's requests got Envoy's 504 at the message timeout."""
    actors = [f"hung/actor-{i}" for i in range(12)]
    with FleetStack(routers=2, envoys=1, router_flags=ROUTER_FLAGS, workers=1,
                    sim_flags=["--actors", "0"], script=script(actors, refusals=80)) as stack:
        threads, outcomes = send_all(stack.envoy_ports[0]["http"], actors)

        def active():
            return {host: int(v.get("rq_active", 0)) for host, v in stack.router_hosts(0).items()}

        # 80 refusals 250 ms apart: 20 s before any of them can be served,
        # far more than twelve streams take to open.
        wait_until("12 streams open on the routers", lambda: sum(active().values()) == len(actors))
        held = active()
        hung_host = max(held, key=held.get)
        hung = stack.routers[[f"{LOOPBACK}:{p}" for p in stack.extproc_ports].index(hung_host)]
        os.kill(hung.proc.pid, signal.SIGSTOP)
        try:
            for t in threads:
                t.join(timeout=150)
            stats = admin_stats(stack.admin_url(0), r"^cluster\.atenet_router\.(http2\.keepalive_timeout|upstream_rq_retry)$")
        finally:
            os.kill(hung.proc.pid, signal.SIGCONT)
        records = stack.records()
    served = served_once(records, outcomes)
    print(f"hung router: held {held[hung_host]} of {len(actors)} streams; Envoy: {stats}; outcomes: {outcomes}")
    assert held[hung_host] > 0
    assert served == set(actors), f"not served: {sorted(set(actors) - served)}: {outcomes}"
    # Health-check connections count keepalive timeouts too: the retries are
    # what show the hung router's ext_proc streams moved.
    assert stats["cluster.atenet_router.http2.keepalive_timeout"] >= 1, stats
    assert stats["cluster.atenet_router.upstream_rq_retry"] >= held[hung_host], stats


def test_b102_a_parked_stream_outlasts_envoys_pings():
    """A sidecar's router holds one parked stream for 30 refusals (7.5 s at
    least, Envoy pinging every second meanwhile): the stream is never cut
    and never retried, and the request is served. Seen failing with the
    router's ping policy stricter than Envoy's pings (5 s, 1 strike): gRPC
    closed the connection and Envoy retried the stream twice."""
    actor = "quiet/actor-0"
    with Stack(router_flags=ROUTER_FLAGS, workers=1, sim_flags=["--actors", "0"], echo_hosts=1,
               script=script([actor], refusals=30)) as stack:
        threads, outcomes = send_all(stack.http_port, [actor])
        for t in threads:
            t.join(timeout=150)
        records = stack.records()
        stats = admin_stats(stack.admin_url, r"^cluster\.atenet_router\.(upstream_rq_total|upstream_rq_retry|"
                                             r"upstream_cx_total|http2\.keepalive_timeout)$")
    print(f"parked stream: {outcomes}; Envoy: {stats}")
    assert served_once(records, outcomes) == {actor}, outcomes
    # 30 refusals, 250 ms apart at the least: pings came while it parked.
    assert outcomes[actor][2] >= 7, f"it parked for the refusals: {outcomes}"
    assert stats == {"cluster.atenet_router.upstream_rq_total": 1, "cluster.atenet_router.upstream_rq_retry": 0,
                     "cluster.atenet_router.upstream_cx_total": 1,
                     "cluster.atenet_router.http2.keepalive_timeout": 0}, stats

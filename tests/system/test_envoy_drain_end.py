"""Verdicts given at a stop's end reach the client (issue 39 item 2, B104),
behind a real Envoy 1.40.

A hundred requests park on one actor past a 1 s budget, so each has had its
late-serve override (B49); the sim holds the actor's ResumeActor answer
(`held`) until the test sends it SIGUSR1, which it does just as the router
stops: right after the router logs that it stops ext_proc (the verdicts
follow gRPC's GOAWAY by milliseconds), or, every other round, before the
stop (the verdicts precede it). Twenty rounds of a SIGTERM drain, each with
a new router, and twenty SIGHUP hand-overs, each to the next successor, in
one stack each, the router on loopback TCP and on a Unix socket (B98). The
truth is what the clients got and what the worker received: each of the
hundred requests of every round answered 200 by the worker, once.

Before B104, gRPC closed each connection the moment its last stream ended
after the GOAWAY, while Envoy's frames (window updates, stream resets) were
still on their way; Linux answered them with a RST (on a Unix socket, the
close with unread data resets the peer), which threw away verdicts Envoy
had not yet read: Envoy's 503 `upstream_reset_after_response_started
{connection_termination}`, in up to 90 of a round's 100.
"""

import http.client
import os
import signal
import threading
import time
from collections import Counter

import pytest

from envoy_stack import LOOPBACK, STOP_TIMEOUT, Stack, admin_stats, word_after

CALLERS = 100
ROUNDS = 20
SCRIPT = "demo/late OK held 127.0.1.1 true -\n"
FLAGS = ["--parked-request-budget", "1s", "--late-serve-limit", "10s"]


def get(stack, request_id):
    conn = http.client.HTTPConnection(LOOPBACK, stack.http_port, timeout=60)
    try:
        conn.request("GET", "/", headers={"ate-target-actor": "demo/late", "x-client-request-id": request_id})
        response = conn.getresponse()
        body = response.read()
        return response.status, response.getheader("x-atenet-reason") or body[:120].decode(errors="replace")
    except OSError as e:
        return None, repr(e)
    finally:
        conn.close()


def wait_for(what, predicate, timeout=60):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(0.005)


def wait_log(process, marker, after):
    """The first output line of `process` from index `after` on that holds
    `marker`, and the index past it (the routers of a hand-over share one
    output)."""
    found = []

    def seen():
        lines = process.lines
        for i in range(after, len(lines)):
            if marker in lines[i]:
                found.append((lines[i], i + 1))
                return True
        return False

    wait_for(f"{process.name} line {marker!r}", seen)
    return found[0]


def overrides(stack):
    return sum(admin_stats(stack.admin_url, r"override_message_timeout_received$").values())


def park(stack, round_no, replies, sent_overrides):
    """Starts CALLERS requests and returns once each is parked and has its
    late-serve override; returns the client threads."""
    def ask(request_id):
        replies[request_id] = get(stack, request_id)

    clients = [threading.Thread(target=ask, args=(f"r{round_no}-{i}",)) for i in range(CALLERS)]
    for c in clients:
        c.start()
    wait_for("every request's late-serve override", lambda: overrides(stack) == sent_overrides + CALLERS)
    return clients


def release(stack):
    stack.sim.proc.send_signal(signal.SIGUSR1)


def gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def lost(replies, round_no):
    return {k: v for k, v in replies.items() if v[0] != 200 and k.startswith(f"r{round_no}-")}


def assert_all_served(stack, replies, logs):
    failed = {k: v for k, v in replies.items() if v[0] != 200}
    details = Counter(e.get("response_code_details") for e in stack.access_log() if e.get("response_code") != 200)
    assert not failed, (f"{len(failed)} of {len(replies)} requests lost, Envoy's details {dict(details)}: "
                        f"{sorted(failed.items())[:5]}", logs[-3000:])
    served = sorted(r["request_id"] for r in stack.records())
    assert served == sorted(replies), "each request reaches the worker once"


TRANSPORTS = ["tcp", "unix"]


def report(stack, replies, round_no, after):
    """Prints the round's count, and what the router said during a round
    that lost requests (the evidence a failure needs, as the stack's logs
    keep only the last router's)."""
    missing = lost(replies, round_no)
    print(f"round {round_no}: {len(missing)} of {CALLERS} lost")
    if missing:
        print(f"  lost: {sorted(missing)[:10]}; the router's lines of the round:")
        print("\n".join("  " + line for line in stack.router.lines[after:][-60:]))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_verdicts_at_a_drains_end_all_reach_their_clients(transport):
    with Stack(router_flags=FLAGS, script=SCRIPT, workers=1, extproc_socket=transport == "unix") as s:
        replies, sent = {}, 0
        for round_no in range(ROUNDS):
            clients = park(s, round_no, replies, sent)
            sent += CALLERS
            after = len(s.router.lines)
            if round_no % 2 == 0:
                s.router.proc.send_signal(signal.SIGTERM)
                wait_log(s.router, "stopping ext_proc", after)
                release(s)
            else:
                released = len(s.sim.lines)
                release(s)
                wait_log(s.sim, "released 1 held answers", released)
                s.router.proc.send_signal(signal.SIGTERM)
            for c in clients:
                c.join(timeout=60)
            assert s.router.proc.wait(timeout=STOP_TIMEOUT) == 0
            report(s, replies, round_no, after)
            s.start_router()
        assert_all_served(s, replies, s.logs())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_verdicts_at_a_hand_overs_end_all_reach_their_clients(transport):
    with Stack(router_flags=FLAGS, script=SCRIPT, workers=1, extproc_socket=transport == "unix") as s:
        replies, sent = {}, 0
        pid, after = s.router.proc.pid, 0
        for round_no in range(ROUNDS):
            clients = park(s, round_no, replies, sent)
            sent += CALLERS
            after = len(s.router.lines)
            os.kill(pid, signal.SIGHUP)
            line, after = wait_log(s.router, "handover: successor ", after)
            successor = int(word_after(line, "handover: successor "))
            s.successor_pid = successor  # the stack kills it at its end
            if round_no % 2 == 1:
                release(s)  # before the stop: the hand-over steers and waits first
            _, after = wait_log(s.router, "handover: stopping ext_proc", after)
            if round_no % 2 == 0:
                release(s)
            for c in clients:
                c.join(timeout=60)
            _, after = wait_log(s.router, "handover complete", after)
            wait_for(f"router {pid} to exit", lambda: gone(pid), timeout=STOP_TIMEOUT)
            report(s, replies, round_no, after)
            pid = successor
        assert_all_served(s, replies, s.logs())

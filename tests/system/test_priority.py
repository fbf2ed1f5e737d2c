"""Priority bands through a real Envoy 1.40.0 from `envoy-config`
(envoy_stack.py): a client's own `ate-priority` counts only from a trusted
peer, and a route that sets the band does (B116, B118, B119).

The truth is what each client got; the router's metrics only synchronise
(wait until requests are parked), and Envoy's access log shows the band the
router read.
"""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from envoy_stack import LOOPBACK, Stack
from test_envoy_edge import UNTRUSTED_SOURCE, h1

ROOT = Path(__file__).resolve().parents[2]

# Every actor waits for a worker for the whole budget.
SCRIPT = "\n".join(f"demo/a{i}  ResourceExhausted  0s  -  false  no free workers available" for i in range(5)) + \
    "\ndemo/ok  OK  0s  127.0.1.1  true  -\n"
FLAGS = ["--parked-request-budget", "6s", "--parked-request-retry-interval", "50ms",
         "--parked-request-max", "2", "--envoy-trusted-ranges", "127.0.0.1/32"]

# The operator's route, as docs/priority.md gives it: requests under
# /checkout are critical, whatever the client sent.
CHECKOUT_ROUTE = (ROOT / "docs" / "priority.md").read_text().split("```yaml\n")[1].split("```")[0]
CATCH_ALL = '              - match: { prefix: "/" }\n                route:\n'


def with_checkout_route(text):
    assert text.count(CATCH_ALL) == 1, "the generated catch-all route moved"
    return text.replace(CATCH_ALL, CHECKOUT_ROUTE + CATCH_ALL)


def reason(reply):
    return reply.status, reply.headers.get("x-atenet-reason")


def test_b116_an_untrusted_clients_critical_cannot_preempt_and_a_routes_band_does():
    with Stack(router_flags=FLAGS, script=SCRIPT, sim_flags=["--actors", "0"], workers=1,
               edit_config=with_checkout_route) as s, ThreadPoolExecutor(4) as pool:
        # Two standard requests fill the lot of 2.
        first = pool.submit(h1, s, "demo/a0", "/fill/first", source=LOOPBACK)
        s.wait_router_metric("atenet_router_parking_active", 1)
        second = pool.submit(h1, s, "demo/a1", "/fill/second", source=LOOPBACK)
        s.wait_router_metric("atenet_router_parking_active", 2)
        # An untrusted client's own `critical` is removed: standard, shed.
        forged = h1(s, "demo/a2", "/forged", [("ate-priority", "critical")], source=UNTRUSTED_SOURCE)
        assert reason(forged) == (503, "atenet_lot_full"), forged
        # The same client under the critical route takes the newest slot.
        routed = pool.submit(h1, s, "demo/a3", "/checkout/pay", [("ate-priority", "sheddable")],
                             source=UNTRUSTED_SOURCE)
        assert reason(second.result()) == (503, "atenet_preempted"), second.result()
        assert second.result().headers.get("retry-after"), "a capacity 503 says when to retry"
        # A trusted peer's own header counts: it takes the other one.
        trusted = pool.submit(h1, s, "demo/a4", "/trusted", [("ate-priority", "CRITICAL")], source=LOOPBACK)
        assert reason(first.result()) == (503, "atenet_preempted"), first.result()
        # The critical requests keep their slots until the budget ends.
        assert reason(routed.result()) == (503, "atenet_budget_exhausted"), routed.result()
        assert reason(trusted.result()) == (503, "atenet_budget_exhausted"), trusted.result()
        bands = {path: s.wait_access_log(lambda e, p=path: e["path"] == p)["priority"]
                 for path in ["/forged", "/checkout/pay", "/trusted", "/fill/first"]}
        assert bands == {"/forged": None, "/checkout/pay": "critical", "/trusted": "CRITICAL",
                         "/fill/first": None}, bands
        # The documented route, served: the worker gets the band and the
        # port the router chose, as the catch-all route's requests do.
        served = h1(s, "demo/ok", "/checkout/ok", [("ate-priority", "sheddable")], source=UNTRUSTED_SOURCE)
        plain = h1(s, "demo/ok", "/plain", source=UNTRUSTED_SOURCE)
        assert (served.status, plain.status) == (200, 200), (served, plain)
        seen, plain_seen = served.echoed()["headers"], plain.echoed()["headers"]
        assert seen.get("ate-priority") == "critical", seen
        assert "ate-priority" not in plain_seen, plain_seen
        port = plain_seen.get("x-ate-target-port")
        assert port is not None and seen.get("x-ate-target-port") == port, (seen, plain_seen)

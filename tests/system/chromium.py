"""Debian's real Chromium, headless, driven over the DevTools protocol.

Chromium speaks the protocol on a pipe when started with
--remote-debugging-pipe: it reads commands on fd 3 and writes answers and
events on fd 4, each message JSON ended by a NUL byte. That needs no
WebSocket client and no port, so nothing beyond the standard library.
"""

import base64
import json
import os
import select
import signal
import shutil
import tempfile
import time

# Bounded waits: Chromium on two busy cores can take a while to start.
COMMAND_TIMEOUT = 60


class ProtocolError(Exception):
    pass


class Chromium:
    def __init__(self):
        binary = shutil.which("chromium")
        assert binary, "chromium missing: make deps-test installs Debian's chromium"
        self.profile = tempfile.mkdtemp(prefix="atenet-chromium-")
        to_browser, self._commands = os.pipe()
        self._answers, from_browser = os.pipe()
        argv = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--hide-scrollbars", "--mute-audio", "--remote-debugging-pipe",
                f"--user-data-dir={self.profile}", "about:blank"]
        log = os.open(os.path.join(self.profile, "chromium.log"), os.O_WRONLY | os.O_CREAT, 0o644)
        self.pid = os.posix_spawn(binary, argv, os.environ, file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, log, 1),
            (os.POSIX_SPAWN_DUP2, log, 2),
            (os.POSIX_SPAWN_DUP2, to_browser, 3),
            (os.POSIX_SPAWN_DUP2, from_browser, 4),
        ])
        for fd in (to_browser, from_browser, log):
            os.close(fd)
        self._buffer = b""
        self._next_id = 0
        self.events = []
        # The address of the one page load to let through, and how many
        # opens there were: each open asks for an address of its own.
        self._expected, self._opens = None, 0
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.page("Page.enable")
        self.page("Page.setLifecycleEventsEnabled", enabled=True)
        # Every page load waits until this client lets it go.
        self.page("Fetch.enable", patterns=[{"urlPattern": "*", "resourceType": "Document"}])

    def log_tail(self):
        with open(os.path.join(self.profile, "chromium.log"), errors="replace") as f:
            return "".join(f.readlines()[-20:])

    def _read_message(self, deadline):
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProtocolError("no answer from chromium within %ds:\n%s" % (COMMAND_TIMEOUT, self.log_tail()))
            ready, _, _ = select.select([self._answers], [], [], left)
            if ready:
                chunk = os.read(self._answers, 1 << 20)
                if not chunk:
                    raise ProtocolError("chromium closed its pipe:\n" + self.log_tail())
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method, session=None, **params):
        """Sends one command and returns its result; events that arrive
        meanwhile are kept in self.events."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        asked = self._next_id
        deadline = time.monotonic() + COMMAND_TIMEOUT
        while True:
            answer = self._read_message(deadline)
            if answer.get("id") == asked:
                if "error" in answer:
                    raise ProtocolError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self._event(answer)

    def _send(self, method, **params):
        """A command whose answer nobody waits for."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "sessionId": self.session, "params": params}
        os.write(self._commands, json.dumps(message).encode() + b"\0")

    def _event(self, message):
        """Keeps an event; decides on a page load held at the request stage
        (see open): the one open() asked for goes, any other (the page's own
        refresh) is refused, and an aborted load leaves the page as it is."""
        if message.get("method") == "Fetch.requestPaused":
            held = message["params"]
            if held["request"]["url"] == self._expected:
                self._expected = None
                self._send("Fetch.continueRequest", requestId=held["requestId"])
            else:
                self._send("Fetch.failRequest", requestId=held["requestId"], errorReason="Aborted")
        elif "id" not in message:
            self.events.append(message)

    def page(self, method, **params):
        return self.call(method, session=self.session, **params)

    def wait_event(self, method, timeout=COMMAND_TIMEOUT, match=lambda params: True):
        """The first event `method` of the page, with params for which
        `match` holds, since the last wait."""
        deadline = time.monotonic() + timeout
        while True:
            for i, event in enumerate(self.events):
                params = event.get("params", {})
                if event.get("method") == method and event.get("sessionId") == self.session and match(params):
                    del self.events[:i + 1]
                    return params
            self._event(self._read_message(deadline))

    def open(self, url, width, height):
        """Loads `url` in a viewport `width` px wide (a phone's, with its
        viewport meta honoured, below 600 px) and waits for its load. The
        page then stays until the next open: a page that refreshes itself
        would otherwise be replaced while it is measured or photographed
        (a photograph of a long page can take longer than the refresh
        period), so every load but the one asked for is refused. To tell
        them apart, each open adds `look=N` to the query: a refresh asks for
        the address of the page it replaces, which is no longer expected."""
        self._opens += 1
        url += ("&" if "?" in url else "?") + f"look={self._opens}"
        self.page("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=width < 600)
        self._expected = url
        loader = self.page("Page.navigate", url=url)["loaderId"]
        self.wait_event("Page.lifecycleEvent", match=lambda p: p.get("name") == "load" and p.get("loaderId") == loader)

    def evaluate(self, expression):
        result = self.page("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise ProtocolError(f"{expression[:80]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path):
        """The whole page, however long, as a PNG at `path`."""
        metrics = self.page("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": metrics["width"], "height": metrics["height"], "scale": 1}
        data = self.page("Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=clip)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        for fd in (self._commands, self._answers):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                pid, _ = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    break
                time.sleep(0.05)
            else:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

#!/usr/bin/env python3
"""foreground.py COMMAND...: runs COMMAND as a job of its own on the terminal.

`make run` and `make run-router` run the demo through this. A terminal's
Ctrl-C is a SIGINT to its foreground process group, which under make holds
make too; GNU make, interrupted, waits for its recipe and then kills itself
with the same signal, so `make run` exited 130 however cleanly the demo
stopped. Here the demo runs in a process group of its own that the terminal
puts in the foreground: Ctrl-C reaches the demo alone, and its exit status
is make's. What a shell does for a job, this does for the one command:
SIGTERM, SIGHUP and SIGINT sent to it (make passes a SIGTERM on to its
recipe; a shell whose terminal closes sends SIGHUP to make's group) go on to
the command; a Ctrl-Z stops the command and then make's group, which the
shell sees as the job stopping, and `fg` continues both (the demo's own
processes run in groups of their own, so they keep serving meanwhile); the
terminal is given back when the command ends, and its status is this one's.

A terminal that hangs up (a closed window, a dropped ssh) sends SIGHUP to
its session's leader alone. A shell leader sends it on to its jobs, and so
to this process, which passes it on; but make as the leader (`ssh -t host
make run`, `script -c 'make run'`) waits for its recipe, which never heard
it. So this process watches the terminal, and passes a SIGHUP on when it
hangs up, once.

Without a controlling terminal, or when make is not in its foreground
(`make run &`), Ctrl-C cannot reach make: COMMAND simply replaces this
process.
"""

import os
import select
import signal
import sys
import threading

# Signals passed on to the command (a Ctrl-C reaches it directly).
PASSED_ON = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def foreground_terminal():
    """The controlling terminal, open, when this process's group is its
    foreground group; else None."""
    try:
        tty = os.open("/dev/tty", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if os.tcgetpgrp(tty) == os.getpgrp():
            return tty
    except OSError:
        pass
    os.close(tty)
    return None


def give_terminal(tty, group):
    try:
        os.tcsetpgrp(tty, group)
    except OSError:
        pass  # The terminal is gone (hung up): nobody to give it to.


def run_in_foreground(tty, command):
    """Runs `command` as the terminal's foreground job; returns its wait status."""
    # A group not in the foreground that takes the terminal gets SIGTTOU.
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    # Blocked across the fork, so that a signal that comes meanwhile is
    # passed on once the child is there, not run by the child's copy of the
    # handler.
    signal.pthread_sigmask(signal.SIG_BLOCK, PASSED_ON)
    child = os.fork()
    if child == 0:
        os.setpgid(0, 0)
        give_terminal(tty, os.getpgrp())
        os.close(tty)
        signal.signal(signal.SIGTTOU, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, PASSED_ON)
        try:
            os.execvp(command[0], command)
        except OSError as e:
            print(f"foreground.py: cannot run {command[0]}: {e}", file=sys.stderr)
            os._exit(127)

    # Whether a SIGHUP went on already, and whether the child is reaped (its
    # pid may then be another process's): both under one lock, since the
    # hangup watcher passes a SIGHUP on from its own thread.
    passing = threading.RLock()  # a signal handler may run while its own thread holds it
    state = {"hung_up": False, "reaped": False}

    def pass_on(signum, _frame):
        with passing:
            if state["reaped"] or (signum == signal.SIGHUP and state["hung_up"]):
                return
            if signum == signal.SIGHUP:
                state["hung_up"] = True
            try:
                os.kill(child, signum)
            except ProcessLookupError:
                pass

    def watch_for_hangup():
        # POLLHUP is reported however the terminal is polled; asking for
        # nothing else leaves typed input unread and no busy loop.
        terminal = select.poll()
        terminal.register(tty, select.POLLHUP)
        while not terminal.poll():
            pass
        pass_on(signal.SIGHUP, None)

    for signum in PASSED_ON:
        signal.signal(signum, pass_on)
    try:
        os.setpgid(child, child)  # whichever of the two runs first
    except OSError:
        pass  # The child did it and has already exec'd, or is gone.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, PASSED_ON)
    threading.Thread(target=watch_for_hangup, daemon=True).start()
    while True:
        _, status = os.waitpid(child, os.WUNTRACED)
        if not os.WIFSTOPPED(status):
            with passing:
                state["reaped"] = True
            give_terminal(tty, os.getpgrp())
            return status
        # Ctrl-Z stopped the command: stop make's group as well, with the
        # terminal back in its hands, so that the shell sees its job stop;
        # its `fg` continues that group, and with it the command.
        give_terminal(tty, os.getpgrp())
        os.killpg(os.getpgrp(), signal.SIGTSTP)
        give_terminal(tty, child)
        os.killpg(child, signal.SIGCONT)


def main():
    command = sys.argv[1:]
    if not command:
        print("usage: foreground.py COMMAND...", file=sys.stderr)
        return 2
    # Python ignores these; the command must not inherit that.
    for inherited in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(inherited, signal.SIG_DFL)
    tty = foreground_terminal()
    if tty is None:
        os.execvp(command[0], command)
    status = run_in_foreground(tty, command)
    if os.WIFSIGNALED(status):
        # Ended by a signal: so does this process, for make to see it so.
        signum = os.WTERMSIG(status)
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1


if __name__ == "__main__":
    sys.exit(main())

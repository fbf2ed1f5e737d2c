//! The running router's side of a hand-over: ext_proc's listener given to
//! the successor that serves the same port or path (B75). No connection queued on
//! them is reset (B95): each port's new connections are steered to the
//! successor's socket first, and a listener closes only once its accept
//! queue stayed empty; a Unix socket keeps a second name while the
//! successor starts, so that a successor that fails after taking the path
//! does not leave it naming a dead socket (B100).

use std::time::Duration;

use crate::cli::config::ExtprocListen;
use crate::lifecycle::listen::{self, BoundTo};
use crate::lifecycle::socket_path;

/// How long a handover waits for ext_proc's accept queue to empty (B95).
const QUEUE_PATIENCE: Duration = Duration::from_secs(2);

/// Hands ext_proc's listener over: its queue emptied into gRPC, whose
/// shutdown follows.
pub fn hand_over(extproc: &ExtprocListen, bound: &BoundTo) {
    // gRPC core accepts whatever reaches its listeners; once their
    // queues stayed empty, its shutdown closes them with nothing in them.
    let listeners = listen::find_listeners(bound);
    // A Unix socket's successor has renamed its own socket onto the
    // public path: nothing new reaches this one's queue.
    let steered = match bound {
        BoundTo::Inet(_) => listeners.first().map(|&fd| listen::steer_to_successor(fd, listeners.len())),
        BoundTo::Unix(_) => listeners.first().map(|_| Ok(())),
    };
    match steered {
        Some(Ok(())) => {
            for fd in listeners {
                if !listen::wait_emptied(fd, QUEUE_PATIENCE, || ()) {
                    log::warn!("handover: ext_proc's accept queue did not empty within {QUEUE_PATIENCE:?}");
                }
            }
            // A connection gRPC accepted but has not yet answered would
            // be closed unanswered by its shutdown.
            if !listen::wait_answered(bound, QUEUE_PATIENCE) {
                log::warn!(
                    "handover: gRPC had not answered every ext_proc connection within {QUEUE_PATIENCE:?}"
                );
            }
        }
        Some(Err(e)) => {
            log::warn!("handover: cannot steer ext_proc's new connections to the successor: {e}")
        }
        None => {
            log::warn!("handover: ext_proc's listener on {extproc} not found; closing it as it is")
        }
    }
}

/// Before a successor starts on a Unix socket: gives the socket a second
/// name, its private one.
pub fn keep_socket_name(extproc: &ExtprocListen, bound: &BoundTo, inode: Option<u64>) {
    if let (ExtprocListen::Unix(socket), BoundTo::Unix(private), Some(own)) = (extproc, bound, inode) {
        if let Err(e) = socket_path::keep_second_name(&socket.path, private, own) {
            log::warn!(
                "handover: cannot keep a second name for {} ({e}): should the successor fail after \
                 taking the path, the path stays its",
                socket.path.display()
            );
        }
    }
}

/// After a hand-over that failed: takes the socket's path back if the
/// successor took it.
pub fn reclaim_socket_name(extproc: &ExtprocListen, bound: &BoundTo, inode: Option<u64>) {
    if let (ExtprocListen::Unix(socket), BoundTo::Unix(private), Some(own)) = (extproc, bound, inode) {
        match socket_path::reclaim(&socket.path, private, own) {
            Ok(true) => {
                log::warn!("handover: the successor had taken {}; taken back", socket.path.display())
            }
            Ok(false) => {}
            Err(e) => log::error!("handover: cannot take {} back: {e}", socket.path.display()),
        }
    }
}

/// Before a successor starts: lifts the steering this router's own
/// predecessor left on ext_proc's port, so that new connections are hashed
/// over the sockets again rather than sent to the successor before it
/// serves.
pub fn lift_steering(bound: &BoundTo) {
    if let BoundTo::Inet(addr) = bound {
        if let Some(&fd) = listen::find_listeners(bound).first() {
            if let Err(e) = listen::lift_steering(fd) {
                log::warn!("handover: cannot lift the steering on {addr}: {e}");
            }
        }
    }
}

//! systemd's notify protocol (B64), written by hand: one datagram per state
//! change to the socket named in `NOTIFY_SOCKET`.
//!
//! With `Type=notify` the unit is started only once the router says
//! `READY=1`, after every listener is bound, so units ordered after it (and
//! `systemctl start` itself) never see a router that refuses connections.
//! `STOPPING=1` marks the start of a drain, and `EXTEND_TIMEOUT_USEC` keeps
//! systemd's stop timeout ahead of a long drain instead of killing it.

use std::io;
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// Where notifications go; does nothing when not started by systemd.
pub struct Notifier {
    socket: Option<(UnixDatagram, String)>,
}

impl Notifier {
    /// The notifier `NOTIFY_SOCKET` asks for: a path, or an abstract socket
    /// (`@name`). Without it, every notification is a no-op.
    pub fn from_env() -> Notifier {
        let target = std::env::var("NOTIFY_SOCKET").ok().filter(|t| !t.is_empty());
        let socket = target.and_then(|target| UnixDatagram::unbound().ok().map(|s| (s, target)));
        Notifier { socket }
    }

    /// Sends one notification (`KEY=value` lines).
    pub fn notify(&self, state: &str) -> io::Result<()> {
        let Some((socket, target)) = &self.socket else { return Ok(()) };
        match target.strip_prefix('@') {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
                socket.send_to_addr(state.as_bytes(), &addr)?;
            }
            None => {
                socket.send_to(state.as_bytes(), target)?;
            }
        }
        Ok(())
    }

    /// Every listener is bound: systemd may consider the service started.
    pub fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={status}\nMAINPID={}", std::process::id()));
    }

    /// A drain started; it may take up to `bound`.
    pub fn stopping(&self, bound: Duration) {
        self.send(&format!("STOPPING=1\nSTATUS=draining\nEXTEND_TIMEOUT_USEC={}", micros(bound)));
    }

    /// The drain needs at most `bound` more.
    pub fn extend(&self, bound: Duration) {
        self.send(&format!("EXTEND_TIMEOUT_USEC={}", micros(bound)));
    }

    fn send(&self, state: &str) {
        if let Err(e) = self.notify(state) {
            log::warn!("systemd notification failed: {e}");
        }
    }
}

fn micros(d: Duration) -> u128 {
    d.as_micros()
}

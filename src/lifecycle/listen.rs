//! Listening sockets that a successor can share during a handover (B75).
//!
//! Every listener binds with `SO_REUSEPORT`, so that a router started by
//! `SIGHUP` can bind the same ports while its predecessor still serves. So
//! that a second router started by mistake still fails at once rather than
//! share the ports silently, a router that is not a successor first checks
//! each port with a plain bind: a port held by any listener refuses it. It
//! checks and binds under the port's start lock (`start_lock`), so that two
//! routers started at the same instant do not both pass the check.
//!
//! Closing a listener resets the connections queued in its accept queue,
//! and with `SO_REUSEPORT` the kernel keeps steering a share of the new
//! connections to every socket of the port until it closes. So a router
//! that hands over first steers its ports' new connections to the
//! successor's sockets (a classic BPF program on the port's group that
//! picks the first socket after its own: the kernel keeps a group's
//! sockets in the order they joined, filling a hole with the last one, so
//! while the router's own sockets are the group's first, the successor's
//! come right after them), then empties its own queues, and only then
//! closes (B95). gRPC core listens on one socket per poller (two on two
//! cores) of the ext_proc port. The program stays on the group
//! after the predecessor leaves, where it picks an index that no longer
//! exists, which makes the kernel fall back to its hash: a router lifts it
//! before it starts a successor of its own.
//!
//! A Unix socket (B100) needs no steering: the successor's rename of its
//! socket onto the public path moves every new connection to it at once,
//! and the predecessor empties its queue the same way.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Fails with `AddrInUse` when something listens on `addr` already (port 0
/// is always free).
pub fn ensure_free(addr: SocketAddr) -> io::Result<()> {
    if addr.port() == 0 {
        return Ok(());
    }
    TcpListener::bind(addr).map(drop)
}

/// A listener on `addr` with `SO_REUSEADDR` and `SO_REUSEPORT`.
pub fn shared(addr: SocketAddr) -> io::Result<TcpListener> {
    let domain = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: socket(2) with constant arguments; the descriptor is owned
    // at once, so it is closed on every path.
    let fd = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    for option in [libc::SO_REUSEADDR, libc::SO_REUSEPORT] {
        let on: libc::c_int = 1;
        // SAFETY: setsockopt reads one c_int from a valid pointer.
        let r = unsafe {
            libc::setsockopt(
                raw,
                libc::SOL_SOCKET,
                option,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    let (storage, len) = sockaddr(addr);
    // SAFETY: bind reads `len` bytes of a sockaddr that `storage` holds.
    if unsafe { libc::bind(raw, (&storage as *const libc::sockaddr_storage).cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: listen on a bound socket.
    if unsafe { libc::listen(raw, 1024) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(TcpListener::from(fd))
}

/// Steers the new connections of the `SO_REUSEPORT` group `listener`
/// belongs to onto the group's socket at index `own`: when the router's
/// `own` sockets are the group's first, the successor's first (B95).
/// Connections already queued on the router's sockets stay there, to be
/// accepted.
pub fn steer_to_successor(listener: RawFd, own: usize) -> io::Result<()> {
    // BPF_RET | BPF_K: return the constant `own`, the index in the group
    // of the socket that takes the connection (an index past the group's
    // end falls back to the hash).
    let index = u32::try_from(own).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut program = [libc::sock_filter { code: 0x06, jt: 0, jf: 0, k: index }];
    let fprog = libc::sock_fprog { len: 1, filter: program.as_mut_ptr() };
    // SAFETY: setsockopt reads one sock_fprog, whose filter points to
    // `program`, which outlives the call (the kernel copies it).
    let r = unsafe {
        libc::setsockopt(
            listener,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Lifts a predecessor's steering from `listener`'s group, so that the
/// kernel hashes new connections over its sockets again (none: nothing
/// to do).
pub fn lift_steering(listener: RawFd) -> io::Result<()> {
    let zero: libc::c_int = 0;
    // SAFETY: setsockopt reads one c_int (ignored) from a valid pointer.
    let r = unsafe {
        libc::setsockopt(
            listener,
            libc::SOL_SOCKET,
            libc::SO_DETACH_REUSEPORT_BPF,
            (&zero as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    match r {
        0 => Ok(()),
        _ => match io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            e => Err(e),
        },
    }
}

/// What a listening socket is bound to, as `getsockname(2)` says: an
/// address and port, or the path a Unix socket was bound at (which a
/// rename does not change; a connection it accepted says the same).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BoundTo {
    Inet(SocketAddr),
    Unix(PathBuf),
}

/// The connections waiting in `listener`'s accept queue now (for a
/// listening TCP socket, TCP_INFO's `tcpi_unacked`). For a Unix socket,
/// whose queue length only sock_diag tells, 1 while any waits (a listening
/// socket is readable while its queue holds a connection), else 0.
pub fn queued(listener: RawFd) -> io::Result<u32> {
    if matches!(bound_to(listener), Some(BoundTo::Unix(_))) {
        let mut fd = libc::pollfd { fd: listener, events: libc::POLLIN, revents: 0 };
        // SAFETY: poll reads and writes one pollfd; a zero timeout never blocks.
        return match unsafe { libc::poll(&mut fd, 1, 0) } {
            r if r < 0 => Err(io::Error::last_os_error()),
            _ if fd.revents & libc::POLLNVAL != 0 => Err(io::Error::from_raw_os_error(libc::EBADF)),
            _ => Ok(u32::from(fd.revents & libc::POLLIN != 0)),
        };
    }
    // SAFETY: all-zero is a valid tcp_info.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `info`.
    let r = unsafe {
        libc::getsockopt(
            listener,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(info.tcpi_unacked)
}

/// How often, and how many times in a row, a queue must be seen empty
/// before it counts as emptied: a handshake under way when the steering
/// began still lands in it, one round trip later.
const SETTLE_CHECK: Duration = Duration::from_millis(20);
const SETTLE_CHECKS: u32 = 3;

/// Waits, at most `patience`, until `listener`'s accept queue has stayed
/// empty for a few checks in a row, calling `accept` before each check
/// (whoever owns the listener empties it). Whether it emptied.
pub fn wait_emptied(listener: RawFd, patience: Duration, mut accept: impl FnMut()) -> bool {
    let deadline = Instant::now() + patience;
    let mut empty = 0;
    while Instant::now() < deadline {
        accept();
        match queued(listener) {
            Ok(0) => empty += 1,
            Ok(_) => empty = 0,
            Err(_) => return false,
        }
        if empty >= SETTLE_CHECKS {
            return true;
        }
        std::thread::sleep(SETTLE_CHECK);
    }
    false
}

/// The descriptors of this process's listening sockets bound to
/// `addr`: how the router finds gRPC core's ext_proc listeners, which
/// grpcio does not expose.
pub fn find_listeners(addr: &BoundTo) -> Vec<RawFd> {
    sockets_on(addr, true)
}

/// How many of this process's connected sockets have `addr` as their
/// local address: the connections a listener on `addr` accepted and that
/// are still open.
pub fn connections_on(addr: &BoundTo) -> usize {
    connected_on(addr).len()
}

/// How many of the connections on `addr` this process has sent nothing on
/// that their peer acknowledged: for gRPC core, connections it accepted
/// whose transport has not yet sent its SETTINGS, a server's first bytes,
/// which it sends without waiting for the client (B95). A Unix socket's
/// connection counts as answered: nothing tells.
pub fn unanswered_on(addr: &BoundTo) -> usize {
    connected_on(addr)
        .into_iter()
        .filter(|&fd| {
            // SAFETY: all-zero is a valid tcp_info.
            let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
            // SAFETY: getsockopt writes at most `len` bytes into `info`; on
            // a socket that is not TCP it fails and nothing is read.
            let r = unsafe {
                libc::getsockopt(
                    fd,
                    libc::IPPROTO_TCP,
                    libc::TCP_INFO,
                    (&mut info as *mut libc::tcp_info).cast(),
                    &mut len,
                )
            };
            // A kernel too old to say (before 4.2's tcpi_bytes_acked) writes less.
            let says = len as usize >= std::mem::offset_of!(libc::tcp_info, tcpi_bytes_acked) + 8;
            r == 0 && says && info.tcpi_bytes_acked == 0
        })
        .count()
}

/// Waits, at most `patience`, until every connection on `addr` has been
/// answered ([`unanswered_on`]). Whether they were.
pub fn wait_answered(addr: &BoundTo, patience: Duration) -> bool {
    let deadline = Instant::now() + patience;
    while unanswered_on(addr) > 0 {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(SETTLE_CHECK);
    }
    true
}

/// This process's connected sockets whose local address is `addr`.
fn connected_on(addr: &BoundTo) -> Vec<RawFd> {
    sockets_on(addr, false)
}

/// This process's sockets bound to `addr` that listen (or, with
/// `listening` false, that are connected).
fn sockets_on(addr: &BoundTo, listening: bool) -> Vec<RawFd> {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else { return Vec::new() };
    let fds: Vec<RawFd> = entries.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect();
    fds.into_iter()
        .filter(|&fd| {
            let mut accepts: libc::c_int = -1;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: getsockopt writes one c_int; on a descriptor that is not
            // a socket (or already closed) it fails and nothing is written.
            let r = unsafe {
                libc::getsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_ACCEPTCONN,
                    (&mut accepts as *mut libc::c_int).cast(),
                    &mut len,
                )
            };
            r == 0 && accepts == libc::c_int::from(listening) && bound_to(fd).as_ref() == Some(addr)
        })
        .collect()
}

fn bound_to(fd: RawFd) -> Option<BoundTo> {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: getsockname writes at most `len` bytes into `storage`.
    if unsafe { libc::getsockname(fd, (&mut storage as *mut libc::sockaddr_storage).cast(), &mut len) } != 0 {
        return None;
    }
    match storage.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in.
            let sin: libc::sockaddr_in =
                unsafe { std::ptr::read((&storage as *const libc::sockaddr_storage).cast()) };
            let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(BoundTo::Inet(SocketAddr::new(ip.into(), u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the kernel wrote a sockaddr_in6.
            let sin6: libc::sockaddr_in6 =
                unsafe { std::ptr::read((&storage as *const libc::sockaddr_storage).cast()) };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            // gRPC core binds an IPv4 address as its v4-mapped IPv6 one.
            let ip = ip.to_ipv4_mapped().map_or(std::net::IpAddr::V6(ip), std::net::IpAddr::V4);
            Some(BoundTo::Inet(SocketAddr::new(ip, u16::from_be(sin6.sin6_port))))
        }
        libc::AF_UNIX => {
            // SAFETY: the kernel wrote a sockaddr_un, `len` bytes of it.
            let sun: libc::sockaddr_un =
                unsafe { std::ptr::read((&storage as *const libc::sockaddr_storage).cast()) };
            let offset = std::mem::size_of::<libc::sa_family_t>();
            let written = (len as usize).saturating_sub(offset).min(sun.sun_path.len());
            let path: Vec<u8> =
                sun.sun_path[..written].iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
            // An unnamed socket (a client's) or an abstract one has no path.
            (!path.is_empty()).then(|| BoundTo::Unix(PathBuf::from(std::ffi::OsStr::from_bytes(&path))))
        }
        _ => None,
    }
}

fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(v4.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: v6.ip().octets() },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn b75_two_shared_listeners_on_one_port_and_a_plain_check_refused() {
        let first = shared("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = first.local_addr().unwrap();
        let second = shared(addr).expect("a successor binds beside its predecessor");
        assert_eq!(second.local_addr().unwrap(), addr);
        assert_eq!(ensure_free(addr).unwrap_err().kind(), io::ErrorKind::AddrInUse, "not free: held");
        drop((first, second));
        ensure_free(addr).expect("free once both are gone");
        let v6 = shared("[::1]:0".parse().unwrap()).unwrap();
        assert!(v6.local_addr().unwrap().is_ipv6());
    }

    #[test]
    fn b95_an_accepted_connection_is_answered_once_its_peer_acknowledged_a_byte() {
        use std::io::Write;
        let listener = shared("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = BoundTo::Inet(listener.local_addr().unwrap());
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut accepted, _) = listener.accept().unwrap();
        assert_eq!((connections_on(&addr), unanswered_on(&addr)), (1, 1), "accepted, nothing sent");
        assert!(!wait_answered(&addr, Duration::from_millis(100)));
        accepted.write_all(b"x").unwrap();
        assert!(wait_answered(&addr, Duration::from_secs(5)), "answered once the byte was acknowledged");
        assert_eq!(unanswered_on(&addr), 0);
    }

    #[test]
    fn b95_steered_connections_queue_on_the_successor_and_a_lifted_group_hashes_again() {
        let old = shared("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = old.local_addr().unwrap();
        let new = shared(addr).unwrap();
        // In descriptor order, which other tests' sockets closing meanwhile may swap.
        let mut found = find_listeners(&BoundTo::Inet(addr));
        found.sort_unstable();
        let mut both = [old.as_raw_fd(), new.as_raw_fd()];
        both.sort_unstable();
        assert_eq!(found, both, "both in this process");
        steer_to_successor(old.as_raw_fd(), 1).unwrap();
        let clients: Vec<_> = (0..20).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
        let seen = |l: &TcpListener| queued(l.as_raw_fd()).unwrap();
        assert!(wait_emptied(old.as_raw_fd(), Duration::from_secs(5), || ()), "nothing queued on the old");
        assert!(!wait_emptied(new.as_raw_fd(), Duration::from_millis(100), || ()), "20 queued on the new");
        assert_eq!((seen(&old), seen(&new)), (0, 20), "every new connection went to the successor");
        lift_steering(old.as_raw_fd()).unwrap();
        lift_steering(old.as_raw_fd()).expect("lifting nothing is no error");
        let more: Vec<_> = (0..64).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
        assert!(seen(&old) > 0 && seen(&new) > 20, "hashed over both again: {} {}", seen(&old), seen(&new));
        drop((clients, more));
    }
}

//! Listening sockets that a successor can share during a handover (B75).
//!
//! Every listener binds with `SO_REUSEPORT`, so that a router started by
//! `SIGHUP` can bind the same ports while its predecessor still serves. So
//! that a second router started by mistake still fails at once rather than
//! share the ports silently, a router that is not a successor first checks
//! each port with a plain bind: a port held by any listener refuses it.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{FromRawFd, OwnedFd};

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
}

//! The ext_proc listener: where it listens (TCP, or a Unix socket beside
//! Envoy), its transport, and how much it takes at once.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use super::{atespace_share, derived_breaker, derived_stream_cap, Parking};
use crate::cli::flags::ServeArgs;
use crate::cli::values::{invalid, listen_port, non_empty, socket_addr, ConfigError};
use crate::parking::share::SharePolicy;

/// The socket's mode when `--extproc-socket-mode` is not given: Envoy's
/// user reaches it through the group.
const DEFAULT_SOCKET_MODE: u32 = 0o660;

/// The longest path a `sockaddr_un` holds (108 bytes with the NUL).
const SUN_PATH_MAX: usize = 107;

/// What a router appends to the public path for the name it binds before
/// renaming the socket onto it (B100): a dot and a pid (Linux caps pids
/// at 4,194,304; a u32 has at most 10 digits).
const PRIVATE_SUFFIX_MAX: usize = 11;

/// The most completion-queue threads `--grpc-threads` may ask for: far more
/// than any core count this service sees, and few enough that a typo cannot
/// start thousands of threads.
const MAX_GRPC_THREADS: usize = 256;

/// The ext_proc server's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct ExtProc {
    /// Where ext_proc listens: TCP, or a Unix socket.
    pub listen: ExtprocListen,
    /// TLS on the listener; `None` is plaintext, which only loopback, a Unix
    /// socket or `--extproc-insecure` allows.
    pub tls: Option<ExtprocTls>,
    /// `--extproc-insecure`: plaintext off the loopback, knowingly.
    pub insecure: bool,
    /// Envoy's circuit breaker for the ext_proc cluster.
    pub max_requests: u64,
    /// Requests one atespace may hold at once, on any attempt.
    pub max_requests_per_atespace: SharePolicy,
    /// Open ext_proc streams at most.
    pub max_streams: usize,
    /// gRPC completion-queue threads.
    pub grpc_threads: usize,
}

/// The ext_proc listener's TLS files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtprocTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// With it, only clients with a certificate these CAs signed get in.
    pub client_ca_file: Option<PathBuf>,
}

/// Where the ext_proc server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtprocListen {
    /// A TCP address: `--extproc-address` and `--port-extproc`.
    Tcp(SocketAddr),
    /// A Unix socket beside Envoy: `--extproc-address unix:PATH`.
    Unix(UnixSocket),
}

impl ExtprocListen {
    /// The TCP address, when ext_proc listens on one.
    pub fn tcp(&self) -> Option<SocketAddr> {
        match self {
            ExtprocListen::Tcp(addr) => Some(*addr),
            ExtprocListen::Unix(_) => None,
        }
    }
}

impl fmt::Display for ExtprocListen {
    /// As the flag takes it, and as the startup line names it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExtprocListen::Tcp(addr) => write!(f, "{addr}"),
            ExtprocListen::Unix(socket) => write!(f, "unix:{}", socket.path.display()),
        }
    }
}

/// A Unix socket for ext_proc: its public path, and the mode and group it
/// has from the moment that path names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnixSocket {
    /// Absolute; short enough for `sun_path` with a private suffix.
    pub path: PathBuf,
    /// Permission bits, at most 0o777.
    pub mode: u32,
    /// The group the socket is given; `None`: the router's own.
    pub group: Option<u32>,
}

impl ExtProc {
    /// The listener's flags. Its capacities follow the lot (the breaker
    /// must hold every parked request) and the number of Envoys (each may
    /// hold its breaker's worth of streams).
    pub(super) fn from_args(
        args: &ServeArgs,
        parking: &Parking,
        envoys: u32,
    ) -> Result<ExtProc, ConfigError> {
        let max_requests = max_requests(args, parking)?;
        let listen = listen(args)?;
        let tls = match &listen {
            ExtprocListen::Tcp(addr) => tls(args, *addr)?,
            ExtprocListen::Unix(_) => None,
        };
        Ok(ExtProc {
            listen,
            tls,
            insecure: args.extproc_insecure,
            max_requests,
            max_streams: stream_cap(args.extproc_max_streams, max_requests, envoys)?,
            max_requests_per_atespace: atespace_share(
                "--extproc-max-requests-per-atespace",
                args.extproc_max_requests_per_atespace,
                "--extproc-max-requests",
                max_requests,
            )?,
            grpc_threads: grpc_threads(args.grpc_threads)?,
        })
    }
}

/// Envoy's ext_proc circuit breaker: never below the lot while parking is
/// on, or Envoy would shed what the lot would park.
fn max_requests(args: &ServeArgs, parking: &Parking) -> Result<u64, ConfigError> {
    let lot = parking.max;
    let breaker = u64::try_from(args.extproc_max_requests).map_err(|_| {
        invalid(format!("--extproc-max-requests must not be negative, got {}", args.extproc_max_requests))
    })?;
    if breaker > u64::from(u32::MAX) {
        return Err(invalid(format!(
            "--extproc-max-requests must be at most {} (Envoy's max_requests is a 32-bit count), got {breaker}",
            u32::MAX
        )));
    }
    if parking.enabled && breaker > 0 && breaker < lot as u64 {
        return Err(invalid(format!(
            "--extproc-max-requests ({breaker}) is below --parked-request-max ({lot}): \
             Envoy would shed parked requests with its own 503s before they reach the lot"
        )));
    }
    Ok(if breaker > 0 { breaker } else { derived_breaker(lot) })
}

/// `--extproc-max-streams`: 0 derives it; below the breaker, Envoy could
/// hold streams the router refuses.
fn stream_cap(flag: i64, breaker: u64, envoys: u32) -> Result<usize, ConfigError> {
    match u64::try_from(flag) {
        Ok(0) => Ok(derived_stream_cap(breaker, envoys)),
        Ok(n) if n >= breaker => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
        _ => Err(invalid(format!(
            "--extproc-max-streams must be 0 ((--envoys + 1) x the circuit breaker) or at least the ext_proc \
             circuit breaker ({breaker}, --extproc-max-requests): Envoy may hold that many streams open, got {flag}"
        ))),
    }
}

/// `--grpc-threads` (B72): 0 is one per core this process may run on.
fn grpc_threads(flag: i64) -> Result<usize, ConfigError> {
    match usize::try_from(flag) {
        Ok(0) => Ok(std::thread::available_parallelism().map_or(2, |n| n.get()).min(MAX_GRPC_THREADS)),
        Ok(n) if n <= MAX_GRPC_THREADS => Ok(n),
        _ => Err(invalid(format!(
            "--grpc-threads must be 0 (one per core) or 1..={MAX_GRPC_THREADS}, got {flag}"
        ))),
    }
}

/// Where ext_proc listens (B98): `--extproc-address unix:PATH` is a Unix
/// socket, anything else a host with `--port-extproc`. The socket's own
/// flags mean nothing on TCP, and what only TCP needs means nothing on a
/// socket: each is refused where it does not apply rather than ignored.
fn listen(args: &ServeArgs) -> Result<ExtprocListen, ConfigError> {
    let address = args.extproc_address.trim();
    let (mode, group) = (non_empty(&args.extproc_socket_mode), non_empty(&args.extproc_socket_group));
    let Some(path) = address.strip_prefix("unix:") else {
        for (flag, given) in [("--extproc-socket-mode", &mode), ("--extproc-socket-group", &group)] {
            if given.is_some() {
                return Err(invalid(format!("{flag} needs a Unix socket: --extproc-address unix:PATH")));
            }
        }
        let port = listen_port("--port-extproc", args.port_extproc.unwrap_or(50051))?;
        return socket_addr("--extproc-address", address, port).map(ExtprocListen::Tcp);
    };
    let socket_only = |flag: &str, why: &str| invalid(format!("--extproc-address {address}: {flag} {why}"));
    if args.port_extproc.is_some() {
        return Err(socket_only("--port-extproc", "names a TCP port; a Unix socket has none"));
    }
    if args.extproc_insecure {
        return Err(socket_only(
            "--extproc-insecure",
            "is for plaintext off the loopback; a Unix socket is local, its mode says who connects",
        ));
    }
    let tls_flag = [
        ("--extproc-cert-file", &args.extproc_cert_file),
        ("--extproc-key-file", &args.extproc_key_file),
        ("--extproc-client-ca-file", &args.extproc_client_ca_file),
    ]
    .into_iter()
    .find(|(_, v)| !v.trim().is_empty());
    if let Some((flag, _)) = tls_flag {
        return Err(socket_only(
            flag,
            "is refused: TLS on a Unix socket protects nothing its mode does not (only this host's \
             processes can reach it), and costs what the socket saves",
        ));
    }
    if path.chars().any(|c| c.is_control() || c == '"' || c == '\\') {
        return Err(invalid(format!(
            "--extproc-address {address:?}: the socket's path must not hold control characters, '\"' or '\\' \
             (the bootstrap quotes it)"
        )));
    }
    let path = PathBuf::from(path);
    if !path.is_absolute() {
        return Err(invalid(format!(
            "--extproc-address {address}: the socket's path must be absolute (Envoy resolves it from its own \
             working directory)"
        )));
    }
    if path.as_os_str().len() + PRIVATE_SUFFIX_MAX > SUN_PATH_MAX || path.file_name().is_none() {
        return Err(invalid(format!(
            "--extproc-address {address}: a socket's path holds at most {} bytes (the router binds it with \
             a suffix of up to {PRIVATE_SUFFIX_MAX} first)",
            SUN_PATH_MAX - PRIVATE_SUFFIX_MAX
        )));
    }
    let mode = match mode {
        None => DEFAULT_SOCKET_MODE,
        Some(text) => u32::from_str_radix(&text, 8)
            .ok()
            .filter(|&m| m <= 0o777 && !text.starts_with(['+', '-']))
            .ok_or_else(|| {
                invalid(format!(
                    "--extproc-socket-mode must be octal permission bits, 0 to 0777, got {text:?}"
                ))
            })?,
    };
    let group = group.map(|g| group_id(&g)).transpose()?;
    Ok(ExtprocListen::Unix(UnixSocket { path, mode, group }))
}

/// A group's id from its number or its name (the group database, as
/// `getgrnam(3)` reads it).
fn group_id(group: &str) -> Result<u32, ConfigError> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    let unknown = || invalid(format!("--extproc-socket-group: no group {group:?}"));
    let name = std::ffi::CString::new(group).map_err(|_| unknown())?;
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: all-zero is a valid `group`; getgrnam_r writes into it and
    // into `buf`, whose length it is told, and sets `found` to it or null.
    let mut entry: libc::group = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::group = std::ptr::null_mut();
    let r = unsafe {
        libc::getgrnam_r(name.as_ptr(), &mut entry, buf.as_mut_ptr().cast(), buf.len(), &mut found)
    };
    if r != 0 || found.is_null() {
        return Err(unknown());
    }
    Ok(entry.gr_gid)
}

/// The listener's transport (B86): TLS from a certificate and its key (and,
/// optionally, a client CA), or plaintext, which off the loopback needs
/// `--extproc-insecure`: anyone who reaches the port could route requests
/// and read their headers.
fn tls(args: &ServeArgs, addr: SocketAddr) -> Result<Option<ExtprocTls>, ConfigError> {
    let (cert, key, ca) = (
        non_empty(&args.extproc_cert_file),
        non_empty(&args.extproc_key_file),
        non_empty(&args.extproc_client_ca_file),
    );
    if args.extproc_insecure {
        let given: Vec<&str> =
            [("--extproc-cert-file", &cert), ("--extproc-key-file", &key), ("--extproc-client-ca-file", &ca)]
                .into_iter()
                .filter(|(_, v)| v.is_some())
                .map(|(flag, _)| flag)
                .collect();
        if !given.is_empty() {
            return Err(invalid(format!("--extproc-insecure cannot be combined with {}", given.join(", "))));
        }
    }
    let tls =
        match (cert, key) {
            (Some(cert), Some(key)) => Some(ExtprocTls {
                cert_file: PathBuf::from(cert),
                key_file: PathBuf::from(key),
                client_ca_file: ca.map(PathBuf::from),
            }),
            (None, None) if ca.is_some() => return Err(invalid(
                "--extproc-client-ca-file needs TLS on ext_proc: --extproc-cert-file and --extproc-key-file",
            )),
            (None, None) => None,
            (Some(_), None) => {
                return Err(invalid("--extproc-cert-file needs --extproc-key-file (its private key)"))
            }
            (None, Some(_)) => {
                return Err(invalid("--extproc-key-file needs --extproc-cert-file (its certificate)"))
            }
        };
    if tls.is_none() && !addr.ip().is_loopback() && !args.extproc_insecure {
        return Err(invalid(format!(
            "--extproc-address {} is not loopback: ext_proc there needs TLS (--extproc-cert-file and \
             --extproc-key-file, and --extproc-client-ca-file so that only Envoys get in), or \
             --extproc-insecure to accept that anyone who reaches the port can route requests and read \
             their headers",
            addr.ip()
        )));
    }
    Ok(tls)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::config::tests::{error, parse};

    #[test]
    fn b74_stream_cap() {
        let streams = |args: &[&str]| parse(args).unwrap().extproc.max_streams;
        assert_eq!(streams(&["--parked-request-max", "4000"]), 16_000, "2 x 8000");
        assert_eq!(streams(&["--parked-request-max", "0"]), 2048, "2 x 1024");
        assert_eq!(
            streams(&[
                "--parked-request-max",
                "10",
                "--extproc-max-requests",
                "10",
                "--extproc-max-streams",
                "10"
            ]),
            10,
            "the breaker itself is enough"
        );
        let fleet = parse(&["--envoys", "3"]).unwrap();
        assert_eq!((fleet.drain.envoys, fleet.extproc.max_streams), (3, 8192), "B85: (3 + 1) x 2048");
        assert!(fleet.drain.is_fleet_router() && !parse(&[]).unwrap().drain.is_fleet_router());
        assert_eq!(streams(&["--envoys", "1024"]), 1025 * 2048);
        for bad in ["0", "-1", "1025", "x"] {
            assert!(error(&["--envoys", bad]).contains("--envoys"), "{bad}");
        }
        for bad in ["9", "-1"] {
            let e = error(&[
                "--parked-request-max",
                "10",
                "--extproc-max-requests",
                "10",
                "--extproc-max-streams",
                bad,
            ]);
            assert!(
                e.contains("--extproc-max-streams must be 0") && e.contains("(10, --extproc-max-requests)"),
                "{e}"
            );
        }
    }

    #[test]
    fn b72_grpc_threads_default_to_the_cores_and_take_1_to_256() {
        let cores = std::thread::available_parallelism().unwrap().get().min(MAX_GRPC_THREADS);
        let threads = |args: &[&str]| parse(args).unwrap().extproc.grpc_threads;
        assert_eq!(threads(&[]), cores);
        assert_eq!(threads(&["--grpc-threads", "0"]), cores);
        assert_eq!(threads(&["--grpc-threads", "1"]), 1);
        assert_eq!(threads(&["--grpc-threads", "256"]), 256);
        for bad in ["-1", "257", "9223372036854775807"] {
            let e = error(&["--grpc-threads", bad]);
            assert!(e.contains("--grpc-threads") && e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn b86_ext_proc_off_the_loopback_needs_tls_or_the_explicit_flag() {
        let e = error(&["--extproc-address", "0.0.0.0"]);
        assert!(
            e.contains("--extproc-address 0.0.0.0 is not loopback") && e.contains("--extproc-insecure"),
            "{e}"
        );
        let insecure = parse(&["--extproc-address", "0.0.0.0", "--extproc-insecure"]).unwrap().extproc;
        assert!(insecure.tls.is_none() && insecure.insecure);
        let tls =
            parse(&["--extproc-address", "::", "--extproc-cert-file", "/c", "--extproc-key-file", "/k"])
                .unwrap();
        assert_eq!(
            tls.extproc.tls,
            Some(ExtprocTls { cert_file: "/c".into(), key_file: "/k".into(), client_ca_file: None })
        );
        assert!(parse(&["--extproc-cert-file", "/c", "--extproc-key-file", "/k"])
            .unwrap()
            .extproc
            .tls
            .is_some());
        for (args, flag) in [
            (&["--extproc-cert-file", "/c"][..], "--extproc-key-file"),
            (&["--extproc-key-file", "/k"][..], "--extproc-cert-file"),
            (&["--extproc-client-ca-file", "/ca"][..], "--extproc-client-ca-file"),
            (
                &["--extproc-insecure", "--extproc-cert-file", "/c", "--extproc-key-file", "/k"][..],
                "--extproc-insecure",
            ),
        ] {
            assert!(error(args).contains(flag), "{args:?}");
        }
    }

    #[test]
    fn b98_a_unix_socket_and_the_flags_that_mean_nothing_there() {
        let c = parse(&["--extproc-address", "unix:/run/atenet/extproc.sock"]).unwrap().extproc;
        let socket = UnixSocket { path: "/run/atenet/extproc.sock".into(), mode: 0o660, group: None };
        assert_eq!(c.listen, ExtprocListen::Unix(socket));
        assert_eq!(c.listen.to_string(), "unix:/run/atenet/extproc.sock");
        assert!(c.tls.is_none(), "plaintext, local (B86)");
        let c =
            parse(&["--extproc-address=unix:/s", "--extproc-socket-mode=0600", "--extproc-socket-group=0"]);
        let ExtprocListen::Unix(socket) = c.unwrap().extproc.listen else { panic!("a socket") };
        assert_eq!((socket.mode, socket.group), (0o600, Some(0)));
        let refused = [
            (&["--extproc-address", "unix:/s", "--port-extproc", "50051"][..], "--port-extproc"),
            (&["--extproc-address", "unix:/s", "--extproc-insecure"], "--extproc-insecure"),
            (&["--extproc-address", "unix:/s", "--extproc-cert-file", "c", "--extproc-key-file", "k"], "TLS"),
            (&["--extproc-address", "unix:/s", "--extproc-client-ca-file", "ca"], "--extproc-client-ca-file"),
            (&["--extproc-address", "unix:relative.sock"], "absolute"),
            (&["--extproc-address", "unix:"], "absolute"),
            (&["--extproc-address", "unix:/a\"b"], "must not hold"),
            (&["--extproc-address", "unix:/s", "--extproc-socket-mode", "1777"], "--extproc-socket-mode"),
            (&["--extproc-address", "unix:/s", "--extproc-socket-mode", "rw"], "--extproc-socket-mode"),
            (&["--extproc-address", "unix:/s", "--extproc-socket-mode", "+660"], "--extproc-socket-mode"),
            (&["--extproc-address", "unix:/s", "--extproc-socket-group", "no-such-group-here"], "no group"),
            (&["--extproc-socket-mode", "0660"], "needs a Unix socket"),
            (&["--extproc-socket-group", "0"], "needs a Unix socket"),
        ];
        for (flags, says) in refused {
            let e = error(flags);
            assert!(e.contains(says), "{flags:?}: {e}");
        }
        let longest = format!("unix:/{}", "a".repeat(SUN_PATH_MAX - PRIVATE_SUFFIX_MAX - 1));
        parse(&["--extproc-address", &longest]).expect("fits sun_path with its suffix");
        let e = error(&["--extproc-address", &format!("{longest}a")]);
        assert!(e.contains("at most 96 bytes"), "{e}");
        let tcp = parse(&["--port-extproc", "50052"]).unwrap();
        assert_eq!(tcp.extproc.listen.tcp(), Some("127.0.0.1:50052".parse().unwrap()));
    }
}

//! The status page, `/statusz` on `--status-port` (B42): what the router is
//! doing now, for a person (HTML) or a program (JSON).
//!
//! It shows counts and names only. Request headers other than the method and
//! the path never reach it, and the path loses its query string before it is
//! stored, so no authorization, cookie, query string or token can appear.

use std::fmt::Write;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

use crate::ateapi::client::AteapiClient;
use crate::cli::config::{AteapiTransport, Config};
use crate::cli::godur;
use crate::ops::http::{Handler, Reply, Request};
use crate::parking::lot::AtespaceView;
use crate::ops::logging::json_string;
use crate::ops::metrics::Metrics;
use crate::parking::resolver::Resolver;
use crate::ateapi::resume::Code;

/// How many atespaces the page lists (B69).
const TOP_ATESPACES: usize = 20;

/// How many recent requests the page keeps.
pub const RECENT_CAPACITY: usize = 100;
/// Longest path kept per request.
const MAX_PATH: usize = 200;

/// One answered request.
#[derive(Clone, Debug)]
pub struct RecentRequest {
    pub at: SystemTime,
    pub method: String,
    /// The path without its query string.
    pub path: String,
    pub actor: String,
    pub verdict: RecentVerdict,
    /// The worker address when routed.
    pub target: String,
    pub duration: Duration,
}

/// How a recent request was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecentVerdict {
    Routed,
    /// The status and reason token of a rejection.
    Rejected { status: u16, reason: &'static str },
}

impl std::fmt::Display for RecentVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecentVerdict::Routed => f.write_str("200 routed"),
            RecentVerdict::Rejected { status, reason } => write!(f, "{status} {reason}"),
        }
    }
}

/// A request as the extproc service saw it, borrowed for [`RecentRequests::record`].
pub struct Answered<'a> {
    pub method: &'a [u8],
    pub path: &'a [u8],
    pub actor: &'a str,
    pub verdict: RecentVerdict,
    pub target: &'a str,
    pub duration: Duration,
}

/// The last [`RECENT_CAPACITY`] requests. Every request on the fast path is
/// recorded, so the ring reuses its entries' buffers instead of allocating.
#[derive(Default)]
pub struct RecentRequests {
    ring: Mutex<Ring>,
}

#[derive(Default)]
struct Ring {
    entries: Vec<RecentRequest>,
    /// Where the next entry goes once the ring is full.
    next: usize,
}

impl RecentRequests {
    /// Keeps `answered`, stripping the path's query and bounding lengths.
    pub fn record(&self, answered: Answered<'_>) {
        let at = SystemTime::now();
        let mut ring = self.ring.lock();
        let entry = if ring.entries.len() < RECENT_CAPACITY {
            ring.entries.push(RecentRequest {
                at,
                method: String::new(),
                path: String::new(),
                actor: String::new(),
                verdict: answered.verdict,
                target: String::new(),
                duration: answered.duration,
            });
            ring.entries.last_mut().expect("just pushed")
        } else {
            let next = ring.next;
            ring.next = (next + 1) % RECENT_CAPACITY;
            &mut ring.entries[next]
        };
        entry.at = at;
        entry.verdict = answered.verdict;
        entry.duration = answered.duration;
        let path = answered.path.split(|b| *b == b'?' || *b == b'#').next().unwrap_or_default();
        refill(&mut entry.method, answered.method, 16);
        refill(&mut entry.path, path, MAX_PATH);
        refill(&mut entry.actor, answered.actor.as_bytes(), 128);
        refill(&mut entry.target, answered.target.as_bytes(), 64);
    }

    /// The entries, newest first.
    pub fn snapshot(&self) -> Vec<RecentRequest> {
        let ring = self.ring.lock();
        // In time order: from the slot written next (the oldest) to the end,
        // then the slots before it.
        let (newest, oldest) = ring.entries.split_at(ring.next.min(ring.entries.len()));
        oldest.iter().chain(newest).rev().cloned().collect()
    }
}

/// Replaces `into`'s text with at most `chars` characters of `bytes`
/// (invalid UTF-8 shown as U+FFFD), keeping its allocation.
fn refill(into: &mut String, bytes: &[u8], chars: usize) {
    into.clear();
    match std::str::from_utf8(bytes) {
        // The usual case, copied whole: no more bytes than allowed characters.
        Ok(text) if text.len() <= chars => into.push_str(text),
        _ => into.extend(String::from_utf8_lossy(bytes).chars().take(chars)),
    }
}

/// Everything the page reads.
pub struct StatusPage {
    config: Config,
    resolver: Resolver,
    recent: Arc<RecentRequests>,
    ateapi: Arc<AteapiClient>,
    metrics: Metrics,
    started: Instant,
}

/// The page's content at one instant, gathered once and rendered as HTML or
/// JSON.
struct Snapshot {
    uptime: Duration,
    parking_enabled: bool,
    active: usize,
    max_parked: usize,
    max_wait: Duration,
    flights: usize,
    shed: u64,
    parked_actors: Vec<ParkedActor>,
    /// The atespaces holding slots now, most first (B69).
    atespaces: Vec<AtespaceView>,
    ateapi_address: String,
    connectivity: &'static str,
    /// ResumeActor attempts by code, for the codes seen, by name.
    attempts: Vec<(&'static str, u64)>,
    flags: Vec<(&'static str, String)>,
    recent: Vec<RecentRequest>,
}

/// One actor with parked requests, as shown.
struct ParkedActor {
    actor: String,
    waiting: usize,
    oldest: Duration,
    attempts: u32,
    last_code: &'static str,
    budget_left: Duration,
}

impl StatusPage {
    pub fn new(
        config: Config,
        resolver: Resolver,
        recent: Arc<RecentRequests>,
        ateapi: Arc<AteapiClient>,
        metrics: Metrics,
    ) -> StatusPage {
        StatusPage { config, resolver, recent, ateapi, metrics, started: Instant::now() }
    }

    /// The handler for `/statusz`.
    pub fn handler(page: Arc<StatusPage>) -> Handler {
        Arc::new(move |request: &Request| {
            if request.path != "/statusz" && request.path != "/" {
                return Reply::text(404, "not found");
            }
            let wants_json = request.query.split('&').any(|p| p == "format=json")
                || request.header("Accept").is_some_and(|accept| accept.contains("application/json"));
            let snapshot = page.snapshot();
            if wants_json {
                Reply { status: 200, content_type: "application/json", body: json(&snapshot).into_bytes() }
            } else {
                Reply { status: 200, content_type: "text/html; charset=utf-8", body: html(&snapshot).into_bytes() }
            }
        })
    }

    fn snapshot(&self) -> Snapshot {
        let parked_actors = self
            .resolver
            .flights()
            .snapshot()
            .into_iter()
            .filter(|f| f.parked_callers > 0)
            .map(|f| ParkedActor {
                actor: f.actor.to_string(),
                waiting: f.parked_callers,
                oldest: f.age,
                attempts: f.attempts,
                last_code: f.last_code.map_or("-", Code::name),
                budget_left: f.budget_left,
            })
            .collect();
        let mut attempts: Vec<(&'static str, u64)> = Code::ALL
            .iter()
            .map(|&code| (code.name(), self.metrics.attempts(code)))
            .filter(|(_, n)| *n > 0)
            .collect();
        attempts.sort();
        let parking = &self.config.parking;
        Snapshot {
            uptime: Duration::from_secs(self.started.elapsed().as_secs()),
            parking_enabled: parking.enabled,
            active: self.resolver.lot().map_or(0, |l| l.active()),
            max_parked: parking.max,
            max_wait: parking.budget,
            flights: self.resolver.flights().len(),
            shed: self.metrics.parking_rejected(),
            parked_actors,
            atespaces: self.resolver.lot().map_or_else(Vec::new, |lot| lot.atespaces(TOP_ATESPACES)),
            ateapi_address: self.config.ateapi_address.clone(),
            connectivity: self.ateapi.connectivity(),
            attempts,
            flags: effective_flags(&self.config),
            recent: self.recent.snapshot(),
        }
    }
}

/// The page as JSON.
fn json(s: &Snapshot) -> String {
    let mut j = String::from("{");
    let _ = write!(
        j,
        "\"parking\":{{\"enabled\":{},\"active\":{},\"max_parked\":{},\"max_wait\":{}}}",
        s.parking_enabled,
        s.active,
        s.max_parked,
        json_string(&godur::format(s.max_wait))
    );
    j.push_str(",\"parked_actors\":[");
    for (i, a) in s.parked_actors.iter().enumerate() {
        let _ = write!(
            j,
            "{}{{\"actor\":{},\"waiting\":{},\"oldest_wait_seconds\":{:.3},\"attempts\":{},\"last_code\":{},\"budget_left_seconds\":{:.3}}}",
            if i > 0 { "," } else { "" },
            json_string(&a.actor),
            a.waiting,
            a.oldest.as_secs_f64(),
            a.attempts,
            json_string(a.last_code),
            a.budget_left.as_secs_f64()
        );
    }
    j.push_str("],\"atespaces\":[");
    for (i, a) in s.atespaces.iter().enumerate() {
        let _ = write!(
            j,
            "{}{{\"atespace\":{},\"slots\":{},\"oldest_wait_seconds\":{:.3},\"sheds_last_minute\":{}}}",
            if i > 0 { "," } else { "" },
            json_string(&a.atespace),
            a.slots,
            a.oldest_wait.as_secs_f64(),
            a.sheds_last_minute
        );
    }
    let _ = write!(
        j,
        "],\"flights\":{},\"ateapi\":{{\"address\":{},\"connectivity\":{},\"attempts\":{{",
        s.flights,
        json_string(&s.ateapi_address),
        json_string(s.connectivity)
    );
    for (i, (code, n)) in s.attempts.iter().enumerate() {
        let _ = write!(j, "{}{}:{n}", if i > 0 { "," } else { "" }, json_string(code));
    }
    j.push_str("}},\"flags\":{");
    for (i, (flag, value)) in s.flags.iter().enumerate() {
        let _ = write!(j, "{}{}:{}", if i > 0 { "," } else { "" }, json_string(flag), json_string(value));
    }
    j.push_str("},\"recent_requests\":[");
    for (i, r) in s.recent.iter().enumerate() {
        let _ = write!(
            j,
            "{}{{\"time\":{},\"method\":{},\"path\":{},\"actor\":{},\"verdict\":{},\"target\":{},\"duration_seconds\":{:.6}}}",
            if i > 0 { "," } else { "" },
            json_string(&crate::ops::logging::rfc3339(r.at)),
            json_string(&r.method),
            json_string(&r.path),
            json_string(&r.actor),
            json_string(&r.verdict.to_string()),
            json_string(&r.target),
            r.duration.as_secs_f64()
        );
    }
    let _ = write!(j, "],\"uptime_seconds\":{}}}", s.uptime.as_secs());
    j
}

/// The page as HTML: self-contained, refreshing itself every 2 seconds.
fn html(s: &Snapshot) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"2\"><title>atenet Router Status</title><style>{STYLE}</style></head>\
         <body><h1>atenet Router Status</h1><p class=\"sub\">up {} &middot; refreshes every 2 s &middot; \
         <a href=\"?format=json\">JSON</a></p><div class=\"cards\">",
        godur::format(s.uptime)
    );
    let _ = write!(
        h,
        "<section class=\"card\" id=\"parking\"><h2>Request Parking</h2><dl>\
         <dt>enabled</dt><dd id=\"parking-enabled\">{}</dd>\
         <dt>parked</dt><dd><span id=\"parking-active\">{}</span> / <span id=\"parking-max\">{}</span></dd>\
         <dt>max wait</dt><dd id=\"parking-max-wait\">{}</dd>\
         <dt>flights</dt><dd id=\"flights\">{}</dd>\
         <dt>shed (lot full)</dt><dd>{}</dd></dl>",
        if s.parking_enabled { "yes" } else { "no" },
        s.active,
        s.max_parked,
        escape(&godur::format(s.max_wait)),
        s.flights,
        s.shed
    );
    if s.parked_actors.is_empty() {
        h.push_str("<p class=\"quiet\">No actor has parked requests.</p>");
    } else {
        h.push_str(
            "<table id=\"parked-actors\"><tr><th>actor</th><th>waiting</th><th>oldest</th>\
             <th>attempts</th><th>last code</th><th>budget left</th></tr>",
        );
        for a in &s.parked_actors {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{:.1}s</td><td>{}</td><td>{}</td><td>{:.1}s</td></tr>",
                escape(&a.actor),
                a.waiting,
                a.oldest.as_secs_f64(),
                a.attempts,
                escape(a.last_code),
                a.budget_left.as_secs_f64()
            );
        }
        h.push_str("</table>");
    }
    if !s.atespaces.is_empty() {
        h.push_str(
            "<table id=\"atespaces\"><tr><th>atespace</th><th>slots</th><th>oldest wait</th>\
             <th>shed by its cap (1 min)</th></tr>",
        );
        for a in &s.atespaces {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{:.1}s</td><td>{}</td></tr>",
                escape(&a.atespace),
                a.slots,
                a.oldest_wait.as_secs_f64(),
                a.sheds_last_minute
            );
        }
        h.push_str("</table>");
    }
    h.push_str("</section>");
    let _ = write!(
        h,
        "<section class=\"card\" id=\"ateapi\"><h2>ateapi connectivity</h2><dl>\
         <dt>address</dt><dd>{}</dd><dt>channel</dt><dd id=\"ateapi-state\">{}</dd></dl><table>\
         <tr><th>ResumeActor result</th><th>attempts</th></tr>",
        escape(&s.ateapi_address),
        s.connectivity
    );
    for (code, n) in &s.attempts {
        let _ = write!(h, "<tr><td>{}</td><td>{n}</td></tr>", escape(code));
    }
    h.push_str("</table></section>");
    h.push_str(
        "<section class=\"card wide\" id=\"recent\"><h2>Recent requests</h2><table><tr><th>time</th>\
         <th>method</th><th>path</th><th>actor</th><th>verdict</th><th>target</th><th>duration</th></tr>",
    );
    for r in &s.recent {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}ms</td></tr>",
            escape(&crate::ops::logging::rfc3339(r.at)),
            escape(&r.method),
            escape(&r.path),
            escape(&r.actor),
            escape(&r.verdict.to_string()),
            escape(&r.target),
            r.duration.as_secs_f64() * 1000.0
        );
    }
    h.push_str("</table></section><section class=\"card wide\" id=\"flags\"><h2>Effective flags</h2><table>");
    for (flag, value) in &s.flags {
        let _ = write!(h, "<tr><td><code>{flag}</code></td><td>{}</td></tr>", escape(value));
    }
    h.push_str("</table></section></div></body></html>\n");
    h
}

/// The effective configuration as `(flag, value)` pairs, for the page and
/// the startup log. Holds paths, never file contents.
pub fn effective_flags(config: &Config) -> Vec<(&'static str, String)> {
    let opt = |v: &Option<String>| v.clone().unwrap_or_default();
    let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
    let (ca, cert, name) = match &config.ateapi_transport {
        AteapiTransport::Insecure => (String::new(), String::new(), String::new()),
        AteapiTransport::Tls { ca_file, client_cert, server_name } => {
            (ca_file.display().to_string(), path(client_cert), opt(server_name))
        }
    };
    let parking = &config.parking;
    vec![
        ("--ateapi-address", config.ateapi_address.clone()),
        ("--ateapi-insecure", (config.ateapi_transport == AteapiTransport::Insecure).to_string()),
        ("--ateapi-ca-file", ca),
        ("--ateapi-client-cert", cert),
        ("--ateapi-server-name", name),
        ("--ateapi-token-file", path(&config.ateapi_token_file)),
        ("--extproc-address", config.extproc_addr.ip().to_string()),
        ("--port-extproc", config.extproc_addr.port().to_string()),
        ("--metrics-listen-addr", config.metrics_addr.to_string()),
        ("--status-port", config.status_addr.map_or("disabled".into(), |a| a.port().to_string())),
        ("--status-address", config.status_addr.map_or(String::new(), |a| a.ip().to_string())),
        ("--parked-request-budget", godur::format(parking.configured_budget)),
        ("--parked-request-max", parking.max.to_string()),
        ("--parked-request-max-per-atespace", parking.max_per_atespace.to_string()),
        ("--caller-deadlines", config.caller_deadlines.to_string()),
        ("--parked-request-retry-interval", godur::format(parking.backoff.interval)),
        ("--parked-request-retry-factor", parking.backoff.factor.to_string()),
        ("--parked-request-retry-jitter", parking.backoff.jitter.to_string()),
        ("--extproc-max-requests", config.extproc_max_requests.to_string()),
        ("--extproc-max-streams", config.extproc_max_streams.to_string()),
        ("--flight-max", config.flight_max.to_string()),
        ("--grpc-threads", config.grpc_threads.to_string()),
        ("--worker-port", config.worker_port.to_string()),
        ("--envoys", config.envoys.to_string()),
        ("--drain-delay", godur::format(config.drain_delay)),
        ("--drain-timeout", godur::format(config.drain_timeout)),
        ("--envoy-admin-address", opt(&config.envoy_admin_address)),
        ("--drain-complete-file", path(&config.drain_complete_file)),
        ("--envoy-idle-timeout", godur::format(config.envoy_idle_timeout)),
        ("--route-timeout", godur::format(config.route_timeout)),
        ("--late-serve-limit", godur::format(config.late_serve_limit)),
        ("--envoy-listen-address", config.envoy_listen_ip.to_string()),
        (
            "--envoy-trusted-ranges",
            config.envoy_trusted_ranges.iter().map(|r| format!("{}/{}", r.ip, r.prefix)).collect::<Vec<_>>().join(","),
        ),
        ("--port-http", config.port_http.to_string()),
        ("--port-health", config.port_health.to_string()),
        ("--port-stats", config.port_stats.to_string()),
        ("--log-level", config.log_level.as_str().to_lowercase()),
        ("--log-format", config.log_format.to_string()),
    ]
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5rem;background:#f6f7f9;color:#1d2330}\
h1{margin:0 0 .2rem;font-size:1.4rem}.sub{margin:0 0 1rem;color:#5b6475}\
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(30rem,1fr));gap:1rem}\
.card{background:#fff;border:1px solid #dde1e8;border-radius:8px;padding:1rem;overflow-x:auto}.wide{grid-column:1/-1}\
h2{font-size:1.05rem;margin:0 0 .6rem}dl{display:grid;grid-template-columns:max-content 1fr;gap:.2rem 1rem;margin:0}\
dt{color:#5b6475}dd{margin:0;font-variant-numeric:tabular-nums}table{border-collapse:collapse;width:100%;margin-top:.6rem}\
th,td{text-align:left;padding:.2rem .5rem;border-bottom:1px solid #eef0f4;font-size:.9rem;white-space:nowrap}.quiet{color:#5b6475}";

/// HTML-escapes text.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn b42_recent_requests_drop_the_query_and_keep_the_last_hundred() {
        let recent = RecentRequests::default();
        for i in 0..150 {
            let path = format!("/api/{i}?token=secret&x=1");
            let verdict = if i % 2 == 0 {
                RecentVerdict::Routed
            } else {
                RecentVerdict::Rejected { status: 503, reason: "atenet_lot_full" }
            };
            let answered = Answered {
                method: b"GET",
                path: path.as_bytes(),
                actor: "demo/a",
                verdict,
                target: "",
                duration: Duration::ZERO,
            };
            recent.record(answered);
        }
        let all = recent.snapshot();
        assert_eq!(all.len(), RECENT_CAPACITY);
        assert_eq!(all[0].path, "/api/149", "newest first, no query");
        assert_eq!(all[99].path, "/api/50", "oldest last");
        assert!(all.windows(2).all(|w| w[0].at >= w[1].at));
        assert_eq!(all[0].verdict.to_string(), "503 atenet_lot_full");
        assert_eq!(all[1].verdict.to_string(), "200 routed");
        assert!(all.iter().all(|r| !r.path.contains("secret")));
        let few = RecentRequests::default();
        for path in ["/a", "/b"] {
            let answered = Answered {
                method: b"GET",
                path: path.as_bytes(),
                actor: "",
                verdict: RecentVerdict::Routed,
                target: "",
                duration: Duration::ZERO,
            };
            few.record(answered);
        }
        let paths: Vec<String> = few.snapshot().into_iter().map(|r| r.path).collect();
        assert_eq!(paths, ["/b", "/a"]);
    }

    #[test]
    fn refill_bounds_characters_and_shows_bad_bytes() {
        let mut s = String::from("old text");
        refill(&mut s, b"/short", 16);
        assert_eq!(s, "/short");
        refill(&mut s, "é".repeat(20).as_bytes(), 16);
        assert_eq!(s, "é".repeat(16), "characters, not bytes");
        refill(&mut s, b"abcdefghij", 4);
        assert_eq!(s, "abcd");
        refill(&mut s, b"a\xffb", 16);
        assert_eq!(s, "a\u{fffd}b");
    }

    #[test]
    fn escaping() {
        assert_eq!(escape("<a href='x'>&\"</a>"), "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;");
    }
}

//! The status page, `/statusz` on `--status-port` (B42): what the router is
//! doing now, for a person (HTML) or a program (JSON).
//!
//! It shows counts and names only: of requests, what [`RecentRequests`]
//! keeps, which is never a secret. Its lists are bounded (B93), so a
//! saturated router answers it with the same few tens of kilobytes as an
//! idle one.

use std::fmt::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::actor::resume::Code;
use crate::admin::chart::{nice_ceiling, Chart, Line};
use crate::admin::history::{History, Sample, SAMPLE_INTERVAL, WAIT_QUANTILES, WINDOW};
use crate::admin::html::escape;
use crate::admin::http::{Handler, Reply, Request};
use crate::ateapi::client::AteapiClient;
use crate::cli::config::{AteapiTransport, Config, ExtprocListen};
use crate::cli::{godur, size};
use crate::parking::band::Band;
use crate::parking::flight::FlightSnapshot;
use crate::parking::groups::GroupSnapshot;
use crate::parking::lot::AtespaceView;
use crate::parking::resolver::Resolver;
use crate::telemetry::metrics::Metrics;
use crate::telemetry::recent::{RecentRequest, RecentRequests, VerdictKind};

/// How many atespaces the page lists (B69).
const TOP_ATESPACES: usize = 20;

/// How many flights, and how many actors with parked requests, the page
/// lists: the oldest (B93). Fifty rows are what a person reads; a program
/// that wants every actor has `/metrics` for counts and the log for names,
/// and a page that grew with the table would cost a saturated router
/// megabytes every two seconds per viewer.
pub const LISTED: usize = 50;

/// Everything the page reads.
pub struct StatusPage {
    config: Config,
    resolver: Resolver,
    recent: Arc<RecentRequests>,
    history: Arc<History>,
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
    /// Slots held by each band, lowest first (B119).
    active_by_band: [usize; 3],
    max_parked: usize,
    max_wait: Duration,
    /// Flights in progress (B93: the total, however many are listed).
    flights: usize,
    /// The oldest [`LISTED`] flights, oldest first.
    oldest_flights: Vec<FlightView>,
    /// How long the longest-running attempt has run, if one runs.
    oldest_attempt: Option<Duration>,
    shed: u64,
    /// The oldest [`LISTED`] flights with parked callers.
    parked_actors: Vec<FlightView>,
    /// How many flights have parked callers.
    parked_actors_total: usize,
    /// The atespaces holding slots now, most first, and how many do.
    atespaces: Vec<AtespaceView>,
    atespaces_total: usize,
    /// The saturation groups with the most flights waiting (B112), and
    /// how many groups there are.
    groups: Vec<GroupSnapshot>,
    groups_total: usize,
    ateapi_address: String,
    connectivity: &'static str,
    /// ResumeActor attempts by code, for the codes seen, by name.
    attempts: Vec<(&'static str, u64)>,
    /// Verdicts since startup, by [`VerdictKind`].
    verdicts: [u64; VerdictKind::ALL.len()],
    /// The last ten minutes, oldest first, as seconds ago.
    history: Vec<(f64, Sample)>,
    flags: Vec<(&'static str, String)>,
    recent: Vec<RecentRequest>,
}

/// One flight, as shown.
struct FlightView {
    actor: String,
    age: Duration,
    /// `None` between attempts.
    attempt: Option<Duration>,
    attempts: u32,
    last_code: &'static str,
    parked: usize,
    budget_left: Duration,
}

impl FlightView {
    fn of(f: &FlightSnapshot) -> FlightView {
        FlightView {
            actor: f.actor.to_string(),
            age: f.age,
            attempt: f.attempt_age,
            attempts: f.attempts,
            last_code: f.last_code.map_or("-", Code::name),
            parked: f.parked_callers,
            budget_left: f.budget_left,
        }
    }
}

impl StatusPage {
    pub fn new(
        config: Config,
        resolver: Resolver,
        recent: Arc<RecentRequests>,
        history: Arc<History>,
        ateapi: Arc<AteapiClient>,
        metrics: Metrics,
    ) -> StatusPage {
        StatusPage { config, resolver, recent, history, ateapi, metrics, started: Instant::now() }
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
                Reply {
                    status: 200,
                    content_type: "text/html; charset=utf-8",
                    body: html(&snapshot).into_bytes(),
                }
            }
        })
    }

    fn snapshot(&self) -> Snapshot {
        // Every flight is looked at, for the totals; only the oldest are
        // kept (B93). Equal ages list by name, so rows keep their places.
        let mut flights = self.resolver.flights().snapshot();
        flights.sort_by(|a, b| b.age.cmp(&a.age).then_with(|| a.actor.as_str().cmp(b.actor.as_str())));
        let parked: Vec<&FlightSnapshot> = flights.iter().filter(|f| f.parked_callers > 0).collect();
        let parked_actors = parked.iter().take(LISTED).map(|f| FlightView::of(f)).collect();
        let parked_actors_total = parked.len();
        let oldest_attempt = flights.iter().filter_map(|f| f.attempt_age).max();
        let oldest_flights = flights.iter().take(LISTED).map(FlightView::of).collect();
        let mut attempts: Vec<(&'static str, u64)> = Code::ALL
            .iter()
            .map(|&code| (code.name(), self.metrics.attempts(code)))
            .filter(|(_, n)| *n > 0)
            .collect();
        attempts.sort();
        let (atespaces, atespaces_total) =
            self.resolver.lot().map_or_else(|| (Vec::new(), 0), |lot| lot.atespaces(TOP_ATESPACES));
        let mut groups = self.resolver.flights().groups();
        let groups_total = groups.len();
        groups.truncate(TOP_ATESPACES);
        let now = Instant::now();
        let history = self
            .history
            .samples()
            .into_iter()
            .map(|s| (now.saturating_duration_since(s.at).as_secs_f64(), s))
            .filter(|(ago, _)| *ago <= WINDOW.as_secs_f64())
            .collect();
        let parking = &self.config.parking;
        Snapshot {
            uptime: Duration::from_secs(self.started.elapsed().as_secs()),
            parking_enabled: parking.enabled,
            active: self.resolver.lot().map_or(0, |l| l.active()),
            active_by_band: self.resolver.lot().map_or([0; 3], |l| l.active_by_band()),
            max_parked: parking.max,
            max_wait: parking.budget,
            flights: flights.len(),
            oldest_flights,
            oldest_attempt,
            shed: self.metrics.parking_rejected(),
            parked_actors,
            parked_actors_total,
            atespaces,
            atespaces_total,
            groups,
            groups_total,
            ateapi_address: self.config.ateapi.address.clone(),
            connectivity: self.ateapi.connectivity(),
            attempts,
            verdicts: self.recent.verdict_counts(),
            history,
            flags: effective_flags(&self.config),
            recent: self.recent.snapshot(),
        }
    }
}

/// A number as shown: at most three decimals, never `-0`, `NaN` as 0.
fn number(value: f64) -> f64 {
    if value.is_finite() {
        // Adding 0.0 turns -0.0 into 0.0.
        (value * 1000.0).round() / 1000.0 + 0.0
    } else {
        0.0
    }
}

/// A duration in seconds, as [`number`].
fn secs(value: Duration) -> f64 {
    number(value.as_secs_f64())
}

/// One history column, `null` where `value` has none.
fn column(history: &[(f64, Sample)], value: impl Fn(f64, &Sample) -> Option<f64>) -> Value {
    history.iter().map(|(ago, sample)| value(*ago, sample).map(number)).collect::<Vec<_>>().into()
}

fn json_flight(f: &FlightView) -> Value {
    json!({
        "actor": f.actor,
        "age_seconds": secs(f.age),
        "attempt_seconds": f.attempt.map(secs),
        "attempts": f.attempts,
        "last_code": f.last_code,
        "parked": f.parked,
        "budget_left_seconds": secs(f.budget_left),
    })
}

/// The page as JSON (B42), in the order the page shows it.
fn json(s: &Snapshot) -> String {
    let parked_actors: Vec<Value> = s
        .parked_actors
        .iter()
        .map(|a| {
            json!({
                "actor": a.actor,
                "waiting": a.parked,
                "oldest_wait_seconds": secs(a.age),
                "attempts": a.attempts,
                "last_code": a.last_code,
                "budget_left_seconds": secs(a.budget_left),
            })
        })
        .collect();
    let atespaces: Vec<Value> = s
        .atespaces
        .iter()
        .map(|a| {
            json!({
                "atespace": a.atespace,
                "slots": a.slots,
                "oldest_wait_seconds": secs(a.oldest_wait),
                "sheds_last_minute": a.sheds_last_minute,
            })
        })
        .collect();
    let groups: Vec<Value> = s
        .groups
        .iter()
        .map(|g| {
            json!({
                "key": g.key,
                "waiting": g.waiting,
                "oldest_wait_seconds": secs(g.oldest_wait),
                "last_answer": g.last_answer.name(),
                "probe_open": g.probe_open,
            })
        })
        .collect();
    let verdicts: Map<String, Value> = VerdictKind::ALL
        .iter()
        .zip(s.verdicts)
        .map(|(kind, n)| (kind.name().to_string(), n.into()))
        .collect();
    let mut history = Map::new();
    history.insert("interval_seconds".into(), SAMPLE_INTERVAL.as_secs().into());
    history.insert("window_seconds".into(), WINDOW.as_secs().into());
    history.insert("seconds_ago".into(), column(&s.history, |ago, _| Some((ago * 10.0).round() / 10.0)));
    history.insert("parked".into(), column(&s.history, |_, sample| Some(sample.parked as f64)));
    for kind in VerdictKind::ALL {
        let values = column(&s.history, |_, sample| Some(sample.verdicts_per_second[kind as usize]));
        history.insert(format!("{}_per_second", kind.name()), values);
    }
    for (i, q) in WAIT_QUANTILES.iter().enumerate() {
        let values = column(&s.history, |_, sample| sample.waits.map(|w| w[i]));
        history.insert(format!("wait_p{}_seconds", q * 100.0), values);
    }
    let attempts: Map<String, Value> =
        s.attempts.iter().map(|(code, n)| (code.to_string(), (*n).into())).collect();
    let flags: Map<String, Value> =
        s.flags.iter().map(|(flag, value)| (flag.to_string(), value.as_str().into())).collect();
    let recent: Vec<Value> = s
        .recent
        .iter()
        .map(|r| {
            json!({
                "time": crate::telemetry::logging::rfc3339(r.at),
                "method": r.method,
                "path": r.path,
                "actor": r.actor,
                "verdict": r.verdict.to_string(),
                "target": r.target,
                "duration_seconds": (r.duration.as_secs_f64() * 1e6).round() / 1e6,
            })
        })
        .collect();
    json!({
        "parking": {
            "enabled": s.parking_enabled,
            "active": s.active,
            "active_by_band": Band::ALL
                .iter()
                .map(|b| (b.name().to_string(), Value::from(s.active_by_band[*b as usize])))
                .collect::<Map<_, _>>(),
            "max_parked": s.max_parked,
            "max_wait": godur::format(s.max_wait),
        },
        "parked_actors": parked_actors,
        "parked_actors_total": s.parked_actors_total,
        "parked_actors_more": s.parked_actors_total - s.parked_actors.len(),
        "atespaces": atespaces,
        "atespaces_total": s.atespaces_total,
        "atespaces_more": s.atespaces_total - s.atespaces.len(),
        "saturation_groups": groups,
        "saturation_groups_total": s.groups_total,
        "flights": s.flights,
        "oldest_flights": s.oldest_flights.iter().map(json_flight).collect::<Vec<_>>(),
        "oldest_flights_more": s.flights - s.oldest_flights.len(),
        "oldest_attempt_seconds": s.oldest_attempt.map(secs),
        "verdicts": verdicts,
        "history": history,
        "ateapi": {
            "address": s.ateapi_address,
            "connectivity": s.connectivity,
            "attempts": attempts,
        },
        "flags": flags,
        "recent_requests": recent,
        "uptime_seconds": s.uptime.as_secs(),
    })
    .to_string()
}

/// `n` with a comma between thousands: `20,000`.
fn count(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A rate for a legend or a scale: `0/s`, `2.5/s`, `1,200/s`.
fn rate(per_second: f64) -> String {
    match per_second {
        r if r <= 0.0 => "0/s".into(),
        r if r < 10.0 => format!("{}/s", number((r * 10.0).round() / 10.0)),
        r => format!("{}/s", count(r.round() as usize)),
    }
}

/// A wait for a legend or a scale: `250 ms`, `1.25 s`, `12.5 s`.
fn seconds(value: f64) -> String {
    match value {
        v if v < 1.0 => format!("{} ms", number((v * 1000.0).round())),
        v if v < 10.0 => format!("{} s", number((v * 100.0).round() / 100.0)),
        v => format!("{} s", number((v * 10.0).round() / 10.0)),
    }
}

/// One history series: `None` where `value` has none, and where samples are
/// further apart than a few intervals (the timer fell behind), so that the
/// chart never draws a line through time it has no sample for.
fn series(history: &[(f64, Sample)], value: impl Fn(&Sample) -> Option<f64>) -> Vec<Option<(f64, f64)>> {
    let gap = (SAMPLE_INTERVAL * 3).as_secs_f64();
    let mut points = Vec::with_capacity(history.len() + 1);
    let mut previous: Option<f64> = None;
    for (ago, sample) in history {
        if previous.is_some_and(|p| p - ago > gap) {
            points.push(None);
        }
        points.push(value(sample).map(|v| (*ago, v)));
        previous = Some(*ago);
    }
    points
}

/// The three charts of the last ten minutes (B91).
fn charts(s: &Snapshot) -> [Chart<'static>; 3] {
    let latest = s.history.last().map(|(_, sample)| sample);
    let peak = s.history.iter().map(|(_, sample)| sample.parked).max().unwrap_or(0);
    // The lot is the top once the peak comes near it; until then a scale
    // of its own, so that 20 parked of 5,000 still show their shape.
    let scale = nice_ceiling(peak as f64 * 1.25, 5.0);
    let (top, top_is_limit) =
        if scale >= s.max_parked as f64 { (s.max_parked as f64, true) } else { (scale, false) };
    let parked = Chart {
        id: "chart-parked",
        title: "Parked now, against the lot",
        top,
        top_label: if top_is_limit { format!("{} lot", count(s.max_parked)) } else { count(top as usize) },
        top_is_limit,
        area: true,
        lines: vec![Line {
            class: "s-parked",
            name: "parked",
            now: count(s.active),
            points: if s.parking_enabled {
                series(&s.history, |x| Some(x.parked as f64))
            } else {
                Vec::new()
            },
        }],
        notes: vec![("lot", count(s.max_parked)), ("peak", count(peak))],
        empty: if s.parking_enabled { "no sample yet" } else { "parking is off" },
    };
    let kinds = [
        (VerdictKind::Routed, "s-routed", "routed"),
        (VerdictKind::Shed, "s-shed", "shed"),
        (VerdictKind::BudgetExhausted, "s-budget", "budget exhausted"),
        (VerdictKind::Error, "s-error", "errors"),
    ];
    let fastest = s.history.iter().flat_map(|(_, x)| x.verdicts_per_second).fold(0.0, f64::max);
    let top = nice_ceiling(fastest, 1.0);
    let verdicts = Chart {
        id: "chart-verdicts",
        title: "Verdicts per second",
        top,
        top_label: rate(top),
        top_is_limit: false,
        area: false,
        lines: kinds
            .iter()
            .map(|&(kind, class, name)| Line {
                class,
                name,
                now: rate(latest.map_or(0.0, |x| x.verdicts_per_second[kind as usize])),
                points: series(&s.history, |x| Some(x.verdicts_per_second[kind as usize])),
            })
            .collect(),
        notes: Vec::new(),
        empty: "no sample yet",
    };
    let slowest = s.history.iter().filter_map(|(_, x)| x.waits).flatten().fold(0.0, f64::max);
    let top = nice_ceiling(slowest, 0.01);
    let waits = Chart {
        id: "chart-waits",
        title: "Parked wait, by percentile",
        top,
        top_label: seconds(top),
        top_is_limit: false,
        area: false,
        lines: ["s-p50", "s-p90", "s-p99"]
            .into_iter()
            .zip(["p50", "p90", "p99"])
            .enumerate()
            .map(|(i, (class, name))| Line {
                class,
                name,
                now: latest.and_then(|x| x.waits).map_or_else(|| "-".into(), |w| seconds(w[i])),
                points: series(&s.history, |x| x.waits.map(|w| w[i])),
            })
            .collect(),
        notes: Vec::new(),
        empty: "no parked wait ended in the last 10 minutes",
    };
    [parked, verdicts, waits]
}

/// Opens a table whose rows stack into label-value lists on a narrow
/// screen: `columns` are `(header, numeric)`.
fn table_head(h: &mut String, id: &str, columns: &[(&str, bool)]) {
    let _ = write!(h, "<table class=\"rows\" id=\"{id}\"><thead><tr>");
    for (name, numeric) in columns {
        let _ = write!(h, "<th{}>{name}</th>", if *numeric { " class=\"n\"" } else { "" });
    }
    h.push_str("</tr></thead><tbody>");
}

/// One cell of a [`table_head`] table: its column's name goes with it, for
/// the stacked layout.
fn cell(h: &mut String, label: &str, numeric: bool, text: &str) {
    let _ = write!(h, "<td{} data-label=\"{label}\">{text}</td>", if numeric { " class=\"n\"" } else { "" });
}

/// "Showing the oldest 50 of 20,000 (19,950 more)", or nothing when all
/// are shown (B93).
fn more(h: &mut String, id: &str, what: &str, shown: usize, total: usize) {
    if total > shown {
        let _ = write!(
            h,
            "<p class=\"more\" id=\"{id}\">Showing {what} {} of {} (<b>{}</b> more).</p>",
            count(shown),
            count(total),
            count(total - shown)
        );
    }
}

/// A card's columns: each name, and whether it holds a number.
type Columns = &'static [(&'static str, bool)];

const ATESPACE_COLUMNS: Columns =
    &[("atespace", false), ("slots", true), ("oldest wait", true), ("shed by its cap (1 min)", true)];

const FLIGHT_COLUMNS: Columns = &[
    ("actor", false),
    ("age", true),
    ("attempt", false),
    ("attempts", true),
    ("last code", false),
    ("parked", true),
    ("budget left", true),
];

const GROUP_COLUMNS: Columns =
    &[("group", false), ("waiting", true), ("oldest wait", true), ("last answer", false), ("probe", false)];

const PARKED_COLUMNS: Columns = &[
    ("actor", false),
    ("waiting", true),
    ("oldest", true),
    ("attempts", true),
    ("last code", false),
    ("budget left", true),
];

const RECENT_COLUMNS: Columns = &[
    ("time", false),
    ("method", false),
    ("path", false),
    ("actor", false),
    ("verdict", false),
    ("target", false),
    ("duration", true),
];

/// A card that lists the first of many: its table, what it says when
/// there is nothing to list, and its "showing" line's id, wording and
/// total.
struct Listing<'a> {
    id: &'a str,
    columns: Columns,
    empty: &'a str,
    more: (&'a str, &'a str, usize),
}

/// A [`Listing`]'s table of `cells`, one row each, or its quiet line.
fn listing(h: &mut String, card: &Listing<'_>, cells: impl ExactSizeIterator<Item = Vec<String>>) {
    let shown = cells.len();
    if shown == 0 {
        let _ = write!(h, "<p class=\"quiet\">{}</p>", card.empty);
        return;
    }
    table_head(h, card.id, card.columns);
    rows(h, card.columns, cells);
    h.push_str("</tbody></table>");
    let (id, what, total) = card.more;
    more(h, id, what, shown, total);
}

/// Table rows, each cell labelled with its column.
fn rows(h: &mut String, columns: Columns, cells: impl Iterator<Item = Vec<String>>) {
    for row in cells {
        h.push_str("<tr>");
        for ((label, numeric), text) in columns.iter().zip(&row) {
            cell(h, label, *numeric, text);
        }
        h.push_str("</tr>");
    }
}

/// A duration as the page shows it: seconds, one decimal.
fn seconds_text(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// The page's skeleton: each `{{slot}}` is filled in by [`fill`]. Its
/// line breaks, and the indentation after them, are no part of the page.
const PAGE: &str = include_str!("status.html");

/// The page as HTML: self-contained, refreshing itself every 2 seconds.
fn html(s: &Snapshot) -> String {
    let mut h = String::new();
    let mut rest = PAGE;
    while let Some(at) = rest.find("{{") {
        push_joined(&mut h, &rest[..at]);
        let slot = &rest[at + 2..];
        let end = slot.find("}}").unwrap_or(slot.len());
        fill(&mut h, &slot[..end], s);
        rest = slot.get(end + 2..).unwrap_or("");
    }
    push_joined(&mut h, rest);
    h.push('\n');
    h
}

/// `text` without its line breaks and the indentation that follows them.
fn push_joined(h: &mut String, text: &str) {
    for (i, line) in text.split('\n').enumerate() {
        h.push_str(if i == 0 { line } else { line.trim_start() });
    }
}

/// One slot of [`PAGE`].
fn fill(h: &mut String, slot: &str, s: &Snapshot) {
    match slot {
        "style" => h.push_str(STYLE),
        "uptime" => h.push_str(&godur::format(s.uptime)),
        "charts" => {
            for chart in charts(s) {
                h.push_str(&chart.card());
            }
        }
        "parking-enabled" => h.push_str(if s.parking_enabled { "yes" } else { "no" }),
        "parked" => h.push_str(&count(s.active)),
        "parking-max" => h.push_str(&count(s.max_parked)),
        "parking-bands" => {
            let bands: Vec<String> = Band::ALL
                .iter()
                .rev()
                .map(|b| format!("{} {}", count(s.active_by_band[*b as usize]), b.name()))
                .collect();
            h.push_str(&bands.join(" &middot; "));
        }
        "max-wait" => h.push_str(&escape(&godur::format(s.max_wait))),
        "flights" => h.push_str(&count(s.flights)),
        "actors-parked" => h.push_str(&count(s.parked_actors_total)),
        "oldest-attempt" => h.push_str(
            &s.oldest_attempt.map_or_else(|| "none running".into(), |a| format!("{:.1}s", a.as_secs_f64())),
        ),
        "shed" => h.push_str(&s.shed.to_string()),
        "ateapi-address" => h.push_str(&escape(&s.ateapi_address)),
        "ateapi-state" => h.push_str(s.connectivity),
        "attempts" => {
            for (code, n) in &s.attempts {
                let _ = write!(h, "<tr><td>{}</td><td class=\"n\">{n}</td></tr>", escape(code));
            }
        }
        "atespaces" => listing(
            h,
            &Listing {
                id: "atespaces",
                columns: ATESPACE_COLUMNS,
                empty: "No atespace holds a slot.",
                more: ("atespaces-more", "the top", s.atespaces_total),
            },
            s.atespaces.iter().map(|a| {
                vec![
                    escape(&a.atespace),
                    count(a.slots),
                    seconds_text(a.oldest_wait),
                    a.sheds_last_minute.to_string(),
                ]
            }),
        ),
        "flight-list" => listing(
            h,
            &Listing {
                id: "flight-list",
                columns: FLIGHT_COLUMNS,
                empty: "No flight is in progress.",
                more: ("flights-more", "the oldest", s.flights),
            },
            s.oldest_flights.iter().map(|f| {
                let attempt = f
                    .attempt
                    .map_or_else(|| "retry pending".into(), |a| format!("running {}", seconds_text(a)));
                vec![
                    escape(&f.actor),
                    seconds_text(f.age),
                    attempt,
                    f.attempts.to_string(),
                    f.last_code.to_string(),
                    count(f.parked),
                    seconds_text(f.budget_left),
                ]
            }),
        ),
        "groups" => listing(
            h,
            &Listing {
                id: "saturation-groups",
                columns: GROUP_COLUMNS,
                empty: "No flight waits for a full pool or the control plane.",
                more: ("saturation-groups-more", "the largest", s.groups_total),
            },
            s.groups.iter().map(|g| {
                let probe = if g.probe_open { "open" } else { "waiting" };
                vec![
                    escape(&g.key),
                    count(g.waiting),
                    seconds_text(g.oldest_wait),
                    g.last_answer.name().to_string(),
                    probe.to_string(),
                ]
            }),
        ),
        "parked-actors" => listing(
            h,
            &Listing {
                id: "parked-actors",
                columns: PARKED_COLUMNS,
                empty: "No actor has parked requests.",
                more: ("parked-actors-more", "the oldest", s.parked_actors_total),
            },
            s.parked_actors.iter().map(|a| {
                vec![
                    escape(&a.actor),
                    count(a.parked),
                    seconds_text(a.age),
                    a.attempts.to_string(),
                    a.last_code.to_string(),
                    seconds_text(a.budget_left),
                ]
            }),
        ),
        "recent" => {
            table_head(h, "recent-requests", RECENT_COLUMNS);
            rows(
                h,
                RECENT_COLUMNS,
                s.recent.iter().map(|r| {
                    vec![
                        escape(&crate::telemetry::logging::rfc3339(r.at)),
                        escape(&r.method),
                        escape(&r.path),
                        escape(&r.actor),
                        escape(&r.verdict.to_string()),
                        escape(&r.target),
                        format!("{:.1}ms", r.duration.as_secs_f64() * 1000.0),
                    ]
                }),
            );
        }
        "flags" => {
            for (flag, value) in &s.flags {
                let _ = write!(h, "<tr><td><code>{flag}</code></td><td>{}</td></tr>", escape(value));
            }
        }
        _ => {}
    }
}

/// The effective configuration as `(flag, value)` pairs, for the page and
/// the startup log: every flag `--help` lists (tests/cli.rs holds the two
/// equal). Holds paths, never file contents.
pub fn effective_flags(config: &Config) -> Vec<(&'static str, String)> {
    let opt = |v: &Option<String>| v.clone().unwrap_or_default();
    let path =
        |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
    let (ca, cert, name) = match &config.ateapi.transport {
        None | Some(AteapiTransport::Insecure) => (String::new(), String::new(), String::new()),
        Some(AteapiTransport::Tls { ca_file, client_cert, server_name }) => {
            (ca_file.display().to_string(), path(client_cert), opt(server_name))
        }
    };
    let parking = &config.parking;
    let (extproc_tls, router_tls) = (config.extproc.tls.as_ref(), &config.envoy.router_tls);
    let (extproc_address, socket) = match &config.extproc.listen {
        ExtprocListen::Tcp(addr) => (addr.ip().to_string(), None),
        ExtprocListen::Unix(socket) => (config.extproc.listen.to_string(), Some(socket)),
    };
    vec![
        ("--ateapi-address", config.ateapi.address.clone()),
        ("--ateapi-insecure", (config.ateapi.transport == Some(AteapiTransport::Insecure)).to_string()),
        ("--ateapi-ca-file", ca),
        ("--ateapi-client-cert", cert),
        ("--ateapi-server-name", name),
        ("--ateapi-token-file", path(&config.ateapi.token_file)),
        ("--ateapi-max-calls", config.ateapi.max_calls.to_string()),
        ("--ateapi-max-calls-per-atespace", config.ateapi.max_calls_per_atespace.to_string()),
        ("--extproc-address", extproc_address),
        ("--port-extproc", config.extproc.listen.tcp().map_or(String::new(), |a| a.port().to_string())),
        ("--extproc-socket-mode", socket.map_or(String::new(), |s| format!("{:04o}", s.mode))),
        ("--extproc-socket-group", socket.and_then(|s| s.group).map_or(String::new(), |g| g.to_string())),
        ("--extproc-cert-file", extproc_tls.map_or(String::new(), |t| t.cert_file.display().to_string())),
        ("--extproc-key-file", extproc_tls.map_or(String::new(), |t| t.key_file.display().to_string())),
        ("--extproc-client-ca-file", extproc_tls.map_or(String::new(), |t| path(&t.client_ca_file))),
        ("--extproc-insecure", config.extproc.insecure.to_string()),
        ("--metrics-listen-addr", config.admin.metrics_addr.to_string()),
        ("--status-port", config.admin.status_addr.map_or("disabled".into(), |a| a.port().to_string())),
        ("--status-address", config.admin.status_addr.map_or(String::new(), |a| a.ip().to_string())),
        ("--parked-request-budget", godur::format(parking.configured_budget)),
        ("--parked-request-max", parking.max.to_string()),
        ("--parked-request-max-per-atespace", parking.max_per_atespace.to_string()),
        ("--parked-request-max-sheddable", parking.max_sheddable.to_string()),
        ("--caller-deadlines", config.parking.caller_deadlines.to_string()),
        ("--parked-request-retry-interval", godur::format(parking.backoff.interval)),
        ("--parked-request-retry-factor", parking.backoff.factor.to_string()),
        ("--parked-request-retry-jitter", parking.backoff.jitter.to_string()),
        ("--parked-request-dispatch", parking.dispatch.name().to_string()),
        ("--fleet-size", parking.fleet_size.to_string()),
        ("--extproc-max-requests", config.extproc.max_requests.to_string()),
        ("--extproc-max-streams", config.extproc.max_streams.to_string()),
        ("--flight-max", config.parking.flight_max.to_string()),
        ("--flight-max-per-atespace", config.parking.flight_max_per_atespace.to_string()),
        ("--extproc-max-requests-per-atespace", config.extproc.max_requests_per_atespace.to_string()),
        ("--grpc-threads", config.extproc.grpc_threads.to_string()),
        ("--worker-port", config.workers.port.to_string()),
        (
            "--worker-networks",
            config
                .workers
                .networks
                .iter()
                .map(|r| format!("{}/{}", r.ip, r.prefix))
                .collect::<Vec<_>>()
                .join(","),
        ),
        ("--envoys", config.drain.envoys.to_string()),
        ("--drain-delay", godur::format(config.drain.delay)),
        ("--drain-timeout", godur::format(config.drain.timeout)),
        ("--envoy-admin-address", opt(&config.drain.envoy_admin_address)),
        ("--drain-complete-file", path(&config.drain.complete_file)),
        ("--envoy-idle-timeout", godur::format(config.envoy.idle_timeout)),
        ("--route-timeout", godur::format(config.envoy.route_timeout)),
        ("--late-serve-limit", godur::format(config.parking.late_serve_limit)),
        ("--envoy-listen-address", config.envoy.listen_ip.to_string()),
        (
            "--envoy-trusted-ranges",
            config
                .envoy
                .trusted_ranges
                .iter()
                .map(|r| format!("{}/{}", r.ip, r.prefix))
                .collect::<Vec<_>>()
                .join(","),
        ),
        ("--envoy-max-heap", size::format(config.envoy.max_heap)),
        ("--envoy-router-ca-file", path(&router_tls.ca_file)),
        ("--envoy-router-cert-file", path(&router_tls.cert_file)),
        ("--envoy-router-key-file", path(&router_tls.key_file)),
        ("--envoy-router-server-name", opt(&router_tls.server_name)),
        ("--envoy-sds-dir", path(&router_tls.sds_dir)),
        ("--routers", config.envoy.routers.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")),
        ("--port-http", config.envoy.port_http.to_string()),
        ("--port-health", config.envoy.port_health.to_string()),
        ("--port-stats", config.envoy.port_stats.to_string()),
        (
            "--otlp-traces-address",
            config.telemetry.tracing.as_ref().map(|t| t.address.clone()).unwrap_or_default(),
        ),
        (
            "--trace-sample-percent",
            config.telemetry.tracing.as_ref().map_or_else(String::new, |t| t.sample_percent.to_string()),
        ),
        ("--log-level", config.telemetry.log_level.as_str().to_lowercase()),
        ("--log-format", config.telemetry.log_format.to_string()),
    ]
}

/// The page's look: a grid of cards that fits any width from a phone's up
/// (B91): grid tracks never wider than the page, text that wraps anywhere
/// rather than push a card wider, and tables that turn into label-value
/// lists on a narrow screen.
const STYLE: &str = include_str!("status.css");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::history::CAPACITY;
    use crate::telemetry::recent::{RecentVerdict, RECENT_CAPACITY};

    #[test]
    fn figures_read_well() {
        assert_eq!(
            (count(0), count(999), count(1000), count(20_000), count(1_234_567)),
            ("0".into(), "999".into(), "1,000".into(), "20,000".into(), "1,234,567".into())
        );
        assert_eq!((rate(0.0), rate(2.54), rate(1234.4)), ("0/s".into(), "2.5/s".into(), "1,234/s".into()));
        assert_eq!(
            (seconds(0.25), seconds(1.234), seconds(12.34)),
            ("250 ms".into(), "1.23 s".into(), "12.3 s".into())
        );
        assert_eq!(
            (number(1.0).to_string(), number(0.1234), number(-0.0001).to_string(), number(f64::NAN)),
            ("1".into(), 0.123, "0".into(), 0.0)
        );
    }

    /// B93: the page at its largest, whatever is parked: every list full of
    /// the longest names an actor id allows (63 + 1 + 63 bytes), a full ring
    /// of samples each with a different figure in every series, 100 recent
    /// requests at their longest.
    #[test]
    fn b93_the_page_at_its_largest_stays_bounded() {
        let at = Instant::now();
        let name = |i: usize| format!("{:a<63}/{:b<63}", format!("space-{i}-"), format!("actor-{i}-"));
        let flight = |i: usize| FlightView {
            actor: name(i),
            age: Duration::from_millis(123_456 + i as u64),
            attempt: Some(Duration::from_millis(98_765 + i as u64)),
            attempts: 1234,
            last_code: "ResourceExhausted",
            parked: 12_345,
            budget_left: Duration::from_millis(45_678),
        };
        let history = (0..CAPACITY)
            .map(|i| {
                let x = 1.0 + i as f64 / 7.0;
                let sample = Sample {
                    at,
                    parked: 10_000 + i,
                    verdicts_per_second: [1234.567 + x, 123.456 + x, 12.345 + x, 1.234 + x],
                    waits: Some([0.123_4 + x, 1.234_5 + x, 12.345_6 + x]),
                };
                (((CAPACITY - i) * 2) as f64, sample)
            })
            .collect();
        let recent = (0..RECENT_CAPACITY)
            .map(|i| RecentRequest {
                at: std::time::SystemTime::now(),
                method: "OPTIONS".into(),
                path: format!("/{:x<199}", i),
                actor: name(i),
                verdict: RecentVerdict::Rejected { status: 503, reason: "atenet_budget_exhausted" },
                target: "[fd00:1234:5678:9abc:def0:1234:5678:9abc]:65535".into(),
                duration: Duration::from_millis(12_345),
            })
            .collect();
        let snapshot = Snapshot {
            uptime: Duration::from_secs(1_234_567),
            parking_enabled: true,
            active: 20_000,
            active_by_band: [1_000, 15_000, 4_000],
            max_parked: 25_000,
            max_wait: Duration::from_secs(600),
            flights: 20_000,
            oldest_flights: (0..LISTED).map(flight).collect(),
            oldest_attempt: Some(Duration::from_secs(99)),
            shed: 123_456_789,
            parked_actors: (0..LISTED).map(flight).collect(),
            parked_actors_total: 20_000,
            atespaces: (0..TOP_ATESPACES)
                .map(|i| AtespaceView {
                    atespace: name(i)[..63].to_string(),
                    slots: 1_000,
                    oldest_wait: Duration::from_millis(123_456),
                    sheds_last_minute: 12_345,
                })
                .collect(),
            atespaces_total: 1_000,
            groups: (0..TOP_ATESPACES)
                .map(|i| GroupSnapshot {
                    key: format!("pool:{:p<128}", name(i)),
                    waiting: 20_000,
                    oldest_wait: Duration::from_millis(123_456),
                    last_answer: Code::FailedPrecondition,
                    probe_open: true,
                })
                .collect(),
            groups_total: 1_000,
            ateapi_address: format!("{:z<253}:443", "ateapi."),
            connectivity: "TRANSIENT_FAILURE",
            attempts: Code::ALL.iter().map(|c| (c.name(), 123_456_789)).collect(),
            verdicts: [123_456_789; 4],
            history,
            flags: (0..40).map(|_| ("--parked-request-max-per-atespace", "v".repeat(100))).collect(),
            recent,
        };
        let (json, html) = (json(&snapshot).len(), html(&snapshot).len());
        println!("statusz at its largest: JSON {json} B, HTML {html} B");
        assert!(json <= 128 * 1024 && html <= 192 * 1024, "JSON {json} B, HTML {html} B");
    }

    #[test]
    fn b91_a_series_breaks_where_samples_are_missing() {
        let at = Instant::now();
        let sample = |parked| Sample { at, parked, verdicts_per_second: [0.0; 4], waits: None };
        let history = [(30.0, sample(1)), (28.0, sample(2)), (10.0, sample(3)), (8.0, sample(4))];
        let points = series(&history, |s| Some(s.parked as f64));
        assert_eq!(points, [Some((30.0, 1.0)), Some((28.0, 2.0)), None, Some((10.0, 3.0)), Some((8.0, 4.0))]);
        assert_eq!(series(&history[..2], |s| s.waits.map(|w| w[0])), [None, None]);
    }
}

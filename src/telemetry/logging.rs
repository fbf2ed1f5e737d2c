//! The process's one log sink (B63): every record, the router's and its
//! libraries' (gRPC core's through grpcio, anything using the `log` facade),
//! is one line on stderr.
//!
//! - `text`: `2026-11-30T00:27:18.123Z WARN message key=value`;
//! - `json`: `{"time":"…","level":"warn","message":"…","key":"value"}`, one
//!   object per line, with the fields the line is about;
//! - under journald (`JOURNAL_STREAM` names this stderr), each line starts
//!   with its syslog priority (`<4>` for a warning), so `journalctl -p
//!   warning` finds it, and without the time, which the journal records.
//!
//! Under systemd or Kubernetes stderr is collected by the platform; nothing
//! here buffers, rotates or ships logs.

use std::fmt::{self, Write as _};
use std::io::Write;
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use log::{Level, LevelFilter, Log, Metadata, Record};
use parking_lot::Mutex;
use serde_json::Value;

/// How lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

impl FromStr for Format {
    type Err = ();

    fn from_str(s: &str) -> Result<Format, ()> {
        match s.trim().to_ascii_lowercase().as_str() {
            "text" => Ok(Format::Text),
            "json" => Ok(Format::Json),
            _ => Err(()),
        }
    }
}

/// Parses `--log-level`: error, warn (or warning), info, debug or trace.
pub fn parse_level(s: &str) -> Option<LevelFilter> {
    match s.trim().to_ascii_lowercase().as_str() {
        "error" => Some(LevelFilter::Error),
        "warn" | "warning" => Some(LevelFilter::Warn),
        "info" => Some(LevelFilter::Info),
        "debug" => Some(LevelFilter::Debug),
        "trace" => Some(LevelFilter::Trace),
        _ => None,
    }
}

/// The sink.
struct Sink {
    format: Format,
    /// Under journald: syslog priority prefixes, no timestamps.
    journald: bool,
}

impl Log for Sink {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record<'_>) {
        if self.enabled(record.metadata()) {
            let line = render(record, self.format, self.journald, SystemTime::now());
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
        }
    }

    fn flush(&self) {}
}

/// Installs the sink for the whole process, at `level`, and sends gRPC
/// core's own log records to it. Call once, before gRPC starts.
pub fn init(level: LevelFilter, format: Format) {
    let journald = stderr_is_journal();
    if log::set_boxed_logger(Box::new(Sink { format, journald })).is_err() {
        return; // already installed (tests run several routers in a process)
    }
    // gRPC core logs each failed connection attempt; the router reports an
    // ateapi outage itself, once. So gRPC's errors only, unless an operator
    // asks for more with GRPC_VERBOSITY.
    let grpc_level = if std::env::var_os("GRPC_VERBOSITY").is_some() { level } else { LevelFilter::Error };
    log::set_max_level(grpc_level);
    grpcio::redirect_log();
    log::set_max_level(level);
}

/// Whether stderr is the journal's stream: systemd sets `JOURNAL_STREAM` to
/// `<device>:<inode>` of the stream it connected, and a process whose stderr
/// was redirected elsewhere must not take that as true.
fn stderr_is_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else { return false };
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes one stat struct for a valid descriptor.
    if unsafe { libc::fstat(2, stat.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: fstat succeeded, so the struct is initialised.
    let stat = unsafe { stat.assume_init() };
    stream.to_string_lossy() == format!("{}:{}", stat.st_dev, stat.st_ino)
}

/// The syslog priority of a level, as journald reads it from a line prefix.
fn priority(level: Level) -> u8 {
    match level {
        Level::Error => 3,
        Level::Warn => 4,
        Level::Info => 6,
        Level::Debug | Level::Trace => 7,
    }
}

/// One record as one line, newline included.
pub fn render(record: &Record<'_>, format: Format, journald: bool, now: SystemTime) -> String {
    let mut line = String::with_capacity(128);
    if journald {
        let _ = write!(line, "<{}>", priority(record.level()));
    }
    let mut fields = Fields(Vec::new());
    let _ = record.key_values().visit(&mut fields);
    // Records from libraries say where they come from.
    let origin = (!record.target().starts_with("atenet_router")).then(|| record.target());
    match format {
        Format::Text => {
            if !journald {
                let _ = write!(line, "{} ", rfc3339(now));
            }
            let _ = write!(line, "{} ", record.level());
            if let Some(origin) = origin {
                let _ = write!(line, "[{origin}] ");
            }
            let _ = write!(line, "{}", record.args());
            for (key, value) in &fields.0 {
                if value.is_empty() || value.contains([' ', '"', '=']) {
                    let _ = write!(line, " {key}={}", json_string(value));
                } else {
                    let _ = write!(line, " {key}={value}");
                }
            }
        }
        Format::Json => {
            line.push('{');
            if !journald {
                let _ = write!(line, "\"time\":{},", json_string(&rfc3339(now)));
            }
            let _ = write!(
                line,
                "\"level\":{},\"message\":{}",
                json_string(&record.level().as_str().to_ascii_lowercase()),
                json_string(&record.args().to_string())
            );
            if let Some(origin) = origin {
                let _ = write!(line, ",\"target\":{}", json_string(origin));
            }
            for (key, value) in &fields.0 {
                let key = if matches!(key.as_str(), "time" | "level" | "message" | "target") {
                    format!("field_{key}")
                } else {
                    key.clone()
                };
                let _ = write!(line, ",{}:{}", json_string(&key), json_string(value));
            }
            line.push('}');
        }
    }
    line.push('\n');
    line
}

/// A record's key-value fields, as text.
struct Fields(Vec<(String, String)>);

impl<'kvs> log::kv::VisitSource<'kvs> for Fields {
    fn visit_pair(
        &mut self,
        key: log::kv::Key<'kvs>,
        value: log::kv::Value<'kvs>,
    ) -> Result<(), log::kv::Error> {
        self.0.push((key.to_string(), value.to_string()));
        Ok(())
    }
}

/// Lets one line through per interval and counts the rest, so a condition
/// that repeats per request (a control-plane incident, a flood of bad
/// connections) costs a line per interval, not per event, and the line says
/// what was left out.
pub struct Throttle {
    interval: Duration,
    state: Mutex<ThrottleState>,
}

struct ThrottleState {
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttle {
    pub const fn new(interval: Duration) -> Throttle {
        Throttle { interval, state: Mutex::new(ThrottleState { last: None, suppressed: 0 }) }
    }

    /// `Some(n)` when a line may be written now, `n` being how many were
    /// suppressed since the last one; `None` (and one more suppressed)
    /// otherwise.
    pub fn allow(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock();
        match state.last {
            Some(last) if now.saturating_duration_since(last) < self.interval => {
                state.suppressed += 1;
                None
            }
            _ => {
                state.last = Some(now);
                Some(std::mem::take(&mut state.suppressed))
            }
        }
    }
}

/// A JSON string literal.
pub fn json_string(text: &str) -> String {
    Value::from(text).to_string()
}

/// Formats a time as RFC 3339 UTC with milliseconds.
pub fn rfc3339(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// Days since 1970-01-01 to a (year, month, day) civil date (Howard
/// Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Text => "text",
            Format::Json => "json",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc3339_utc() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_795_998_438_123);
        assert_eq!(rfc3339(t), "2026-11-30T00:27:18.123Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }

    fn line(format: Format, journald: bool, record: &Record<'_>) -> String {
        render(record, format, journald, UNIX_EPOCH + Duration::from_millis(1_795_998_438_123))
    }

    #[test]
    fn renders_text_json_and_journald_lines_with_fields() {
        let kvs: &[(&str, &str)] = &[("actor", "demo/a"), ("worker_ip", "not an ip")];
        let args = format_args!("routing failed");
        let record = Record::builder()
            .level(Level::Warn)
            .target("atenet_router::envoy::extproc")
            .args(args)
            .key_values(&kvs)
            .build();
        assert_eq!(
            line(Format::Text, false, &record),
            "2026-11-30T00:27:18.123Z WARN routing failed actor=demo/a worker_ip=\"not an ip\"\n"
        );
        assert_eq!(
            line(Format::Json, false, &record),
            "{\"time\":\"2026-11-30T00:27:18.123Z\",\"level\":\"warn\",\"message\":\"routing failed\",\
             \"actor\":\"demo/a\",\"worker_ip\":\"not an ip\"}\n"
        );
        assert_eq!(
            line(Format::Text, true, &record),
            "<4>WARN routing failed actor=demo/a worker_ip=\"not an ip\"\n"
        );
        let args = format_args!("connect failed: \"x\"\nnext");
        let grpc = Record::builder().level(Level::Error).target("grpcio::log_util").args(args).build();
        assert_eq!(
            line(Format::Text, true, &grpc),
            "<3>ERROR [grpcio::log_util] connect failed: \"x\"\nnext\n"
        );
        assert_eq!(
            line(Format::Json, true, &grpc),
            "<3>{\"level\":\"error\",\"message\":\"connect failed: \\\"x\\\"\\nnext\",\"target\":\"grpcio::log_util\"}\n"
        );
    }

    #[test]
    fn throttle_lets_one_line_through_per_interval_and_counts_the_rest() {
        let throttle = Throttle::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(throttle.allow(t0), Some(0));
        assert_eq!(throttle.allow(t0 + Duration::from_secs(1)), None);
        assert_eq!(throttle.allow(t0 + Duration::from_secs(9)), None);
        assert_eq!(throttle.allow(t0 + Duration::from_secs(10)), Some(2));
        assert_eq!(throttle.allow(t0 + Duration::from_secs(30)), Some(0));
    }

    #[test]
    fn levels_and_formats_parse() {
        assert_eq!(parse_level("INFO"), Some(LevelFilter::Info));
        assert_eq!(parse_level("warning"), Some(LevelFilter::Warn));
        assert_eq!(parse_level("loud"), None);
        assert_eq!("JSON".parse(), Ok(Format::Json));
        assert!("xml".parse::<Format>().is_err());
    }

    #[test]
    fn escaping() {
        assert_eq!(json_string("a\"b\\c\n\u{1}"), "\"a\\\"b\\\\c\\n\\u0001\"");
    }
}

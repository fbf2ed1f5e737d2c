//! Parking: the lot, the flight budget and the retry schedule, the flight
//! caps, callers' own deadlines and the late-serve limit.

use std::time::Duration;

use super::{atespace_share, derived_flight_max, MESSAGE_TIMEOUT_MARGIN};
use crate::cli::flags::ServeArgs;
use crate::cli::godur;
use crate::cli::values::{duration, invalid, non_negative, ConfigError};
use crate::parking::backoff::{BackoffPolicy, Dispatch};
use crate::parking::share::SharePolicy;

/// The resume budget when parking is disabled: long enough to ride out
/// concurrent-resume conflicts (B18, B22).
pub(super) const UNPARKED_BUDGET: Duration = Duration::from_secs(15);

/// The largest lot: the derived circuit breaker, twice the lot, must fit
/// Envoy's `max_requests`, a UInt32 (B70).
const MAX_LOT: i64 = (u32::MAX / 2) as i64;

/// The shortest retry interval: at a factor of 1 and no jitter a flight
/// then makes at most 1,000 ResumeActor calls a second (B37).
const MIN_RETRY_INTERVAL: Duration = Duration::from_millis(1);

/// The largest retry factor: beyond it the second retry already lands
/// hours after the first, so a larger value can only be a typo.
const MAX_RETRY_FACTOR: f64 = 100.0;

/// The longest `message_timeout` and `max_message_timeout` Envoy accepts
/// (their validation rule is `lte: 3600s`).
const MAX_ENVOY_MESSAGE_TIMEOUT: Duration = Duration::from_secs(3600);

/// The most routers `--fleet-size` may count: as many as `--envoys` takes.
/// Beyond a dozen, at the defaults, a group's longest delay outgrows the
/// budget, which is what the operator asked for: a fleet that big shares a
/// pool's probes thinly.
const MAX_FLEET_SIZE: u32 = 1024;

/// Parking settings after normalisation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Parking {
    /// False when `--parked-request-max` <= 0.
    pub enabled: bool,
    /// Lot size; 0 when disabled.
    pub max: usize,
    /// Slots one atespace may hold at once; 0: no cap.
    pub max_per_atespace: usize,
    /// Slots sheddable callers may hold at once.
    pub max_sheddable: usize,
    /// The flight budget: the flag when enabled, 15 s when disabled.
    pub budget: Duration,
    /// The flag value after normalisation, shown on the status page.
    pub configured_budget: Duration,
    pub backoff: BackoffPolicy,
    /// Whether saturated flights wait in groups or retry alone.
    pub dispatch: Dispatch,
    /// Routers that share the control plane's pools (`--fleet-size`).
    pub fleet_size: u32,
    /// Flights in progress at once at most.
    pub flight_max: usize,
    /// Flights one atespace may have in progress.
    pub flight_max_per_atespace: SharePolicy,
    /// Whether a parked caller's own deadline is honoured.
    pub caller_deadlines: bool,
    /// How long past the budget a late verdict may still arrive; zero when
    /// late serve is disabled.
    pub late_serve_limit: Duration,
}

impl Parking {
    /// The lot, the budget and the retry schedule (B17, B18, B22, B37, B38),
    /// then what follows from them.
    pub(super) fn from_args(args: &ServeArgs) -> Result<Parking, ConfigError> {
        if args.parked_request_max > MAX_LOT {
            return Err(invalid(format!(
                "--parked-request-max must be at most {MAX_LOT}, got {}: the derived ext_proc circuit breaker \
                 (2 x the lot) must fit Envoy's 32-bit max_requests",
                args.parked_request_max
            )));
        }
        let max = usize::try_from(args.parked_request_max.max(0)).unwrap_or(usize::MAX);
        let enabled = max > 0;
        let configured_budget = duration("--parked-request-budget", &args.parked_request_budget)?
            .positive()
            .unwrap_or(Duration::from_secs(5));
        let interval = duration("--parked-request-retry-interval", &args.parked_request_retry_interval)?
            .positive()
            .unwrap_or(Duration::from_millis(100));
        if interval < MIN_RETRY_INTERVAL {
            return Err(invalid(format!(
                "--parked-request-retry-interval must be 0 (the default 100ms) or at least {}, got {}: \
                 a shorter one turns every parked flight into a busy loop of ResumeActor calls",
                godur::format(MIN_RETRY_INTERVAL),
                godur::format(interval)
            )));
        }
        let factor = match args.parked_request_retry_factor {
            0.0 => 1.1,
            f if (1.0..=MAX_RETRY_FACTOR).contains(&f) => f,
            f => {
                return Err(invalid(format!(
                    "--parked-request-retry-factor must be in [1, {MAX_RETRY_FACTOR}], got {f}"
                )))
            }
        };
        let jitter = args.parked_request_retry_jitter;
        if !(jitter.is_finite() && (0.0..1.0).contains(&jitter)) {
            return Err(invalid(format!("--parked-request-retry-jitter must be in [0, 1), got {jitter}")));
        }
        let budget = if enabled { configured_budget } else { UNPARKED_BUDGET };
        let max_per_atespace = match args.parked_request_max_per_atespace {
            0 => 0,
            n if n > 0 && (n as u64) <= max as u64 => n as usize,
            n if !enabled => {
                return Err(invalid(format!(
                    "--parked-request-max-per-atespace must be 0 while parking is off \
                     (--parked-request-max <= 0): a cap needs a lot, got {n}"
                )))
            }
            n => {
                return Err(invalid(format!(
                    "--parked-request-max-per-atespace must be 0 (no cap) or in 1..={max} (the lot size), got {n}"
                )))
            }
        };
        let dispatch = Dispatch::parse(&args.parked_request_dispatch).ok_or_else(|| {
            invalid(format!(
                "--parked-request-dispatch must be saturation-group or per-flight, got {:?}",
                args.parked_request_dispatch
            ))
        })?;
        let fleet_size = fleet_size(args.fleet_size)?;
        // B117: half the lot unless told otherwise; never more than the lot.
        let max_sheddable = match args.parked_request_max_sheddable {
            None => max.div_ceil(2),
            Some(n) if n >= 0 && (n as u64) <= max as u64 => n as usize,
            Some(n) => {
                return Err(invalid(format!(
                    "--parked-request-max-sheddable must be in 0..={max} (--parked-request-max), got {n}"
                )))
            }
        };
        let flight_max = match args.flight_max {
            0 => derived_flight_max(max),
            n if n > 0 => usize::try_from(n).unwrap_or(usize::MAX),
            n => return Err(invalid(format!("--flight-max must not be negative, got {n}"))),
        };
        Ok(Parking {
            enabled,
            max,
            max_per_atespace,
            max_sheddable,
            budget,
            configured_budget,
            backoff: BackoffPolicy { interval, factor, jitter },
            dispatch,
            fleet_size,
            flight_max,
            flight_max_per_atespace: atespace_share(
                "--flight-max-per-atespace",
                args.flight_max_per_atespace,
                "--flight-max",
                flight_max as u64,
            )?,
            caller_deadlines: args.caller_deadlines,
            late_serve_limit: late_serve_limit(args, budget)?,
        })
    }

    /// The longest a caller can wait for its verdict: the budget, then the
    /// late-serve limit while an attempt runs on (B19, B49).
    pub fn longest_wait(&self) -> Duration {
        self.budget + self.late_serve_limit
    }
}

/// `--fleet-size`: 1 (a router alone) to [`MAX_FLEET_SIZE`] (B127).
fn fleet_size(flag: i64) -> Result<u32, ConfigError> {
    u32::try_from(flag).ok().filter(|n| (1..=MAX_FLEET_SIZE).contains(n)).ok_or_else(|| {
        invalid(format!(
            "--fleet-size must be 1 (a router alone) to {MAX_FLEET_SIZE} (the routers that share the control \
             plane's pools), got {flag}"
        ))
    })
}

/// The late-serve limit, within what Envoy's message timeouts allow (B37).
fn late_serve_limit(args: &ServeArgs, budget: Duration) -> Result<Duration, ConfigError> {
    let limit = non_negative("--late-serve-limit", &args.late_serve_limit)?;
    if !limit.is_zero() && limit <= MESSAGE_TIMEOUT_MARGIN {
        return Err(invalid(format!(
            "--late-serve-limit ({}) must be 0 or above the {} Envoy already waits past the budget",
            godur::format(limit),
            godur::format(MESSAGE_TIMEOUT_MARGIN)
        )));
    }
    // Envoy takes at most an hour for either of its ext_proc message timeouts.
    let past_budget =
        if limit.is_zero() { MESSAGE_TIMEOUT_MARGIN } else { limit.max(MESSAGE_TIMEOUT_MARGIN) };
    if budget + past_budget > MAX_ENVOY_MESSAGE_TIMEOUT {
        return Err(invalid(format!(
            "--parked-request-budget ({}) plus {} must stay within Envoy's {} ext_proc message timeout \
             (with --late-serve-limit {})",
            godur::format(budget),
            godur::format(past_budget),
            godur::format(MAX_ENVOY_MESSAGE_TIMEOUT),
            godur::format(limit)
        )));
    }
    Ok(limit)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::cli::config::tests::parse;

    #[test]
    fn b38_normalisation() {
        let c = parse(&[
            "--parked-request-budget",
            "0",
            "--parked-request-retry-interval",
            "-5ms",
            "--parked-request-retry-factor",
            "0",
        ])
        .unwrap();
        assert_eq!(c.parking.budget, Duration::from_secs(5));
        assert_eq!(c.parking.backoff.interval, Duration::from_millis(100));
        assert_eq!(c.parking.backoff.factor, 1.1);
    }
}

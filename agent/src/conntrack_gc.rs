//! The agent's conntrack garbage collector: in the background, a pass over the conntrack
//! tables that removes their expired entries (`dataplane::remove_expired_flows`), on a
//! blocking thread, until the agent stops. Independent of the syncs: the tables are the
//! programs', not the cluster's.
use std::{fmt, future::Future, path::PathBuf, str::FromStr, sync::Arc, time::Duration};

use tracing::{debug, error, info, warn};

use crate::{
    dataplane::{self, ExpiredFlows, GC_INTERVAL_MAX, GC_INTERVAL_MIN},
    error_chain,
    metrics::Metrics,
};

/// How often the tables are swept (`--conntrack-gc-interval`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GcInterval {
    /// Every shortest conntrack timeout, within [`GC_INTERVAL_MIN`] and [`GC_INTERVAL_MAX`]
    /// (10 s by default).
    Auto,
    /// Never: expired entries go when a packet of their flow comes, or when the LRU needs
    /// room.
    Off,
    /// Every this long.
    Every(Duration),
}

/// The longest `--conntrack-gc-interval`: a day (`off` is for never). Bounded so that a
/// value of years is refused with the flag's name rather than kept as a pass that never
/// comes.
pub const EVERY_MAX: Duration = Duration::from_secs(24 * 3600);

impl FromStr for GcInterval {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "auto" => Ok(Self::Auto),
            "off" => Ok(Self::Off),
            _ => match humantime::parse_duration(text) {
                Ok(every) if (GC_INTERVAL_MIN..=EVERY_MAX).contains(&every) => {
                    Ok(Self::Every(every))
                }
                Ok(_) => Err(format!(
                    "give between {} and {} (or auto, or off)",
                    humantime::format_duration(GC_INTERVAL_MIN),
                    humantime::format_duration(EVERY_MAX)
                )),
                Err(error) => Err(format!("{error}: give auto, off or a duration")),
            },
        }
    }
}

impl fmt::Display for GcInterval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Off => f.write_str("off"),
            Self::Every(every) => write!(f, "{}", humantime::format_duration(*every)),
        }
    }
}

/// Removes the expired entries of the conntrack tables pinned in `pin_dir` every
/// `interval` until `stop` completes. A failed pass is logged once (and once more when
/// passes work again), and tried again after a second.
pub async fn run(
    pin_dir: PathBuf,
    interval: GcInterval,
    metrics: Arc<Metrics>,
    stop: impl Future<Output = ()>,
) {
    let wanted = match interval {
        GcInterval::Off => return,
        GcInterval::Auto => None,
        GcInterval::Every(every) => Some(every),
    };
    tokio::pin!(stop);
    let mut wait = GC_INTERVAL_MIN;
    let mut failing = false;
    loop {
        tokio::select! {
            () = &mut stop => return,
            () = tokio::time::sleep(wait) => {}
        }
        let dir = pin_dir.clone();
        let pass = tokio::task::spawn_blocking(move || dataplane::remove_expired_flows(&dir)).await;
        wait = match pass {
            Ok(Ok(ExpiredFlows { removed, next_in })) => {
                if failing {
                    info!("expired conntrack entries are removed again");
                    failing = false;
                }
                metrics.conntrack_expired_removed.inc_by(removed as u64);
                let next_in = wanted.unwrap_or(next_in);
                debug!(removed, next_in = ?next_in, "removed expired conntrack entries");
                next_in
            }
            Ok(Err(error)) => {
                if !failing {
                    warn!(
                        error = %error_chain(&error),
                        "cannot remove expired conntrack entries (the LRU evicts them when a \
                         table is full); trying again"
                    );
                    failing = true;
                }
                GC_INTERVAL_MIN
            }
            Err(panicked) => {
                error!(error = %panicked, "the conntrack GC's pass panicked; trying again");
                GC_INTERVAL_MAX
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_is_auto_off_or_between_a_second_and_a_day() {
        for (text, parsed) in [
            ("auto", Ok(GcInterval::Auto)),
            ("off", Ok(GcInterval::Off)),
            ("30s", Ok(GcInterval::Every(Duration::from_secs(30)))),
            ("1s", Ok(GcInterval::Every(Duration::from_secs(1)))),
            ("1day", Ok(GcInterval::Every(EVERY_MAX))),
        ] {
            assert_eq!(text.parse::<GcInterval>(), parsed, "{text}");
            assert_eq!(parsed.map(|p| p.to_string()).as_deref(), Ok(text));
        }
        for text in [
            "500ms",
            "0s",
            "often",
            "",
            "1day 1s",
            "10000000000000000000s",
        ] {
            assert!(text.parse::<GcInterval>().is_err(), "{text}");
        }
        assert_eq!(
            "2days".parse::<GcInterval>(),
            Err("give between 1s and 1day (or auto, or off)".to_owned())
        );
    }
}

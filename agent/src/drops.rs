//! Packets the programs drop for want of a resource the operator can give, said in the log
//! (the counters alone are silent): one warning when drops start, then at most one a
//! minute while they go on, with how many since the last one. Pure: the runner reads the
//! counters and logs what [`Drops::observe`] returns.
use std::time::{Duration, Instant};

use socklb_abi::Counters;

/// At most one warning per kind of drop in this time.
pub const WARN_EVERY: Duration = Duration::from_secs(60);

/// How often the runner reads the counters for this.
pub const CHECK_EVERY: Duration = Duration::from_secs(5);

/// A warning to log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Warning {
    /// Packets from outside dropped because no SNAT port was free, since the last warning
    /// (or since the drops started).
    SnatExhausted { dropped: u64, over: Duration },
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::SnatExhausted { dropped, over } => write!(
                f,
                "{dropped} packets from outside dropped in the last {} because no SNAT port \
                 was free (counter snat_exhausted): new flows to backends on other nodes \
                 fail while every port of --snat-port-range is held by a flow. Widen \
                 --snat-port-range, or shorten the timeouts that hold ports (a SYN flood \
                 holds them for --conntrack-tcp-timeout-syn; closed flows for \
                 --conntrack-tcp-timeout-close; UDP for --conntrack-udp-timeout)",
                humantime::format_duration(Duration::from_secs(over.as_secs().max(1)))
            ),
        }
    }
}

/// The last reading and what is not reported yet.
#[derive(Debug, Default)]
pub struct Drops {
    last: Option<Counters>,
    snat: Limited,
}

#[derive(Debug, Default)]
struct Limited {
    warned: Option<Instant>,
    /// Drops since the last warning, and since when.
    unreported: u64,
    since: Option<Instant>,
}

impl Limited {
    fn add(&mut self, now: Instant, dropped: u64) -> Option<(u64, Duration)> {
        if dropped > 0 {
            self.unreported += dropped;
            self.since.get_or_insert(now);
        }
        let due = self
            .warned
            .is_none_or(|warned| now.duration_since(warned) >= WARN_EVERY);
        if self.unreported == 0 || !due {
            return None;
        }
        let over = match self.warned {
            Some(warned) => now.duration_since(warned),
            None => now.duration_since(self.since.unwrap_or(now)),
        };
        self.warned = Some(now);
        self.since = None;
        Some((std::mem::take(&mut self.unreported), over.max(CHECK_EVERY)))
    }
}

impl Drops {
    /// Takes a reading of the counters; the warnings due now. The first reading is the
    /// baseline (what earlier agents saw is not reported again).
    pub fn observe(&mut self, now: Instant, counters: Counters) -> Vec<Warning> {
        let Some(last) = self.last.replace(counters) else {
            return Vec::new();
        };
        let since = counters.since(&last);
        self.snat
            .add(now, since.snat_exhausted)
            .map(|(dropped, over)| Warning::SnatExhausted { dropped, over })
            .into_iter()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exhausted(total: u64) -> Counters {
        Counters {
            snat_exhausted: total,
            ..Counters::default()
        }
    }

    #[test]
    fn warns_when_drops_start_then_at_most_once_a_minute_with_the_sum() {
        let start = Instant::now();
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        let mut drops = Drops::default();
        // (seconds, counter total, warning's count)
        let rows = [
            // the baseline: an earlier agent's drops are not reported
            (0, 500, None),
            (5, 500, None),
            // drops start: at once
            (10, 13_974, Some(13_474)),
            // more within the minute: held back, then summed
            (15, 14_000, None),
            (65, 14_100, None),
            (70, 14_100, Some(126)),
            // none since: nothing
            (200, 14_100, None),
            // again, long after: at once
            (205, 14_101, Some(1)),
        ];
        for (seconds, total, expected) in rows {
            let warnings = drops.observe(at(seconds), exhausted(total));
            let got = warnings
                .first()
                .map(|Warning::SnatExhausted { dropped, .. }| *dropped);
            assert_eq!(got, expected, "at {seconds} s, total {total}");
        }
    }

    #[test]
    fn the_warning_says_what_it_means_and_what_to_do() {
        let text = Warning::SnatExhausted {
            dropped: 13_974,
            over: Duration::from_secs(5),
        }
        .to_string();
        for part in [
            "13974 packets",
            "no SNAT port was free",
            "snat_exhausted",
            "--snat-port-range",
            "--conntrack-tcp-timeout-syn",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
    }
}

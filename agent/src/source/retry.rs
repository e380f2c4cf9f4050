//! How long a watch waits before it asks the API server again after a failure (kube-rs's
//! default, client-go's, had grown to tens of seconds by the end of a 15 s outage).
//!
//! Delays double from [`BASE`] to a cap, each drawn between half and all of its step so that
//! a cluster's agents do not come back in step; they start again when an unreachable server
//! answers again (at most once per [`RESTART_GUARD`]), grow to [`THROTTLED_MAX`] while it
//! throttles (429), and a first 410 Gone relists within [`GONE_SPREAD`]. Why these numbers:
//! docs/operations.md, "The API server goes away".
//!
//! Pure: time and randomness come from the caller, so the policy is unit tested.
use std::time::{Duration, Instant};

/// The first delay of a sequence.
pub const BASE: Duration = Duration::from_millis(250);

/// The default cap: the longest a watch waits between two attempts.
pub const DEFAULT_MAX: Duration = Duration::from_secs(2);

/// The cap while the server throttles (429): the delay client-go's reflector grows to.
pub const THROTTLED_MAX: Duration = Duration::from_secs(30);

/// The longest wait before the relist that follows a first 410 Gone.
pub const GONE_SPREAD: Duration = Duration::from_secs(1);

/// Least time between two restarts of the sequence by a server that answers again.
pub const RESTART_GUARD: Duration = Duration::from_secs(60);

/// What kind of failure a watch saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// No answer: connection refused or reset, timeout, TLS or transport error.
    Unreachable,
    /// The server answered with an error: 403, 5xx, a malformed answer.
    Refused,
    /// The server answered 429 Too Many Requests: it asks its clients to slow down.
    Throttled,
    /// 410 Gone: the resource version expired; the watcher relists.
    Gone,
}

/// One watch's retry state.
#[derive(Clone, Debug)]
pub struct Retry {
    max: Duration,
    /// Failures since the sequence started.
    failures: u32,
    last: Option<Failure>,
    restarted: Option<Instant>,
}

impl Retry {
    /// `max` below [`BASE`] is raised to it: a retry loop always waits a little.
    pub fn new(max: Duration) -> Self {
        Self {
            max: max.max(BASE),
            failures: 0,
            last: None,
            restarted: None,
        }
    }

    /// The delay before the next attempt after `failure` at `now`; `jitter` in [0, 1) picks
    /// the point between half and all of the step's delay.
    pub fn delay(&mut self, failure: Failure, now: Instant, jitter: f64) -> Duration {
        let came_back = self.last == Some(Failure::Unreachable) && failure == Failure::Refused;
        if came_back && self.restarted.is_none_or(|at| now >= at + RESTART_GUARD) {
            self.failures = 0;
            self.restarted = Some(now);
        }
        let first_gone = failure == Failure::Gone && self.last != Some(Failure::Gone);
        self.last = Some(failure);
        if first_gone {
            return GONE_SPREAD.mul_f64(jitter.clamp(0.0, 1.0));
        }
        let cap = if failure == Failure::Throttled {
            self.max.max(THROTTLED_MAX)
        } else {
            self.max
        };
        let step = BASE.saturating_mul(1 << self.failures.min(16)).min(cap);
        self.failures = self.failures.saturating_add(1);
        step.mul_f64(0.5 + jitter.clamp(0.0, 1.0) / 2.0)
    }

    /// The watch works again: the next failure starts a new sequence.
    pub fn reset(&mut self) {
        self.failures = 0;
        self.last = None;
    }

    /// Failures since the last reset (or restart of the sequence).
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    fn each_ms(millis: &[u64]) -> Vec<Duration> {
        millis.iter().copied().map(ms).collect()
    }

    /// The delays of a sequence of failures at `now`, with the largest jitter (the bound).
    fn delays(retry: &mut Retry, failures: &[Failure], now: Instant) -> Vec<Duration> {
        failures
            .iter()
            .map(|failure| retry.delay(*failure, now, 1.0))
            .collect()
    }

    #[test]
    fn delays_double_up_to_the_cap() {
        let mut retry = Retry::new(Duration::from_secs(2));
        let failures = [Failure::Unreachable; 7];
        assert_eq!(
            delays(&mut retry, &failures, Instant::now()),
            each_ms(&[250, 500, 1000, 2000, 2000, 2000, 2000])
        );
        // Thousands of failures (a long outage) stay at the cap.
        for _ in 0..10_000 {
            retry.delay(Failure::Unreachable, Instant::now(), 0.5);
        }
        assert_eq!(
            retry.delay(Failure::Unreachable, Instant::now(), 1.0),
            ms(2000)
        );
    }

    #[test]
    fn jitter_draws_between_half_and_all_of_the_step() {
        let now = Instant::now();
        let rows = [
            (0.0, ms(125)),
            (0.5, ms(187) + Duration::from_micros(500)),
            (1.0, ms(250)),
        ];
        for (jitter, expected) in rows {
            let mut retry = Retry::new(DEFAULT_MAX);
            assert_eq!(
                retry.delay(Failure::Unreachable, now, jitter),
                expected,
                "{jitter}"
            );
        }
        // Out of range jitter is clamped, never beyond the step.
        let mut retry = Retry::new(DEFAULT_MAX);
        assert_eq!(retry.delay(Failure::Unreachable, now, 7.0), ms(250));
    }

    #[test]
    fn a_server_that_answers_again_is_asked_again_soon() {
        let now = Instant::now();
        let mut retry = Retry::new(Duration::from_secs(2));
        delays(&mut retry, &[Failure::Unreachable; 10], now);
        // Back, but refusing (403 while its authorizer warms up): quick retries, growing.
        let refused = delays(&mut retry, &[Failure::Refused; 5], now);
        assert_eq!(refused, each_ms(&[250, 500, 1000, 2000, 2000]));
        // Then 410 Gone on the old resource version: relist within a second; again: back
        // off.
        assert_eq!(
            delays(&mut retry, &[Failure::Gone, Failure::Gone], now),
            [GONE_SPREAD, ms(2000)]
        );
    }

    #[test]
    fn a_flapping_server_restarts_the_sequence_at_most_once_a_minute() {
        let start = Instant::now();
        let mut retry = Retry::new(Duration::from_secs(2));
        let flaps = [Failure::Unreachable, Failure::Refused].repeat(4);
        let delays_now = delays(&mut retry, &flaps, start);
        assert_eq!(
            delays_now,
            each_ms(&[250, 250, 500, 1000, 2000, 2000, 2000, 2000])
        );
        let later = start + RESTART_GUARD;
        let delays_later = delays(&mut retry, &[Failure::Unreachable, Failure::Refused], later);
        assert_eq!(delays_later, [ms(2000), ms(250)]);
    }

    #[test]
    fn an_object_received_starts_a_new_sequence() {
        let now = Instant::now();
        let mut retry = Retry::new(DEFAULT_MAX);
        delays(&mut retry, &[Failure::Refused; 6], now);
        retry.reset();
        assert_eq!(retry.failures(), 0);
        assert_eq!(delays(&mut retry, &[Failure::Refused], now), [ms(250)]);
        // A 410 after a working watch relists within a second, spread by the jitter.
        retry.reset();
        assert_eq!(delays(&mut retry, &[Failure::Gone], now), [GONE_SPREAD]);
        retry.reset();
        assert_eq!(retry.delay(Failure::Gone, now, 0.0), Duration::ZERO);
        retry.reset();
        assert_eq!(retry.delay(Failure::Gone, now, 0.25), ms(250));
    }

    #[test]
    fn a_throttling_server_is_asked_less_and_less_often_up_to_client_gos_cap() {
        let now = Instant::now();
        let mut retry = Retry::new(DEFAULT_MAX);
        // Unreachable, then 429s: not "back" (no restart), and past the usual cap.
        let mut failures = vec![Failure::Unreachable];
        failures.extend([Failure::Throttled; 9]);
        let waits = delays(&mut retry, &failures, now);
        assert_eq!(waits[1], ms(500), "{waits:?}");
        assert_eq!(waits.last(), Some(&THROTTLED_MAX), "{waits:?}");
        // Once the server stops throttling, the usual cap applies again.
        assert_eq!(retry.delay(Failure::Refused, now, 1.0), DEFAULT_MAX);
    }

    #[test]
    fn a_cap_below_the_base_still_waits() {
        let mut retry = Retry::new(Duration::ZERO);
        assert_eq!(retry.delay(Failure::Unreachable, Instant::now(), 1.0), BASE);
    }
}

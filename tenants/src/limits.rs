//! Per-tenant request limits: a token bucket for the rate, a counter for
//! requests in flight. The state outlives reloads of the tenants file (it is
//! keyed by tenant name), so rewriting the file does not refill a bucket.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;

use crate::config::Limits;

/// Why a request over its tenant's limits is refused, and when to retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Over {
    /// The rate limit: the bucket refills one request in `retry_after`.
    Rate { retry_after: Duration },
    /// The concurrent-request limit (`limit` in flight already).
    Concurrency { limit: u32 },
}

/// One tenant's limiter state.
#[derive(Debug)]
pub(crate) struct LimitState {
    bucket: Mutex<Bucket>,
    inflight: Arc<AtomicU32>,
}

#[derive(Debug)]
struct Bucket {
    /// Requests that may start now (fractional while refilling); `None`
    /// until the first request (then it starts full).
    tokens: Option<f64>,
    last: Instant,
}

/// Held while an admitted request runs; dropping it frees its slot.
#[derive(Debug)]
pub struct InflightGuard {
    counter: Arc<AtomicU32>,
    gauge: Gauge,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::AcqRel);
        self.gauge.dec();
    }
}

impl LimitState {
    pub(crate) fn new() -> LimitState {
        LimitState {
            bucket: Mutex::new(Bucket {
                tokens: None,
                last: Instant::now(),
            }),
            inflight: Arc::new(AtomicU32::new(0)),
        }
    }

    /// Take a concurrency slot and a rate token, or neither.
    pub(crate) fn admit(
        &self,
        limits: &Limits,
        now: Instant,
        gauge: Gauge,
    ) -> Result<InflightGuard, Over> {
        let taken = self.inflight.fetch_add(1, Ordering::AcqRel);
        gauge.inc();
        let guard = InflightGuard {
            counter: self.inflight.clone(),
            gauge,
        };
        if let Some(limit) = limits.max_concurrent {
            if taken >= limit {
                return Err(Over::Concurrency { limit });
            }
        }
        if let Some(rate) = limits.rate_per_s {
            self.take_token(rate, limits.burst, now)?;
        }
        Ok(guard)
    }

    fn take_token(&self, rate: f64, burst: f64, now: Instant) -> Result<(), Over> {
        let mut b = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
        let tokens = match b.tokens {
            None => burst,
            Some(t) => (t + elapsed * rate).min(burst),
        };
        b.last = now;
        if tokens >= 1.0 {
            b.tokens = Some(tokens - 1.0);
            Ok(())
        } else {
            b.tokens = Some(tokens);
            Err(Over::Rate {
                retry_after: Duration::from_secs_f64((1.0 - tokens) / rate),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(rate: Option<f64>, burst: f64, conc: Option<u32>) -> Limits {
        Limits {
            rate_per_s: rate,
            burst,
            max_concurrent: conc,
        }
    }

    #[test]
    fn bucket_allows_burst_then_refills_at_rate() {
        let s = LimitState::new();
        let l = limits(Some(2.0), 2.0, None);
        let t0 = Instant::now();
        let g = Gauge::default();
        let a = s.admit(&l, t0, g.clone()).expect("1st");
        let b = s.admit(&l, t0, g.clone()).expect("2nd");
        drop((a, b));
        match s.admit(&l, t0, g.clone()) {
            Err(Over::Rate { retry_after }) => {
                assert!(
                    (retry_after.as_secs_f64() - 0.5).abs() < 1e-6,
                    "{retry_after:?}"
                )
            }
            other => panic!("expected rate limit, got {other:?}"),
        }
        assert_eq!(g.get(), 0, "a refused request holds no slot");
        let later = t0 + Duration::from_millis(500);
        assert!(s.admit(&l, later, g.clone()).is_ok(), "refilled");
        assert!(s.admit(&l, later, g).is_err());
    }

    #[test]
    fn concurrency_slots_come_back_on_drop() {
        let s = LimitState::new();
        let l = limits(None, 1.0, Some(2));
        let now = Instant::now();
        let g = Gauge::default();
        let a = s.admit(&l, now, g.clone()).expect("1");
        let _b = s.admit(&l, now, g.clone()).expect("2");
        assert_eq!(
            s.admit(&l, now, g.clone()).expect_err("3rd"),
            Over::Concurrency { limit: 2 }
        );
        assert_eq!(g.get(), 2);
        drop(a);
        assert!(s.admit(&l, now, g).is_ok(), "a slot was freed");
    }
}

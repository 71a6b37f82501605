//! The soak's fd rule: a process's open fds may rise after warm-up while
//! its connection pools fill (each pool to a peer is bounded: at most
//! `transfer_connections_per_peer` idle connections, and as many server
//! ends on the peer), but must not keep rising with every fault, as a leak
//! does.
//!
//! The fd count of every process is sampled after warm-up at the start of
//! every fault round (before the fault) and once more at the end, after the
//! load stopped and 3 s of quiet. Samples of one incarnation (a restart
//! begins a new one) are judged alone: the first half of them is the
//! settling time (first contacts to each peer, reconnects after a peer's
//! restart), and the last sample must not exceed the highest count seen in
//! that first half. A leak of even one socket per peer restart breaks it
//! once restarts go on in the second half; a pool that filled does not.

use serde_json::{json, Value};

/// One fd sample of one process.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FdSample {
    /// Seconds since the soak started.
    pub at_s: f64,
    /// Which incarnation (1 + restarts so far).
    pub starts: u32,
    pub fds: u64,
}

/// Fewest samples of one incarnation the rule judges (fewer: too young).
pub const MIN_SAMPLES: usize = 4;

/// The verdict on the samples of one process (in time order): the last
/// incarnation's samples, the settled bound, and whether it grew past it.
pub fn judge(samples: &[FdSample]) -> Value {
    let Some(last) = samples.last() else {
        return json!({"judged": false, "grew": false});
    };
    let mine: Vec<&FdSample> = samples.iter().filter(|s| s.starts == last.starts).collect();
    let series: Vec<Value> = mine.iter().map(|s| json!([s.at_s, s.fds])).collect();
    if mine.len() < MIN_SAMPLES {
        return json!({"judged": false, "grew": false, "samples": series});
    }
    let settle = mine.len().div_ceil(2).min(mine.len() - 1);
    let bound = mine[..settle].iter().map(|s| s.fds).max().unwrap_or(0);
    json!({
        "judged": true,
        "settled_max": bound,
        "end": last.fds,
        "grew": last.fds > bound,
        "samples": series,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(fds: &[u64], restart_at: Option<usize>) -> Vec<FdSample> {
        fds.iter()
            .enumerate()
            .map(|(i, &fds)| FdSample {
                at_s: 30.0 + 20.0 * i as f64,
                starts: if restart_at.is_some_and(|r| i >= r) {
                    2
                } else {
                    1
                },
                fds,
            })
            .collect()
    }

    #[test]
    fn a_pool_that_fills_passes_and_a_leak_fails() {
        // Pools fill in the first rounds, then hold.
        let v = judge(&series(&[51, 55, 58, 62, 61, 62, 60, 59], None));
        assert_eq!(v["grew"], false, "{v}");
        assert_eq!(v["settled_max"], 62);
        // Three more sockets after every peer restart.
        let v = judge(&series(&[51, 54, 57, 60, 63, 66, 69], None));
        assert_eq!(v["grew"], true, "{v}");
    }

    #[test]
    fn only_the_last_incarnation_is_judged_and_a_young_one_is_not() {
        // The restart (index 5) starts a fresh count; its 3 samples are too few.
        let v = judge(&series(&[40, 41, 42, 43, 44, 30, 50, 60], Some(5)));
        assert_eq!(v["judged"], false, "{v}");
        assert_eq!(v["grew"], false);
        let v = judge(&series(&[40, 41, 42, 30, 31, 33, 31, 32], Some(3)));
        assert_eq!(v["judged"], true, "{v}");
        assert_eq!(v["grew"], false, "{v}");
        assert_eq!(judge(&[])["judged"], false);
    }
}

//! The soak's fd rule, pool-aware: a process's open fds are
//! split into its pooled TCP connections and everything else, and each part
//! has its own rule, its bound taken from the config the soak gave the
//! processes, never from the counts a run saw.
//!
//! - **Pools**: a connection to or from a transfer port (`transfer_port`)
//!   or an HTTP port of the soak (`http_ports`) belongs to the pool of that
//!   peer and direction (`transfer -> 10.1.0.3`: this process's client
//!   connections to that peer's transfer port; `transfer <- 10.1.0.3`: the
//!   server ends of that peer's pool here). Under load a pool may hold any
//!   number (batches and requests in flight); at the end, after the load
//!   stopped, each holds at most its idle bound
//!   (`transfer_idle_connections_per_peer`, or one HTTP connection per driver
//!   session plus the bench's health probe). A pool fills when it fills
//!   (a measured run's late plateau: e1 41 47 48 49 | 50 47 50 50), and the
//!   rule does not care when.
//! - **Dead connections**: at the end no process may hold a connection to
//!   a test-bed address whose other end no live soak process holds (a
//!   connection to a killed peer's old incarnation, or one in CLOSE_WAIT).
//! - **Everything else** (files, pipes, eventfds, listeners, etcd and gRPC
//!   connections): judged per incarnation (a restart begins a new one) over
//!   the samples taken after warm-up, every fault round and at the end. The
//!   first half of them is the settling time (after a restart: reconnecting
//!   to etcd, opening the disk tier); the end must not pass the highest
//!   count of that first half. A leak of one fd per round breaks it.

use std::collections::{BTreeMap, HashSet};
use std::net::{Ipv4Addr, SocketAddrV4};

use kvfabric_testbed::TcpSocket;
use serde_json::{json, Value};

/// What the config allows each pool to keep idle.
#[derive(Clone, Debug)]
pub struct Bounds {
    /// The engines' transfer listen port.
    pub transfer_port: u16,
    /// `transfer_idle_connections_per_peer` as the engines were given it:
    /// the most idle connections a transfer pool keeps per peer (and so the
    /// most server ends of one peer's pool).
    pub transfer_per_peer: u64,
    /// The engines' and the router's HTTP ports.
    pub http_ports: Vec<u16>,
    /// The most HTTP connections in flight to one process from one host
    /// (one per driver session, plus the bench's health probe); an idle
    /// keep-alive pool (the router's to each engine) holds no more.
    pub http_per_peer: u64,
    /// The test bed's addresses: a connection to one of them has its other
    /// end in a soak process.
    pub hosts: HashSet<Ipv4Addr>,
}

impl Bounds {
    /// The pool `s` belongs to, if any, and that pool's idle bound.
    fn pool_of(&self, s: &TcpSocket) -> Option<(String, u64)> {
        let (kind, bound) = if [s.local.port(), s.remote.port()].contains(&self.transfer_port) {
            ("transfer", self.transfer_per_peer)
        } else if self
            .http_ports
            .iter()
            .any(|p| *p == s.local.port() || *p == s.remote.port())
        {
            ("http", self.http_per_peer)
        } else {
            return None;
        };
        // The side whose port is the service port is the server end.
        let server = [self.transfer_port]
            .iter()
            .chain(&self.http_ports)
            .any(|p| *p == s.local.port());
        let dir = if server { "<-" } else { "->" };
        Some((format!("{kind} {dir} {}", s.remote.ip()), bound))
    }
}

/// One fd sample of one process.
#[derive(Clone, Debug, PartialEq)]
pub struct FdSample {
    /// Seconds since the soak started.
    pub at_s: f64,
    /// Which incarnation (1 + restarts so far).
    pub starts: u32,
    /// Every open fd.
    pub fds: u64,
    /// Connections in each pool (see [`Bounds`]).
    pub pools: BTreeMap<String, u64>,
    /// Connections to a test-bed address whose other end no live soak
    /// process holds (`ESTABLISHED 10.1.0.2:40112 -> 10.1.0.4:7000`).
    pub dead: Vec<String>,
}

impl FdSample {
    /// The fds that are not pooled connections.
    pub fn other(&self) -> u64 {
        self.fds.saturating_sub(self.pools.values().sum())
    }
}

/// Every (local, remote) pair some soak process holds now.
pub type Live = HashSet<(SocketAddrV4, SocketAddrV4)>;

/// The live set of the sockets every soak process holds.
pub fn live(all: &[Vec<TcpSocket>]) -> Live {
    all.iter().flatten().map(|s| (s.local, s.remote)).collect()
}

/// One process's sample from its fd count and TCP sockets.
pub fn sample(
    at_s: f64,
    starts: u32,
    fds: u64,
    sockets: &[TcpSocket],
    live: &Live,
    b: &Bounds,
) -> FdSample {
    let mut pools = BTreeMap::new();
    let mut dead = Vec::new();
    for s in sockets.iter().filter(|s| s.state != "LISTEN") {
        if let Some((pool, _)) = b.pool_of(s) {
            *pools.entry(pool).or_insert(0) += 1;
        }
        if b.hosts.contains(s.remote.ip()) && !live.contains(&(s.remote, s.local)) {
            dead.push(format!("{} {} -> {}", s.state, s.local, s.remote));
        }
    }
    FdSample {
        at_s,
        starts,
        fds,
        pools,
        dead,
    }
}

/// Fewest samples of one incarnation whose other fds are judged.
pub const MIN_SAMPLES: usize = 4;

/// The verdict on the samples of one process (in time order, the last one
/// taken after the load stopped).
pub fn judge(samples: &[FdSample], b: &Bounds) -> Value {
    let Some(last) = samples.last() else {
        return json!({"judged": false, "grew": false});
    };
    let mine: Vec<&FdSample> = samples.iter().filter(|s| s.starts == last.starts).collect();
    let series: Vec<Value> = mine
        .iter()
        .map(|s| json!({"at_s": s.at_s, "fds": s.fds, "other": s.other(), "pools": s.pools}))
        .collect();
    let over: BTreeMap<&String, &u64> = last
        .pools
        .iter()
        .filter(|(k, n)| **n > bound_of(k, b))
        .collect();
    let (judged, settled_max) = if mine.len() < MIN_SAMPLES {
        (false, None)
    } else {
        let settle = mine.len().div_ceil(2).min(mine.len() - 1);
        (true, mine[..settle].iter().map(|s| s.other()).max())
    };
    let other_grew = settled_max.is_some_and(|m| last.other() > m);
    json!({
        "judged": judged,
        "other_settled_max": settled_max,
        "other_end": last.other(),
        "pools_over_bound": over,
        "dead_at_end": last.dead,
        "grew": other_grew || !over.is_empty() || !last.dead.is_empty(),
        "samples": series,
    })
}

/// The idle bound of a pool key made by [`Bounds::pool_of`].
fn bound_of(key: &str, b: &Bounds) -> u64 {
    if key.starts_with("transfer") {
        b.transfer_per_peer
    } else {
        b.http_per_peer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const E1: [u8; 4] = [10, 1, 0, 2];
    const E2: [u8; 4] = [10, 1, 0, 3];
    const E3: [u8; 4] = [10, 1, 0, 4];

    fn bounds() -> Bounds {
        Bounds {
            transfer_port: 7000,
            transfer_per_peer: 4,
            http_ports: vec![8000, 9000],
            http_per_peer: 3,
            hosts: [E1, E2, E3].map(Ipv4Addr::from).into_iter().collect(),
        }
    }

    fn at(ip: [u8; 4], port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::from(ip), port)
    }

    fn conn(local: SocketAddrV4, remote: SocketAddrV4, state: &'static str) -> TcpSocket {
        TcpSocket {
            local,
            remote,
            state,
        }
    }

    /// Samples of one never-restarted process: its `other` fds each round,
    /// and its transfer connections spread over the first `keys` of its
    /// pools (to and from e2 and e3).
    fn rounds(other: &[u64], pooled: &[u64], keys: usize) -> Vec<FdSample> {
        let names = [
            "transfer -> 10.1.0.3",
            "transfer <- 10.1.0.3",
            "transfer -> 10.1.0.4",
            "transfer <- 10.1.0.4",
        ];
        other
            .iter()
            .zip(pooled)
            .enumerate()
            .map(|(i, (&o, &p))| FdSample {
                at_s: 30.0 + 20.0 * i as f64,
                starts: 1,
                fds: o + p,
                pools: (0..keys)
                    .map(|k| {
                        (
                            names[k].to_string(),
                            p / keys as u64 + u64::from((k as u64) < p % keys as u64),
                        )
                    })
                    .filter(|(_, n)| *n > 0)
                    .collect(),
                dead: Vec::new(),
            })
            .collect()
    }

    #[test]
    fn the_late_plateau_of_a_filling_pool_passes() {
        // A measured run: e1 41 47 48 49 | 50 47 50 50, which a rule on the
        // total alone fails (end 50 > settled 49). The rise is its transfer
        // pool filling under load; the rest stays at 37-38.
        let total = [41, 47, 48, 49, 50, 47, 50, 50];
        let other = [37, 37, 38, 37, 38, 37, 38, 37];
        let pooled: Vec<u64> = total.iter().zip(other).map(|(t, o)| t - o).collect();
        let s = rounds(&other, &pooled, 4);
        assert_eq!(s.iter().map(|x| x.fds).collect::<Vec<_>>(), total);
        let v = judge(&s, &bounds());
        assert_eq!(v["grew"], false, "{v}");
        assert_eq!(v["judged"], true, "{v}");
        assert_eq!(v["other_settled_max"], 38, "{v}");
    }

    #[test]
    fn a_leak_of_one_fd_per_round_fails() {
        // +1 non-pooled fd every round (an fd of a file, a pipe, an etcd
        // connection never closed).
        let other: Vec<u64> = (0..8).map(|i| 37 + i).collect();
        let v = judge(&rounds(&other, &[4; 8], 4), &bounds());
        assert_eq!(v["grew"], true, "{v}");
        // +1 pooled connection every round: the pool ends over its bound.
        let pool: Vec<u64> = (0..8).map(|i| 1 + i).collect();
        let v = judge(&rounds(&[37; 8], &pool, 1), &bounds());
        assert_eq!(v["grew"], true, "{v}");
        assert_eq!(v["pools_over_bound"]["transfer -> 10.1.0.3"], 8, "{v}");
    }

    #[test]
    fn a_connection_to_a_dead_incarnation_fails_at_the_end() {
        let b = bounds();
        // e1 holds: a pooled connection to e2 (e2 holds the other end), one
        // to e3's old incarnation (CLOSE_WAIT, nobody holds the other end),
        // the server end of e2's pool, and the router's HTTP connection.
        let e1 = vec![
            conn(at(E1, 7000), at([0; 4], 0), "LISTEN"),
            conn(at(E1, 40001), at(E2, 7000), "ESTABLISHED"),
            conn(at(E1, 40002), at(E3, 7000), "CLOSE_WAIT"),
            conn(at(E1, 7000), at(E2, 41000), "ESTABLISHED"),
            conn(at(E1, 8000), at(E2, 42000), "ESTABLISHED"),
        ];
        let e2 = vec![
            conn(at(E2, 7000), at(E1, 40001), "ESTABLISHED"),
            conn(at(E2, 41000), at(E1, 7000), "ESTABLISHED"),
            conn(at(E2, 42000), at(E1, 8000), "ESTABLISHED"),
        ];
        let live = live(&[e1.clone(), e2]);
        let s = sample(100.0, 1, 40, &e1, &live, &b);
        assert_eq!(s.pools["transfer -> 10.1.0.3"], 1);
        assert_eq!(s.pools["transfer -> 10.1.0.4"], 1);
        assert_eq!(s.pools["transfer <- 10.1.0.3"], 1);
        assert_eq!(s.pools["http <- 10.1.0.3"], 1);
        assert_eq!(s.other(), 36);
        assert_eq!(s.dead, vec!["CLOSE_WAIT 10.1.0.2:40002 -> 10.1.0.4:7000"]);
        let mut series = rounds(&[36; 5], &[1; 5], 1);
        series.push(s);
        let v = judge(&series, &b);
        assert_eq!(v["grew"], true, "{v}");
        assert_eq!(v["pools_over_bound"], json!({}), "{v}");
    }

    #[test]
    fn only_the_last_incarnation_is_judged_and_a_young_one_only_at_the_end() {
        let mut s = rounds(&[40, 41, 42, 43, 44, 30, 50, 60], &[0; 8], 1);
        for x in &mut s[5..] {
            x.starts = 2;
        }
        // Three samples since the restart: too few to judge the other fds.
        let v = judge(&s, &bounds());
        assert_eq!(
            (v["judged"].clone(), v["grew"].clone()),
            (json!(false), json!(false))
        );
        // But a pool over its bound at the end counts at any age.
        s[7].pools.insert("http -> 10.1.0.3".into(), 9);
        assert_eq!(judge(&s, &bounds())["grew"], true);
        assert_eq!(judge(&[], &bounds())["judged"], false);
    }
}

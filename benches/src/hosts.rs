//! Benches across hosts (`--hosts`, `--link-gbit`): a test bed of network
//! namespaces ([`kvfabric_testbed`]) with one tokio runtime per host, and
//! the transfer metrics that say which transport carried how many bytes.
//!
//! An in-process node of host i is started, and its connector's tasks run,
//! on host i's runtime, whose threads all live inside host i's namespace:
//! every socket the node opens is on host i's link (shaped by tbf). Engines
//! compute on their own threads and never touch the network. Between two
//! hosts the shm handshake fails (abstract Unix sockets are per namespace)
//! and the transfer engine uses TCP, as between two machines.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{anyhow, Context};
use kvfabric_testbed::Testbed;
use serde_json::{json, Value};
use tokio::runtime::{Handle, Runtime};

/// Hosts of one bench run and a runtime inside each.
pub struct Hosts {
    runtimes: Vec<Runtime>,
    bed: Testbed,
}

impl Hosts {
    /// `count` hosts on one bridge, links shaped to `link_gbit`.
    pub fn up(count: usize, link_gbit: Option<f64>) -> anyhow::Result<Hosts> {
        let bed = Testbed::up(count, link_gbit).context("making the hosts (needs root)")?;
        let runtimes = bed
            .hosts()
            .iter()
            .map(|h| h.runtime(2))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Hosts { runtimes, bed })
    }

    /// [`Hosts::up`] for a bench's `--hosts N`: none when N is 0 (every
    /// process on this machine's own network).
    pub fn optional(count: usize, link_gbit: Option<f64>) -> anyhow::Result<Option<Hosts>> {
        match count {
            0 => Ok(None),
            n => Hosts::up(n, link_gbit).map(Some),
        }
    }

    /// How many hosts.
    pub fn len(&self) -> usize {
        self.runtimes.len()
    }

    /// Whether there are none (never, once up).
    pub fn is_empty(&self) -> bool {
        self.runtimes.is_empty()
    }

    /// Host `i`'s address.
    pub fn ip(&self, i: usize) -> IpAddr {
        IpAddr::V4(self.bed.host(i).ip())
    }

    /// The test bed (link faults, shaping).
    pub fn bed(&self) -> &Testbed {
        &self.bed
    }

    /// A handle of host `i`'s runtime.
    pub fn handle(&self, i: usize) -> Handle {
        self.runtimes[i].handle().clone()
    }

    /// Run `fut` on host `i` and wait for it.
    pub async fn run<T: Send + 'static>(
        &self,
        i: usize,
        fut: impl std::future::Future<Output = T> + Send + 'static,
    ) -> anyhow::Result<T> {
        self.runtimes[i]
            .spawn(fut)
            .await
            .map_err(|e| anyhow!("task on host {i}: {e}"))
    }

    /// Run blocking `f` on a thread of host `i` and wait for it.
    pub async fn blocking<T: Send + 'static>(
        &self,
        i: usize,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> anyhow::Result<T> {
        self.runtimes[i]
            .spawn_blocking(f)
            .await
            .map_err(|e| anyhow!("blocking task on host {i}: {e}"))
    }

    /// Stop the runtimes (callable from async code), then remove the hosts.
    pub fn shutdown(self) {
        let Hosts { runtimes, bed } = self;
        for rt in runtimes {
            rt.shutdown_background();
        }
        drop(bed);
    }
}

/// GET `path` from `addr` (blocking, Connection: close); the body.
pub fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .ok_or_else(|| anyhow!("no HTTP body from {addr}"))?;
    Ok(body)
}

/// Bytes per (transport, direction) in a node's /metrics text
/// (`kvfabric_transfer_bytes_total`).
pub fn transfer_bytes(metrics: &str) -> BTreeMap<(String, String), u64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("kvfabric_transfer_bytes_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let label = |k: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{k}=\"")))
                .map(|v| v.trim_end_matches('"').to_lowercase())
        };
        if let (Some(t), Some(d), Ok(v)) = (
            label("transport"),
            label("direction"),
            value.trim().parse::<f64>(),
        ) {
            *out.entry((t, d)).or_insert(0) += v as u64;
        }
    }
    out
}

/// What a report says about the transfers: bytes read per transport, and
/// the transports that carried any.
pub fn transfer_json(bytes: &BTreeMap<(String, String), u64>) -> Value {
    let read: BTreeMap<&str, u64> = bytes
        .iter()
        .filter(|((_, d), _)| d == "read")
        .map(|((t, _), v)| (t.as_str(), *v))
        .collect();
    let used: Vec<&str> = read
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(t, _)| *t)
        .collect();
    json!({ "transport": used.join("+"), "bytes_read": read })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_bytes_are_read_per_transport_and_direction() {
        let text = "# HELP x\n\
            kvfabric_transfer_bytes_total{transport=\"Tcp\",direction=\"Read\"} 1048576\n\
            kvfabric_transfer_bytes_total{transport=\"Shm\",direction=\"Read\"} 0\n\
            kvfabric_transfer_bytes_total{transport=\"Tcp\",direction=\"ServedRead\"} 7\n\
            kvfabric_transfer_ops_total{transport=\"Tcp\",direction=\"Read\"} 3\n";
        let b = transfer_bytes(text);
        assert_eq!(b[&("tcp".into(), "read".into())], 1_048_576);
        assert_eq!(b[&("tcp".into(), "servedread".into())], 7);
        assert_eq!(b.len(), 3);
        let j = transfer_json(&b);
        assert_eq!(j["transport"], "tcp");
        assert_eq!(j["bytes_read"]["shm"], 0);
    }
}

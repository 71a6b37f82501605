//! The test bed's network: one namespace per host, a bridge between them in
//! a namespace of its own, and tbf on the links.

use std::net::Ipv4Addr;
use std::process::Command;

use crate::ip::{delete_namespace, namespaces, remove_stale, run};
use crate::{Result, TestbedError};

/// Every test bed namespace is named `<NAME_PREFIX><pid>-<tag>-...`.
pub const NAME_PREFIX: &str = "kvftb-";
/// Host i is `ADDR_PREFIX.(i+2)`/24. The range exists only inside the test
/// bed's namespaces (each test bed has its own bridge, so test beds running
/// side by side never see each other's addresses).
pub const ADDR_PREFIX: [u8; 3] = [10, 203, 0];
/// Hosts one bridge takes (addresses .2 to .251).
const MAX_HOSTS: usize = 250;
/// A tbf queue holds at most this much delay before dropping.
const TBF_LATENCY: &str = "20ms";

/// One host of a test bed: a network namespace with one link to the bridge.
#[derive(Debug, Clone)]
pub struct Host {
    index: usize,
    ns: String,
    ip: Ipv4Addr,
    bridge_ns: String,
}

impl Host {
    /// The host's position in the test bed.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The network namespace's name (for `ip netns exec`).
    pub fn ns(&self) -> &str {
        &self.ns
    }

    /// The host's address on the bridge.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The bridge-side end of this host's link.
    fn bridge_port(&self) -> String {
        format!("h{}", self.index)
    }

    /// `program` to be run inside this host (`ip netns exec <ns> program`).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns]).arg(program);
        c
    }

    /// A tokio runtime whose every thread runs inside this host: what an
    /// in-process node or engine of this host is started and driven on.
    pub fn runtime(&self, workers: usize) -> Result<tokio::runtime::Runtime> {
        crate::enter::runtime_in(&self.ns, workers)
    }

    /// Run `f` on a new thread inside this host.
    pub fn spawn<T, F>(&self, f: F) -> std::thread::JoinHandle<Result<T>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let ns = self.ns.clone();
        std::thread::spawn(move || {
            crate::enter::enter_namespace(&ns)?;
            Ok(f())
        })
    }

    /// Limit the link to `gbit` Gbit/s each way (tbf on both of its ends);
    /// None removes the limit.
    pub fn shape(&self, gbit: Option<f64>) -> Result<()> {
        let ends = [
            (self.ns.clone(), "eth0".to_string()),
            (self.bridge_ns.clone(), self.bridge_port()),
        ];
        for (ns, dev) in &ends {
            match gbit {
                Some(g) => {
                    let (rate, burst) = tbf_params(g)?;
                    run(
                        "tc",
                        &[
                            "-n",
                            ns,
                            "qdisc",
                            "replace",
                            "dev",
                            dev,
                            "root",
                            "tbf",
                            "rate",
                            &rate,
                            "burst",
                            &burst,
                            "latency",
                            TBF_LATENCY,
                        ],
                    )?;
                }
                None => {
                    // No qdisc to delete is fine.
                    let _ = run("tc", &["-n", ns, "qdisc", "del", "dev", dev, "root"]);
                }
            }
        }
        Ok(())
    }

    /// Take the host's link down (a partition: nothing in or out).
    pub fn link_down(&self) -> Result<()> {
        run(
            "ip",
            &[
                "-n",
                &self.bridge_ns,
                "link",
                "set",
                &self.bridge_port(),
                "down",
            ],
        )
    }

    /// Bring the host's link back up.
    pub fn link_up(&self) -> Result<()> {
        run(
            "ip",
            &[
                "-n",
                &self.bridge_ns,
                "link",
                "set",
                &self.bridge_port(),
                "up",
            ],
        )
    }
}

/// tbf's `rate` and `burst` for `gbit`: 2 ms of the rate, at least 128 KiB
/// (one 64 KiB GSO packet must fit, or nothing passes).
fn tbf_params(gbit: f64) -> Result<(String, String)> {
    if !(gbit.is_finite() && gbit > 0.0 && gbit <= 400.0) {
        return Err(TestbedError::Invalid(format!(
            "link rate {gbit} Gbit/s (want 0 < rate <= 400)"
        )));
    }
    let bits = (gbit * 1e9).round() as u64;
    let burst = (bits / 8 / 500).max(128 * 1024);
    Ok((format!("{bits}bit"), burst.to_string()))
}

/// N hosts on one bridge; dropping it removes everything it made.
#[derive(Debug)]
pub struct Testbed {
    name: String,
    bridge_ns: String,
    hosts: Vec<Host>,
    /// Namespaces made so far (deleted on drop, in reverse).
    made: Vec<String>,
}

impl Testbed {
    /// Make `hosts` hosts, each link shaped to `link_gbit` (None: veth speed).
    /// Removes stale test beds first. [`TestbedError::Unavailable`] where
    /// namespaces cannot be made (not root, no iproute2).
    pub fn up(hosts: usize, link_gbit: Option<f64>) -> Result<Testbed> {
        if hosts == 0 || hosts > MAX_HOSTS {
            return Err(TestbedError::Invalid(format!(
                "{hosts} hosts (want 1..={MAX_HOSTS})"
            )));
        }
        available()?;
        remove_stale(NAME_PREFIX);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!("{NAME_PREFIX}{}-{:x}", std::process::id(), nanos);
        let bridge_ns = format!("{name}-br");
        let mut bed = Testbed {
            name,
            bridge_ns,
            hosts: Vec::new(),
            made: Vec::new(),
        };
        bed.add_namespace(bed.bridge_ns.clone())?;
        let br = bed.bridge_ns.clone();
        run("ip", &["-n", &br, "link", "add", "br0", "type", "bridge"])?;
        run("ip", &["-n", &br, "link", "set", "br0", "up"])?;
        for i in 0..hosts {
            let host = bed.add_host(i)?;
            host.shape(link_gbit)?;
            bed.hosts.push(host);
        }
        tracing::info!(name = %bed.name, hosts, ?link_gbit, "test bed up");
        Ok(bed)
    }

    /// [`Testbed::up`] for a test: None, with `SKIPPED: ...` on stderr,
    /// only where namespaces cannot be made (not root); any other failure
    /// panics. With `KVFABRIC_REQUIRE_TESTBED=1` (CI) unavailability panics
    /// too, so a runner that lost root cannot pass these tests by skipping.
    pub fn up_or_skip(hosts: usize, link_gbit: Option<f64>) -> Option<Testbed> {
        match Testbed::up(hosts, link_gbit) {
            Ok(bed) => Some(bed),
            Err(TestbedError::Unavailable { reason })
                if std::env::var("KVFABRIC_REQUIRE_TESTBED").as_deref() != Ok("1") =>
            {
                eprintln!("SKIPPED: this test needs network namespaces: {reason}");
                None
            }
            Err(e) => panic!("test bed of {hosts} hosts: {e}"),
        }
    }

    fn add_namespace(&mut self, ns: String) -> Result<()> {
        run("ip", &["netns", "add", &ns])?;
        self.made.push(ns.clone());
        run("ip", &["-n", &ns, "link", "set", "lo", "up"])
    }

    fn add_host(&mut self, i: usize) -> Result<Host> {
        let [a, b, c] = ADDR_PREFIX;
        let host = Host {
            index: i,
            ns: format!("{}-h{i}", self.name),
            ip: Ipv4Addr::new(a, b, c, (i + 2) as u8),
            bridge_ns: self.bridge_ns.clone(),
        };
        self.add_namespace(host.ns.clone())?;
        let (br, port) = (self.bridge_ns.as_str(), host.bridge_port());
        run(
            "ip",
            &[
                "-n", br, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &host.ns,
            ],
        )?;
        run(
            "ip",
            &["-n", br, "link", "set", &port, "master", "br0", "up"],
        )?;
        let addr = format!("{}/24", host.ip);
        run("ip", &["-n", &host.ns, "addr", "add", &addr, "dev", "eth0"])?;
        run("ip", &["-n", &host.ns, "link", "set", "eth0", "up"])?;
        Ok(host)
    }

    /// The test bed's name (every namespace of it starts with it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The hosts, in order.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Host `i`. Panics when out of range (a caller's bug).
    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        let live = namespaces();
        for ns in self.made.iter().rev() {
            if live.contains(ns) {
                delete_namespace(ns);
            }
        }
    }
}

/// Whether namespaces can be made here: root and iproute2.
fn available() -> Result<()> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(TestbedError::Unavailable {
            reason: "not root (network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN)".into(),
        });
    }
    run("ip", &["-V"]).map_err(|e| TestbedError::Unavailable {
        reason: format!("iproute2 missing: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tbf_burst_holds_a_gso_packet_and_two_ms_of_rate() {
        assert_eq!(
            tbf_params(10.0).expect("10G"),
            ("10000000000bit".into(), "2500000".into())
        );
        assert_eq!(tbf_params(0.1).expect("100M").1, (128 * 1024).to_string());
        assert!(tbf_params(0.0).is_err());
        assert!(tbf_params(f64::NAN).is_err());
    }
}

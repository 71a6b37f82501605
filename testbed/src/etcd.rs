//! A real etcd server on loopback (or on one address of a test bed host),
//! for the benches that run a cluster on etcd (`bench agentic --hosts`) and,
//! through `kvfabric-testkit`, for the tests. Debian's `etcd-server` package
//! provides the binary; the process is killed when the handle drops.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running etcd with its own data dir and ports.
pub struct EtcdProcess {
    child: Option<Child>,
    ip: IpAddr,
    data: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
}

impl EtcdProcess {
    /// Start etcd and wait (up to 10 s) until it accepts connections.
    pub fn start() -> std::io::Result<Self> {
        Self::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// Start etcd listening on `ip` (an address of the calling thread's
    /// network namespace, where etcd runs too: a test bed host).
    pub fn start_on(ip: IpAddr) -> std::io::Result<Self> {
        let mut e = EtcdProcess {
            child: None,
            ip,
            data: tempfile::tempdir()?,
            client_port: crate::ports::free_loopback_port()?,
            peer_port: crate::ports::free_loopback_port()?,
        };
        e.spawn()?;
        Ok(e)
    }

    /// The client endpoint, `http://IP:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}:{}", self.ip, self.client_port)
    }

    /// Kill etcd (SIGKILL), keeping its data for [`EtcdProcess::restart`].
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start etcd again on the same ports and data.
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.stop();
        self.spawn()
    }

    fn spawn(&mut self) -> std::io::Result<()> {
        let bin = ["/usr/bin/etcd", "etcd"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.is_absolute() && p.exists())
            .unwrap_or_else(|| PathBuf::from("etcd"));
        let client = self.endpoint();
        let peer = format!("http://{}:{}", self.ip, self.peer_port);
        let child = Command::new(bin)
            .args(["--name", "kvfabric-test", "--data-dir"])
            .arg(self.data.path())
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .arg("--initial-cluster")
            .arg(format!("kvfabric-test={peer}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("cannot start etcd (install etcd-server): {e}"),
                )
            })?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect((self.ip, self.client_port)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(std::io::Error::other("etcd did not start within 10 s"))
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

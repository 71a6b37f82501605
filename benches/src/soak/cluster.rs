//! The soak's cluster: real processes on hosts of a test bed. Host 0 holds
//! etcd, the router and the reference engine (no fabric, no prefix cache:
//! the no-cache answers); hosts 1..=3 each run one `kvfabric engine` with
//! its embedded node, a disk tier on a small tmpfs of its own. Every port is
//! fixed per host (each host has its own network), so a restarted process
//! comes back where the router and its peers expect it.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kvfabric_testbed::{Host, HostProc, Testbed};

use super::client::http;
use super::growth::Bounds;

const ENGINE_PORT: u16 = 8000;
const ROUTER_PORT: u16 = 9000;
const ETCD_PORT: u16 = 2379;
const TRANSFER_PORT: u16 = 7000;

/// A tmpfs mounted for one engine's disk tier; unmounted on drop.
pub struct Tmpfs {
    pub dir: PathBuf,
}

impl Tmpfs {
    fn mount(dir: PathBuf, mib: u64) -> anyhow::Result<Tmpfs> {
        std::fs::create_dir_all(&dir)?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(&dir)
            .status()?
            .success();
        anyhow::ensure!(ok, "mounting a {mib} MiB tmpfs at {}", dir.display());
        Ok(Tmpfs { dir })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .status();
    }
}

/// Every process of the soak (dropped: all killed, tmpfs unmounted, hosts removed).
pub struct SoakCluster {
    pub etcd: HostProc,
    pub reference: HostProc,
    pub router: HostProc,
    pub engines: Vec<HostProc>,
    pub disks: Vec<Tmpfs>,
    pub bed: Testbed,
    pub dir: tempfile::TempDir,
    transfer_per_peer: u64,
}

/// How the engines are sized.
pub struct Sizes {
    pub disk_mib: u64,
    /// `transfer_idle_connections_per_peer` given to every engine (the fd
    /// rule's bound on each transfer pool once the load stopped).
    pub transfer_per_peer: usize,
}

impl SoakCluster {
    /// Start everything and wait until each engine and the router answer.
    /// `bed` has 4 hosts; call from a thread inside host 0.
    pub fn start(bed: Testbed, model: &Path, sizes: &Sizes) -> anyhow::Result<SoakCluster> {
        let dir = tempfile::tempdir()?;
        let exe = std::env::current_exe()?;
        let h0 = bed.host(0).clone();
        let etcd_url = format!("http://{}:{ETCD_PORT}", h0.ip());
        let etcd = HostProc::start(
            &h0,
            "etcd",
            "etcd",
            etcd_args(&h0, dir.path()),
            vec![],
            dir.path(),
        )?;
        wait_port(
            SocketAddr::from((h0.ip(), ETCD_PORT)),
            Duration::from_secs(15),
        )?;
        let reference = engine(
            &exe,
            model,
            (&h0, "reference"),
            &reference_flags(),
            vec![],
            dir.path(),
        )?;
        let mut engines = Vec::new();
        let mut disks = Vec::new();
        for i in 1..=3 {
            let host = bed.host(i).clone();
            let disk = Tmpfs::mount(dir.path().join(format!("disk{i}")), sizes.disk_mib)?;
            let flags = fabric_flags(&host, &etcd_url, &disk.dir, sizes.disk_mib);
            let envs = vec![(
                "KVFABRIC_TRANSFER_IDLE_CONNECTIONS_PER_PEER".to_string(),
                sizes.transfer_per_peer.to_string(),
            )];
            engines.push(engine(
                &exe,
                model,
                (&host, &format!("e{i}")),
                &flags,
                envs,
                dir.path(),
            )?);
            disks.push(disk);
        }
        let urls: Vec<String> = (1..=3)
            .map(|i| format!("http://{}:{ENGINE_PORT}", bed.host(i).ip()))
            .collect();
        let router_args: Vec<OsString> = [
            "router".to_string(),
            "--listen".into(),
            format!("{}:{ROUTER_PORT}", h0.ip()),
            "--engines".into(),
            urls.join(","),
            "--policy".into(),
            "random".into(),
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        let router = HostProc::start(&h0, "router", &exe, router_args, vec![], dir.path())?;
        let mut c = SoakCluster {
            etcd,
            reference,
            router,
            engines,
            disks,
            bed,
            dir,
            transfer_per_peer: sizes.transfer_per_peer as u64,
        };
        for p in c.engines.iter_mut() {
            wait_healthy(p, Duration::from_secs(90))?;
        }
        wait_healthy(&mut c.reference, Duration::from_secs(90))?;
        wait_healthy(&mut c.router, Duration::from_secs(90))?;
        Ok(c)
    }

    /// The router's address (reachable from host 0).
    pub fn router_addr(&self) -> SocketAddr {
        SocketAddr::from((self.bed.host(0).ip(), ROUTER_PORT))
    }

    /// The reference engine's address.
    pub fn reference_addr(&self) -> SocketAddr {
        SocketAddr::from((self.bed.host(0).ip(), ENGINE_PORT))
    }

    /// What the fd rule allows each connection pool to keep idle, from the
    /// config given to the processes: `transfer_idle_connections_per_peer`
    /// per transfer pool; per HTTP pool, one connection per driver session
    /// (each has one request in flight) and the bench's health probe.
    pub fn fd_bounds(&self, sessions: usize) -> Bounds {
        Bounds {
            transfer_port: TRANSFER_PORT,
            transfer_per_peer: self.transfer_per_peer,
            http_ports: vec![ENGINE_PORT, ROUTER_PORT],
            http_per_peer: sessions as u64 + 1,
            hosts: self.bed.hosts().iter().map(Host::ip).collect(),
        }
    }

    /// Every process, for RSS / fd reports.
    pub fn procs(&self) -> impl Iterator<Item = &HostProc> {
        [&self.etcd, &self.reference, &self.router]
            .into_iter()
            .chain(self.engines.iter())
    }
}

/// The address a process of the soak serves HTTP on (`/health`).
pub fn health_addr(p: &HostProc) -> SocketAddr {
    let port = if p.name() == "router" {
        ROUTER_PORT
    } else {
        ENGINE_PORT
    };
    SocketAddr::from((p.host().ip(), port))
}

/// Wait until `p` answers GET /health with 200 (from a thread of host 0).
pub fn wait_healthy(p: &mut HostProc, limit: Duration) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let addr = health_addr(p);
    while started.elapsed() < limit {
        anyhow::ensure!(p.running(), "{} exited:\n{}", p.name(), p.log_tail(30));
        if let Ok((200, _)) = http(addr, "GET", "/health", None, Duration::from_secs(2)) {
            return Ok(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    anyhow::bail!(
        "{} not healthy within {limit:?}:\n{}",
        p.name(),
        p.log_tail(30)
    )
}

/// Wait until something listens on `addr`.
pub fn wait_port(addr: SocketAddr, limit: Duration) -> anyhow::Result<Duration> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok() {
            return Ok(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    anyhow::bail!("nothing listens on {addr} after {limit:?}")
}

fn etcd_args(h: &Host, dir: &Path) -> Vec<OsString> {
    let client = format!("http://{}:{ETCD_PORT}", h.ip());
    let peer = format!("http://{}:2380", h.ip());
    [
        "--name".to_string(),
        "soak".into(),
        "--data-dir".into(),
        dir.join("etcd").display().to_string(),
        "--listen-client-urls".into(),
        client.clone(),
        "--advertise-client-urls".into(),
        client,
        "--listen-peer-urls".into(),
        peer.clone(),
        "--initial-advertise-peer-urls".into(),
        peer.clone(),
        "--initial-cluster".into(),
        format!("soak={peer}"),
    ]
    .into_iter()
    .map(OsString::from)
    .collect()
}

fn reference_flags() -> Vec<String> {
    ["--fabric", "off", "--prefix-cache", "false"]
        .map(String::from)
        .to_vec()
}

fn fabric_flags(h: &Host, etcd: &str, disk: &Path, disk_mib: u64) -> Vec<String> {
    let ip = h.ip();
    vec![
        "--etcd".into(),
        etcd.into(),
        "--etcd-prefix".into(),
        "/soak".into(),
        "--lease-ttl-ms".into(),
        "2000".into(),
        "--transfer-listen".into(),
        format!("{ip}:{TRANSFER_PORT}"),
        "--disk-path".into(),
        disk.join("tier.data").display().to_string(),
        "--disk-capacity".into(),
        // The data file takes half the tmpfs (at least one 64 MiB block);
        // the index and a filler the rest.
        format!("{}MiB", (disk_mib / 2).max(64)),
    ]
}

fn engine(
    exe: &Path,
    model: &Path,
    (host, name): (&Host, &str),
    extra: &[String],
    mut envs: Vec<(String, String)>,
    dir: &Path,
) -> anyhow::Result<HostProc> {
    let ip = host.ip();
    let mut args: Vec<String> = vec![
        "engine".into(),
        "--model".into(),
        model.display().to_string(),
        "--listen".into(),
        format!("{ip}:{ENGINE_PORT}"),
        "--node-id".into(),
        name.into(),
        "--threads".into(),
        "1".into(),
        "--kv-pool".into(),
        "128MiB".into(),
        "--ram-capacity".into(),
        "64MiB".into(),
        "--grpc-listen".into(),
        format!("{ip}:50051"),
        "--http-listen".into(),
        format!("{ip}:9464"),
    ];
    args.extend(extra.iter().cloned());
    envs.push(("KVFABRIC_LOG".to_string(), "info".to_string()));
    Ok(HostProc::start(
        host,
        name,
        exe,
        args.into_iter().map(OsString::from).collect(),
        envs,
        dir,
    )?)
}

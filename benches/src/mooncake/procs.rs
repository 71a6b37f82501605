//! The processes of the Mooncake peer (etcd, `transfer_engine_bench`,
//! `mooncake_master`, the store driver): each bounded twice, by coreutils
//! `timeout` around it (which outlives a killed bench) and by [`Peer`]'s drop
//! (SIGKILL to its process group), and each checked to be on loopback only:
//! every address it is given ([`check_loopback_args`]) and every TCP
//! connection it holds while it runs ([`connections`]).

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

/// A started peer process: killed with its process group when dropped.
pub(crate) struct Peer {
    pub(crate) name: String,
    child: Child,
    /// Its stdin, while open (the store holder serves until it closes).
    pub(crate) stdin: Option<ChildStdin>,
    log: std::path::PathBuf,
}

/// Refuse any IPv4 address but 127.x.x.x among `args` (flags, env values).
pub(crate) fn check_loopback_args<I, S>(what: &str, args: I) -> anyhow::Result<()>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    for arg in args {
        let arg = arg.as_ref().to_string_lossy();
        for token in arg.split(|c: char| !(c.is_ascii_digit() || c == '.')) {
            let parts: Vec<&str> = token.split('.').collect();
            let dotted = parts.len() == 4 && parts.iter().all(|p| p.parse::<u8>().is_ok());
            if dotted && parts[0] != "127" {
                bail!("{what} would be given {token} ({arg}): the Mooncake peer runs on loopback only");
            }
        }
        if arg.contains("localhost") || arg.contains("0.0.0.0") {
            bail!("{what} would be given {arg}: pass 127.0.0.1 explicitly");
        }
    }
    Ok(())
}

impl Peer {
    /// Start `program args` under `timeout limit`, in a process group of its
    /// own, stdout and stderr to `log`; env pairs are checked like the args.
    pub(crate) fn start(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
        limit: Duration,
        log: &Path,
    ) -> anyhow::Result<Peer> {
        check_loopback_args(name, args)?;
        check_loopback_args(name, env.iter().map(|(_, v)| *v))?;
        let out = std::fs::File::create(log)?;
        let mut cmd = Command::new("timeout");
        cmd.arg("--kill-after=5")
            .arg(format!("{}", limit.as_secs().max(1)))
            .arg(program)
            .args(args)
            .envs(env.iter().copied())
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(out.try_clone()?)
            .stderr(out);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {name} ({})", program.display()))?;
        let stdin = child.stdin.take();
        Ok(Peer {
            name: name.into(),
            child,
            stdin,
            log: log.to_path_buf(),
        })
    }

    pub(crate) fn pgid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Send one line to its stdin.
    pub(crate) fn send_line(&mut self, line: &str) -> anyhow::Result<()> {
        let pipe = self
            .stdin
            .as_mut()
            .ok_or_else(|| anyhow!("{}: stdin closed", self.name))?;
        writeln!(pipe, "{line}")?;
        pipe.flush()?;
        Ok(())
    }

    /// Wait for it to exit within `limit`: its log. An exit with an error, or
    /// none in time (then it is killed), is an error quoting the log's tail.
    pub(crate) fn wait(mut self, limit: Duration) -> anyhow::Result<String> {
        self.stdin = None;
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                if !status.success() {
                    bail!("{} failed ({status}): {}", self.name, tail(&log, 6));
                }
                return Ok(log);
            }
            if Instant::now() > deadline {
                bail!("{} did not finish within {limit:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The log so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether it still runs.
    pub(crate) fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.stdin = None;
        // SAFETY: plain syscall; the group is this peer's own (process_group(0)).
        unsafe {
            libc::kill(-self.pgid(), libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// The last `n` lines of `text`, on one line.
pub(crate) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// Wait until something accepts on 127.0.0.1:`port` (or `peer` exits).
pub(crate) fn wait_port(peer: &mut Peer, port: u16, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if !peer.running() {
            bail!("{} exited: {}", peer.name, tail(&peer.log(), 6));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!(
        "{} did not listen on 127.0.0.1:{port} within {limit:?}",
        peer.name
    )
}

/// Wait until `peer`'s log has a line containing `needle`: that line.
pub(crate) fn wait_log(peer: &mut Peer, needle: &str, limit: Duration) -> anyhow::Result<String> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let log = peer.log();
        if let Some(line) = log.lines().find(|l| l.contains(needle)) {
            return Ok(line.to_string());
        }
        if !peer.running() {
            bail!("{} exited: {}", peer.name, tail(&log, 6));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{} did not log {needle:?} within {limit:?}", peer.name)
}

/// The pids of the process groups `pgids`.
fn group_pids(pgids: &[i32]) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            // SAFETY: plain syscall.
            let pgid = unsafe { libc::getpgid(*pid) };
            pgids.contains(&pgid)
        })
        .collect()
}

/// The established TCP (IPv4 and IPv6) connections of every process in the
/// groups `pgids`, as (local, remote) address strings.
pub(crate) fn connections(pgids: &[i32]) -> Vec<(String, String)> {
    let mut inodes = std::collections::HashSet::new();
    for pid in group_pids(pgids) {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                let t = target.to_string_lossy();
                if let Some(n) = t.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
                    inodes.insert(n.to_string());
                }
            }
        }
    }
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(f) = std::fs::File::open(table) else {
            continue;
        };
        for line in BufReader::new(f).lines().map_while(Result::ok).skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if cols.len() > 9 && cols[3] == "01" && inodes.contains(cols[9]) {
                out.push((decode_addr(cols[1]), decode_addr(cols[2])));
            }
        }
    }
    out
}

/// `0100007F:1F90` (or the IPv6 form) as `127.0.0.1:8080`.
fn decode_addr(hex: &str) -> String {
    let Some((ip, port)) = hex.split_once(':') else {
        return hex.into();
    };
    let port = u16::from_str_radix(port, 16).unwrap_or(0);
    let bytes: Vec<u8> = (0..ip.len() / 2)
        .filter_map(|i| u8::from_str_radix(&ip[2 * i..2 * i + 2], 16).ok())
        .collect();
    let v4 = |b: &[u8]| format!("{}.{}.{}.{}", b[3], b[2], b[1], b[0]);
    match bytes.len() {
        4 => format!("{}:{port}", v4(&bytes)),
        // Four host-order words: an IPv4-mapped address is 0, 0, ffff, the IPv4 word.
        16 if bytes[..8].iter().all(|b| *b == 0) && bytes[8..12] == [0xff, 0xff, 0, 0] => {
            format!("{}:{port}", v4(&bytes[12..]))
        }
        16 if bytes[..12].iter().all(|b| *b == 0) && bytes[12..] == [1, 0, 0, 0] => {
            format!("::1:{port}")
        }
        _ => format!("[{ip}]:{port}"),
    }
}

/// A Mooncake TE logs the address its RPC listens on (once per try): each
/// must be loopback.
pub(crate) fn check_rpc_line(log: &str) -> anyhow::Result<()> {
    for line in log
        .lines()
        .filter(|l| l.contains("RPC") && l.contains("listening on"))
    {
        let addr = line.rsplit("listening on").next().unwrap_or("").trim();
        anyhow::ensure!(
            addr.starts_with("127."),
            "a Mooncake TE listened off loopback: {line}"
        );
    }
    Ok(())
}

/// Whether an address string from [`connections`] is on loopback.
pub(crate) fn is_loopback(addr: &str) -> bool {
    addr.starts_with("127.") || addr.starts_with("::1:")
}

/// Fail when any connection of `conns` leaves loopback; else their count.
pub(crate) fn check_connections(what: &str, conns: &[(String, String)]) -> anyhow::Result<usize> {
    if let Some((l, r)) = conns
        .iter()
        .find(|(l, r)| !is_loopback(l) || !is_loopback(r))
    {
        bail!("{what}: a Mooncake process held a connection off loopback ({l} -> {r})");
    }
    Ok(conns.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpc_lines_off_loopback_are_refused() {
        check_rpc_line("I] Transfer Engine RPC using legacy/P2P, listening on 127.0.0.1:17011")
            .unwrap();
        assert!(check_rpc_line(
            "I] Transfer Engine RPC using new RPC mapping, listening on 192.0.2.2:1"
        )
        .is_err());
        check_rpc_line("no such line").unwrap();
    }

    #[test]
    fn only_loopback_addresses_pass() {
        check_loopback_args("t", ["--metadata_server=127.0.0.1:2379", "--threads=8"]).unwrap();
        check_loopback_args("t", ["http://127.0.0.1:80/metadata", "1.5"]).unwrap();
        assert!(check_loopback_args("t", ["--segment_id=192.168.3.76"]).is_err());
        assert!(check_loopback_args("t", ["10.0.0.1:2379"]).is_err());
        assert!(check_loopback_args("t", ["localhost:2379"]).is_err());
    }

    #[test]
    fn proc_addresses_decode() {
        assert_eq!(decode_addr("0100007F:1F90"), "127.0.0.1:8080");
        assert_eq!(
            decode_addr("0000000000000000FFFF00000100007F:0050"),
            "127.0.0.1:80"
        );
        assert!(is_loopback(&decode_addr("0100007F:0001")));
        assert!(!is_loopback(&decode_addr("020000C0:0001")));
    }

    #[test]
    fn a_peer_is_killed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Peer::start(
            "sleep",
            Path::new("sleep"),
            &["30".into()],
            &[],
            Duration::from_secs(60),
            &dir.path().join("log"),
        )
        .unwrap();
        assert!(p.running());
        let pgid = p.pgid();
        drop(p);
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            group_pids(&[pgid]).is_empty(),
            "the sleep outlived its Peer"
        );
    }
}

//! Processes inside a host: started with `ip netns exec`, killed with
//! SIGKILL (a crash, and what drop does), restarted with the same command,
//! and measured (RSS, open fds) from /proc.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use crate::net::Host;
use crate::{Result, TestbedError};

/// Resident memory and open file descriptors of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStats {
    pub rss_bytes: u64,
    pub fds: u64,
}

impl ProcStats {
    /// Read /proc/<pid>; None when the process is gone.
    pub fn of(pid: u32) -> Option<ProcStats> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let rss_kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
        Some(ProcStats {
            rss_bytes: rss_kib * 1024,
            fds,
        })
    }
}

/// Open fds of `pid` by kind (`socket`, `pipe`, `anon_inode:[eventfd]`,
/// `file`, ...): what grew when the count grows.
pub fn fd_kinds(pid: u32) -> std::collections::BTreeMap<String, u64> {
    let mut kinds = std::collections::BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return kinds;
    };
    for e in dir.flatten() {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        let t = target.to_string_lossy();
        let kind = match t.split_once(':') {
            Some((k, rest)) if !t.starts_with('/') => {
                if k == "anon_inode" {
                    format!("anon_inode:{rest}")
                } else {
                    k.to_string()
                }
            }
            _ => "file".to_string(),
        };
        *kinds.entry(kind).or_insert(0) += 1;
    }
    kinds
}

/// One process inside a host, its stderr kept in a log file.
#[derive(Debug)]
pub struct HostProc {
    name: String,
    host: Host,
    program: OsString,
    args: Vec<OsString>,
    envs: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
    starts: u32,
}

impl HostProc {
    /// Start `program args` inside `host` with `envs` added (every other
    /// `KVFABRIC_*` variable removed); stderr goes to `<log_dir>/<name>.log`.
    pub fn start(
        host: &Host,
        name: &str,
        program: impl Into<OsString>,
        args: Vec<OsString>,
        envs: Vec<(String, String)>,
        log_dir: &Path,
    ) -> Result<HostProc> {
        let mut p = HostProc {
            name: name.to_string(),
            host: host.clone(),
            program: program.into(),
            args,
            envs,
            log: log_dir.join(format!("{name}.log")),
            child: None,
            starts: 0,
        };
        p.spawn()?;
        Ok(p)
    }

    fn spawn(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| TestbedError::io(format!("log of {}", self.name), e))?;
        let mut cmd = self.host.command(&self.program);
        for (k, _) in std::env::vars() {
            if k.starts_with("KVFABRIC_") {
                cmd.env_remove(k);
            }
        }
        cmd.args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        let child = cmd
            .spawn()
            .map_err(|e| TestbedError::io(format!("starting {}", self.name), e))?;
        self.child = Some(child);
        self.starts += 1;
        Ok(())
    }

    /// The name given at start.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host it runs in.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The pid while it runs (`ip netns exec` execs the program: same pid).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Times started (1 + restarts).
    pub fn starts(&self) -> u32 {
        self.starts
    }

    /// Whether it still runs (false once it exited or was killed).
    pub fn running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(_) => false,
            None => false,
        }
    }

    /// SIGKILL and reap: a crash.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Send `signal` (SIGSTOP, SIGCONT, SIGTERM...) while it runs.
    pub fn signal(&self, signal: i32) {
        if let Some(pid) = self.pid() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(pid as i32, signal) };
        }
    }

    /// Kill it if it runs, then start the same command again.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()
    }

    /// RSS and fds now; None when not running.
    pub fn stats(&self) -> Option<ProcStats> {
        ProcStats::of(self.pid()?)
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = s.lines().rev().take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for HostProc {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_of_this_process_and_of_none() {
        let me = ProcStats::of(std::process::id()).expect("self");
        assert!(me.rss_bytes > 0 && me.fds > 0);
        assert_eq!(ProcStats::of(u32::MAX), None);
        // Other tests in this binary open and close sockets on their own
        // threads, so this process's fds never hold still: count the kinds
        // of a quiet child instead (a `sleep` with stdin, stdout and stderr
        // on /dev/null and nothing else open).
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        // Once `sleep` runs, its fd table never changes: wait for exec
        // (two equal reads 20 ms apart), then count the kinds.
        let total = (0..200)
            .find_map(|_| {
                let before = ProcStats::of(pid)?.fds;
                std::thread::sleep(std::time::Duration::from_millis(20));
                let after = ProcStats::of(pid)?.fds;
                (before == after).then_some(after)
            })
            .expect("the child's fd count settled");
        let by_kind = fd_kinds(pid);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(by_kind.values().sum::<u64>(), total, "{by_kind:?}");
    }
}

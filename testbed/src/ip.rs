//! Running `ip` and `tc`, and removing what earlier test beds left behind.

use std::process::Command;

use crate::{Result, TestbedError};

/// Run `program args...`; an error carries its stderr.
pub(crate) fn run(program: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| TestbedError::io(format!("running {program}"), e))?;
    if out.status.success() {
        return Ok(());
    }
    Err(TestbedError::Command {
        command: format!("{program} {}", args.join(" ")),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}

/// Pids of the processes inside namespace `ns` (`ip netns pids`).
pub(crate) fn pids_in(ns: &str) -> Vec<i32> {
    Command::new("ip")
        .args(["netns", "pids", ns])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Kill (SIGKILL) every process inside `ns` but this one, then delete it.
/// Everything inside was started by the test bed that made `ns`.
pub(crate) fn delete_namespace(ns: &str) {
    let me = std::process::id() as i32;
    for pid in pids_in(ns).into_iter().filter(|&p| p != me) {
        // SAFETY: kill(2) with a pid read from the kernel; no memory involved.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    if let Err(e) = run("ip", &["netns", "del", ns]) {
        tracing::warn!(%ns, error = %e, "deleting a test bed namespace");
    }
}

/// The namespaces `ip netns` knows.
pub(crate) fn namespaces() -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The pid a test bed namespace name carries (`<prefix><pid>-...`).
pub(crate) fn owner_pid(name: &str, prefix: &str) -> Option<i32> {
    name.strip_prefix(prefix)?.split('-').next()?.parse().ok()
}

/// Delete the namespaces named `<prefix><pid>-...` whose process is gone.
pub(crate) fn remove_stale(prefix: &str) {
    for ns in namespaces() {
        let Some(pid) = owner_pid(&ns, prefix) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            tracing::info!(%ns, "removing a stale test bed namespace");
            delete_namespace(&ns);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_is_read_from_the_name() {
        assert_eq!(owner_pid("kvftb-123-9f-h0", "kvftb-"), Some(123));
        assert_eq!(owner_pid("kvftb-123-9f-br", "kvftb-"), Some(123));
        assert_eq!(owner_pid("other-123-h0", "kvftb-"), None);
        assert_eq!(owner_pid("kvftb-x-h0", "kvftb-"), None);
    }

    #[test]
    fn a_failing_command_reports_its_stderr() {
        let err = run("ip", &["link", "show", "no-such-link-kvftb"]).expect_err("no link");
        assert!(err.to_string().contains("no-such-link-kvftb"), "{err}");
    }
}

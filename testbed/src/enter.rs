//! Entering a network namespace from a thread.
//!
//! `setns(2)` moves only the calling thread; threads and processes it
//! starts afterwards inherit the namespace. So a tokio runtime whose
//! threads each enter the namespace when they start runs every socket it
//! opens inside that host, and a thread that entered it can start child
//! processes there without `ip netns exec`.

use std::os::fd::AsRawFd;

use crate::{Result, TestbedError};

/// Move the calling thread into the network namespace `ns` (a name under
/// /run/netns, as `ip netns add` makes them).
pub fn enter_namespace(ns: &str) -> Result<()> {
    let enter_err = |source| TestbedError::Enter {
        ns: ns.to_string(),
        source,
    };
    let f = std::fs::File::open(format!("/run/netns/{ns}")).map_err(enter_err)?;
    // SAFETY: setns(2) on a file descriptor we own, naming a network namespace.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(enter_err(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// A multi-thread tokio runtime whose threads (workers and blocking pool)
/// all run inside `ns`.
pub(crate) fn runtime_in(ns: &str, workers: usize) -> Result<tokio::runtime::Runtime> {
    // Fail here, not in a worker thread, when the namespace is gone.
    std::fs::metadata(format!("/run/netns/{ns}")).map_err(|source| TestbedError::Enter {
        ns: ns.to_string(),
        source,
    })?;
    let name = ns.to_string();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers.max(1))
        .thread_name(format!("{ns}-rt"))
        .on_thread_start(move || {
            if let Err(e) = enter_namespace(&name) {
                // A thread outside its host would quietly talk through the
                // wrong network: better no thread at all.
                panic!("{e}");
            }
        })
        .enable_all()
        .build()
        .map_err(|e| TestbedError::io(format!("runtime in {ns}"), e))
}

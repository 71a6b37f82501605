//! Small async I/O helpers shared by the transports: deadline-bounded reads
//! and writes, a vectored write-all (header, payload and tag in one
//! syscall), and CPU-heavy steps run without stalling the runtime.

use std::future::Future;
use std::io::IoSlice;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::TransferError;

/// Run `fut` (an I/O step with the peer) with a deadline; a timeout or an I/O
/// error becomes the connection-level error for `peer`.
pub async fn bounded<T>(
    peer: &str,
    timeout: Duration,
    fut: impl Future<Output = std::io::Result<T>>,
) -> Result<T, TransferError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(TransferError::connection(peer, e.into())),
        Err(_) => Err(TransferError::Timeout {
            peer: peer.to_string(),
            timeout_ms: timeout.as_millis() as u64,
        }),
    }
}

/// Run `f`, a CPU-heavy step of a connection's task (the block codec over a
/// slice: ~1.5 ms per MiB to encode, ~0.5 ms to decode), without stalling
/// the other tasks of its runtime worker: on a multi-thread runtime the
/// worker first hands its queue to another thread (`block_in_place`), so
/// other connections' I/O goes on meanwhile; elsewhere (a current-thread
/// runtime, no runtime) `f` runs inline.
pub fn cpu_bound<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Write every byte of `parts` in order, vectored (one syscall when the
/// socket takes them all: a header and its payload, a payload and its tag).
pub async fn write_all_v<W: AsyncWrite + Unpin, const N: usize>(
    w: &mut W,
    mut parts: [&[u8]; N],
) -> std::io::Result<()> {
    while parts.iter().any(|p| !p.is_empty()) {
        let bufs = parts.map(IoSlice::new);
        let mut n = w.write_vectored(&bufs).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        for p in parts.iter_mut() {
            let k = n.min(p.len());
            *p = &p[k..];
            n -= k;
        }
    }
    Ok(())
}

/// Read and throw away exactly `len` bytes (keeps a stream in sync after a
/// refused WRITE, without letting the bytes near any segment).
pub async fn discard<R: AsyncRead + Unpin>(r: &mut R, mut len: u64) -> std::io::Result<()> {
    let mut scratch = vec![0u8; 64 * 1024];
    while len > 0 {
        let n = (len as usize).min(scratch.len());
        r.read_exact(&mut scratch[..n]).await?;
        len -= n as u64;
    }
    Ok(())
}

/// Read `len` (bounded) bytes of an error message.
pub async fn read_message<R: AsyncRead + Unpin>(r: &mut R, len: u32) -> std::io::Result<String> {
    let len = len.min(64 * 1024) as usize;
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).await?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::cpu_bound;

    /// On a runtime with one worker, a task ticks while another task's
    /// `cpu_bound` step runs: the step waits (up to 10 s) for three ticks,
    /// which an inline step on the only worker would never see.
    #[test]
    fn a_cpu_bound_step_leaves_the_worker_to_other_tasks() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .expect("runtime");
        let ticks = Arc::new(AtomicU32::new(0));
        let seen = rt.block_on(async {
            let t = ticks.clone();
            let ticker = tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    t.fetch_add(1, Ordering::Relaxed);
                }
            });
            let t = ticks.clone();
            let step = tokio::spawn(async move {
                let start = t.load(Ordering::Relaxed);
                cpu_bound(|| {
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while t.load(Ordering::Relaxed) < start + 3 && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    t.load(Ordering::Relaxed) - start
                })
            });
            let seen = step.await.expect("step");
            ticker.abort();
            seen
        });
        assert!(seen >= 3, "the ticker ran {seen} times during the step");
    }

    #[test]
    fn a_cpu_bound_step_runs_inline_without_a_multi_thread_runtime() {
        assert_eq!(cpu_bound(|| 7), 7);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        assert_eq!(rt.block_on(async { cpu_bound(|| 8) }), 8);
    }
}

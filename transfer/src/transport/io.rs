//! Small async I/O helpers shared by the transports: deadline-bounded reads
//! and writes, and a vectored write-all (header, payload and tag in one syscall).

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
        Ok(Err(e)) => Err(TransferError::Connection {
            peer: peer.to_string(),
            reason: e.to_string(),
        }),
        Err(_) => Err(TransferError::Timeout {
            peer: peer.to_string(),
            timeout_ms: timeout.as_millis() as u64,
        }),
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

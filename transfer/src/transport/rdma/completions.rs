//! Waiting for a queue pair's completions without spinning: poll its
//! completion queue, and when it is empty arm it and await the completion
//! channel's fd (tokio `AsyncFd`), then read and acknowledge the events.

use std::time::Duration;

use ibverbs_sys as ffi;

use super::verbs::{errno_err, Completion, RcQueuePair};
use crate::error::Missing;
use crate::TransferError;

impl RcQueuePair {
    /// Reap up to `max` completions without waiting (possibly none).
    fn poll_once(&mut self, max: usize) -> Result<Vec<Completion>, TransferError> {
        // SAFETY: ibv_wc is plain data; zero is a valid bit pattern.
        let mut wcs: Vec<ffi::ibv_wc> = (0..max.max(1))
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        // SAFETY: poll_cq is the provider's entry point for this CQ.
        let n = unsafe {
            let ops = &mut (*self.device.ctx).ops;
            match ops.poll_cq.as_mut() {
                Some(poll) => poll(self.cq, wcs.len() as i32, wcs.as_mut_ptr()),
                None => {
                    return Err(TransferError::Unsupported(Missing::ProviderOp {
                        op: "poll_cq",
                    }))
                }
            }
        };
        if n < 0 {
            return Err(TransferError::io_other("ibv_poll_cq", "failed"));
        }
        Ok(wcs[..n as usize]
            .iter()
            .map(|wc| {
                let r = match wc.error() {
                    None => Ok(()),
                    Some((status, vendor)) => Err(TransferError::io_other(
                        "work completion",
                        format!("status {status} (vendor {vendor})"),
                    )),
                };
                (wc.wr_id(), r)
            })
            .collect())
    }

    /// Ask for an event on the channel at the next completion.
    fn arm(&mut self) -> Result<(), TransferError> {
        // SAFETY: req_notify_cq is the provider's entry point for this CQ.
        let rc = unsafe {
            let ops = &mut (*self.device.ctx).ops;
            match ops.req_notify_cq.as_mut() {
                Some(req) => req(self.cq, 0),
                None => {
                    return Err(TransferError::Unsupported(Missing::ProviderOp {
                        op: "req_notify_cq",
                    }))
                }
            }
        };
        if rc != 0 {
            return Err(errno_err("ibv_req_notify_cq", rc));
        }
        Ok(())
    }

    /// Read and acknowledge every pending channel event (none is fine: the
    /// fd's readiness may be stale).
    fn drain_events(&mut self) -> Result<(), TransferError> {
        loop {
            let mut cq: *mut ffi::ibv_cq = std::ptr::null_mut();
            let mut ctx: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: the channel is live; the fd is non-blocking.
            let rc = unsafe { ffi::ibv_get_cq_event(self.channel, &mut cq, &mut ctx) };
            if rc != 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::WouldBlock {
                    return Ok(());
                }
                return Err(TransferError::io("ibv_get_cq_event", e));
            }
            // SAFETY: acknowledging the event just read, on its own CQ.
            unsafe { ffi::ibv_ack_cq_events(cq, 1) };
        }
    }

    /// Wait for completions: returns as soon as at least one (at most `max`)
    /// is reaped; `Timeout` when none arrives within `timeout`.
    pub async fn completions(
        &mut self,
        max: usize,
        timeout: Duration,
    ) -> Result<Vec<Completion>, TransferError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let got = self.poll_once(max)?;
            if !got.is_empty() {
                return Ok(got);
            }
            self.arm()?;
            // A completion may have landed between the poll and the arm.
            let got = self.poll_once(max)?;
            if !got.is_empty() {
                return Ok(got);
            }
            let Some(events) = self.events.as_ref() else {
                return Err(TransferError::io_other("completion channel", "closed"));
            };
            let mut guard = match tokio::time::timeout_at(deadline, events.readable()).await {
                Ok(g) => g.map_err(|e| TransferError::io("completion channel", e))?,
                Err(_) => {
                    return Err(TransferError::Timeout {
                        peer: "rdma".into(),
                        timeout_ms: timeout.as_millis() as u64,
                    })
                }
            };
            guard.clear_ready();
            drop(guard);
            self.drain_events()?;
        }
    }
}

//! The rdma transport's verbs layer (feature `rdma`): device discovery, memory
//! registration of segments (rkeys go into segment metadata), RC queue pairs
//! and one-sided RDMA READ/WRITE work requests. Waiting for completions is
//! `completions.rs`.
//!
//! Built on raw verbs (ibverbs-sys) because ibverbs 0.9's safe API can only
//! register memory it allocates itself and only posts SENDs. It compiles in CI;
//! it runs only where an RDMA NIC exists. With no device, discovery logs once
//! and the engine uses tcp. The engine side is beside it: the NIC and its
//! registrations (`nic.rs`), links and their exchange (`link.rs`), batches
//! (`batch.rs`).
//!
//! Each queue pair has its own completion queue and completion channel, so a
//! batch that owns a queue pair reaps exactly its own completions, and waits
//! for them on the channel's fd (tokio `AsyncFd`, `rdma/completions.rs`)
//! instead of spinning.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Once};

use ibverbs_sys as ffi;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::error::Missing;
use crate::segment::RdmaKey;
pub use crate::transport::tcp::protocol::RdmaEndpoint;
use crate::{OpKind, SharedRegion, TransferError};

const PORT_NUM: u8 = 1;
/// Work requests a queue pair holds (its completion queue holds as many).
pub const MAX_SEND_WR: u32 = 512;

static DISCOVERY: Once = Once::new();

/// Names of the RDMA devices on this host (empty when there are none).
pub fn device_names() -> Vec<String> {
    match ibverbs::devices() {
        Ok(list) => list
            .iter()
            .filter_map(|d| d.name().map(|n| n.to_string_lossy().into_owned()))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Log the RDMA devices found, once per process.
pub fn log_devices_once() {
    DISCOVERY.call_once(|| {
        let names = device_names();
        if names.is_empty() {
            tracing::info!("no RDMA device found; the transfer engine uses tcp");
        } else {
            tracing::info!(devices = ?names, "RDMA devices found");
        }
    });
}

fn os_err(what: &'static str) -> TransferError {
    TransferError::io(what, std::io::Error::last_os_error())
}

pub(super) fn errno_err(what: &'static str, errno: i32) -> TransferError {
    TransferError::io(what, std::io::Error::from_raw_os_error(errno))
}

/// A reaped work completion: its `wr_id` and outcome.
pub type Completion = (u64, Result<(), TransferError>);

/// One one-sided work request against a peer's registered memory.
#[derive(Debug, Clone, Copy)]
pub struct RdmaOp {
    pub kind: OpKind,
    pub local_offset: u64,
    pub remote: RdmaKey,
    pub remote_offset: u64,
    pub len: u32,
    pub wr_id: u64,
}

/// An opened device: context and protection domain.
pub struct RdmaDevice {
    pub(super) ctx: *mut ffi::ibv_context,
    pd: *mut ffi::ibv_pd,
    lid: u16,
    gid: [u8; 16],
    pub name: String,
}

// SAFETY: verbs objects are thread-safe per the libibverbs documentation.
unsafe impl Send for RdmaDevice {}
unsafe impl Sync for RdmaDevice {}

impl RdmaDevice {
    /// Open the first device (or the one named `want`).
    pub fn open(want: Option<&str>) -> Result<Arc<Self>, TransferError> {
        let mut n = 0i32;
        // SAFETY: plain verbs calls; every pointer is checked before use and
        // the device list is freed after the context is opened.
        unsafe {
            let list = ffi::ibv_get_device_list(&mut n);
            if list.is_null() || n <= 0 {
                if !list.is_null() {
                    ffi::ibv_free_device_list(list);
                }
                return Err(TransferError::Unsupported(Missing::RdmaDevice {
                    what: "no RDMA device",
                }));
            }
            let mut chosen = None;
            for i in 0..n as usize {
                let dev = *list.add(i);
                let name = CStr::from_ptr(ffi::ibv_get_device_name(dev))
                    .to_string_lossy()
                    .into_owned();
                if want.is_none_or(|w| w == name) {
                    chosen = Some((dev, name));
                    break;
                }
            }
            let Some((dev, name)) = chosen else {
                ffi::ibv_free_device_list(list);
                return Err(TransferError::Unsupported(Missing::RdmaDeviceNamed {
                    want: want.map(str::to_owned),
                }));
            };
            let ctx = ffi::ibv_open_device(dev);
            ffi::ibv_free_device_list(list);
            if ctx.is_null() {
                return Err(os_err("ibv_open_device"));
            }
            let mut port = ffi::ibv_port_attr::default();
            let rc = ffi::ibv_query_port(
                ctx,
                PORT_NUM,
                &mut port as *mut ffi::ibv_port_attr as *mut _,
            );
            if rc != 0 {
                ffi::ibv_close_device(ctx);
                return Err(errno_err("ibv_query_port", rc));
            }
            let mut gid = ffi::ibv_gid { raw: [0; 16] };
            // RoCE needs a GID; InfiniBand works with the LID alone.
            let gid = if ffi::ibv_query_gid(ctx, PORT_NUM, 0, &mut gid) == 0 {
                gid.raw
            } else {
                [0; 16]
            };
            let pd = ffi::ibv_alloc_pd(ctx);
            if pd.is_null() {
                ffi::ibv_close_device(ctx);
                return Err(os_err("ibv_alloc_pd"));
            }
            Ok(Arc::new(RdmaDevice {
                ctx,
                pd,
                lid: port.lid,
                gid,
                name,
            }))
        }
    }

    /// Register a segment's memory for local and remote READ/WRITE.
    pub fn register(
        self: &Arc<Self>,
        region: Arc<SharedRegion>,
    ) -> Result<RdmaMemory, TransferError> {
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ;
        // SAFETY: the region outlives the MR (RdmaMemory holds both).
        let mr = unsafe {
            ffi::ibv_reg_mr(
                self.pd,
                region.as_ptr().cast(),
                region.len(),
                access.0 as i32,
            )
        };
        if mr.is_null() {
            return Err(os_err("ibv_reg_mr"));
        }
        Ok(RdmaMemory {
            device: self.clone(),
            region,
            mr,
        })
    }
}

impl Drop for RdmaDevice {
    fn drop(&mut self) {
        // SAFETY: destroying what `open` created, in reverse order.
        unsafe {
            ffi::ibv_dealloc_pd(self.pd);
            ffi::ibv_close_device(self.ctx);
        }
    }
}

/// A segment registered with the NIC.
pub struct RdmaMemory {
    device: Arc<RdmaDevice>,
    region: Arc<SharedRegion>,
    mr: *mut ffi::ibv_mr,
}

// SAFETY: the MR is an immutable handle once registered.
unsafe impl Send for RdmaMemory {}
unsafe impl Sync for RdmaMemory {}

impl RdmaMemory {
    /// What a peer needs to address this memory (goes into segment metadata).
    pub fn key(&self) -> RdmaKey {
        // SAFETY: mr is valid while self lives.
        RdmaKey {
            addr: self.region.as_ptr() as u64,
            rkey: unsafe { (*self.mr).rkey },
        }
    }

    fn lkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr).lkey }
    }
}

impl Drop for RdmaMemory {
    fn drop(&mut self) {
        let _ = &self.device;
        // SAFETY: deregistering the MR created in `register`.
        unsafe {
            ffi::ibv_dereg_mr(self.mr);
        }
    }
}

/// The fd of a completion channel, for tokio's reactor.
pub(super) struct ChannelFd(RawFd);

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// A reliable-connected queue pair to one peer, with its own completion
/// queue and completion channel.
pub struct RcQueuePair {
    pub(super) device: Arc<RdmaDevice>,
    qp: *mut ffi::ibv_qp,
    pub(super) cq: *mut ffi::ibv_cq,
    pub(super) channel: *mut ffi::ibv_comp_channel,
    /// Readiness of the channel's fd; `None` only while dropping.
    pub(super) events: Option<AsyncFd<ChannelFd>>,
}

// SAFETY: posting to and polling a QP from one thread at a time is enforced
// by &mut self; verbs objects may move between threads.
unsafe impl Send for RcQueuePair {}

impl RcQueuePair {
    /// Create a QP in RESET state; send its [`Self::endpoint`] to the peer.
    /// Must run inside a tokio runtime (the completion channel registers with it).
    pub fn create(device: &Arc<RdmaDevice>) -> Result<Self, TransferError> {
        // SAFETY: plain verbs calls on a live context; every object created is
        // destroyed on the error paths below or by Drop.
        let (channel, cq) = unsafe {
            let channel = ffi::ibv_create_comp_channel(device.ctx);
            if channel.is_null() {
                return Err(os_err("ibv_create_comp_channel"));
            }
            let fd = (*channel).fd;
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
                let e = os_err("fcntl(O_NONBLOCK) on the completion channel");
                ffi::ibv_destroy_comp_channel(channel);
                return Err(e);
            }
            let cq = ffi::ibv_create_cq(
                device.ctx,
                MAX_SEND_WR as i32,
                std::ptr::null_mut(),
                channel,
                0,
            );
            if cq.is_null() {
                let e = os_err("ibv_create_cq");
                ffi::ibv_destroy_comp_channel(channel);
                return Err(e);
            }
            (channel, cq)
        };
        // From here on Drop cleans up whatever exists.
        let mut this = RcQueuePair {
            device: device.clone(),
            qp: std::ptr::null_mut(),
            cq,
            channel,
            events: None,
        };
        // SAFETY: the channel is live until Drop.
        let fd = unsafe { (*channel).fd };
        // SAFETY: the fd stays open while the AsyncFd lives: Drop takes the
        // AsyncFd out before destroying the channel that owns the fd.
        let events = unsafe { AsyncFd::register_with_interest(ChannelFd(fd), Interest::READABLE) }
            .map_err(|e| TransferError::io("completion channel register", e.into()))?;
        this.events = Some(events);
        let mut init = ffi::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq,
            recv_cq: cq,
            srq: std::ptr::null_mut(),
            cap: ffi::ibv_qp_cap {
                max_send_wr: MAX_SEND_WR,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: pd and cq are live for as long as `device`.
        this.qp = unsafe { ffi::ibv_create_qp(device.pd, &mut init) };
        if this.qp.is_null() {
            return Err(os_err("ibv_create_qp"));
        }
        Ok(this)
    }

    /// This end's address.
    pub fn endpoint(&self) -> RdmaEndpoint {
        // SAFETY: qp is valid while self lives.
        RdmaEndpoint {
            qp_num: unsafe { (*self.qp).qp_num },
            lid: self.device.lid,
            gid: self.device.gid,
        }
    }

    /// Move the QP through INIT, RTR and RTS towards `remote`.
    pub fn connect(&mut self, remote: RdmaEndpoint) -> Result<(), TransferError> {
        use ffi::ibv_qp_attr_mask as M;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: PORT_NUM,
            qp_access_flags: (ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
                | ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE)
                .0,
            ..Default::default()
        };
        self.modify(
            &mut attr,
            M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS,
            "ibv_modify_qp to INIT",
        )?;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: ffi::IBV_MTU_1024,
            dest_qp_num: remote.qp_num,
            rq_psn: 0,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
            ah_attr: ffi::ibv_ah_attr {
                dlid: remote.lid,
                port_num: PORT_NUM,
                ..Default::default()
            },
            ..Default::default()
        };
        if remote.gid != [0; 16] {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid = ffi::ibv_gid { raw: remote.gid };
            attr.ah_attr.grh.hop_limit = 0xff;
            attr.ah_attr.grh.sgid_index = 0;
        }
        self.modify(
            &mut attr,
            M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER,
            "ibv_modify_qp to RTR",
        )?;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            sq_psn: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
            ..Default::default()
        };
        self.modify(
            &mut attr,
            M::IBV_QP_STATE
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_MAX_QP_RD_ATOMIC,
            "ibv_modify_qp to RTS",
        )
    }

    /// `ibv_modify_qp`; `op` names the call and the state it moves to.
    fn modify(
        &mut self,
        attr: &mut ffi::ibv_qp_attr,
        mask: ffi::ibv_qp_attr_mask,
        op: &'static str,
    ) -> Result<(), TransferError> {
        // SAFETY: valid QP and attribute struct.
        let rc = unsafe { ffi::ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        if rc != 0 {
            return Err(errno_err(op, rc));
        }
        Ok(())
    }

    /// Post one signaled one-sided op: READ pulls `remote[remote_offset..+len]`
    /// into `local[local_offset..]`, WRITE pushes the other way. Its completion
    /// (with `op.wr_id`) comes from [`RdmaDevice::poll`].
    pub fn post(&mut self, local: &RdmaMemory, op: RdmaOp) -> Result<(), TransferError> {
        let RdmaOp {
            kind,
            local_offset,
            remote,
            remote_offset,
            len,
            wr_id,
        } = op;
        crate::segment::check_range(&local.region, local_offset, u64::from(len))?;
        let mut sge = ffi::ibv_sge {
            addr: local.region.as_ptr() as u64 + local_offset,
            length: len,
            lkey: local.lkey(),
        };
        // SAFETY: a zeroed work request is valid; the fields used are set below.
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = match kind {
            OpKind::Read => ffi::ibv_wr_opcode::IBV_WR_RDMA_READ,
            OpKind::Write => ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        };
        wr.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
            remote_addr: remote.addr + remote_offset,
            rkey: remote.rkey,
        };
        let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: post_send is the provider's entry point for this QP; sge
        // and wr live until the call returns (the NIC reads them then).
        let rc = unsafe {
            let ops = &mut (*self.device.ctx).ops;
            match ops.post_send.as_mut() {
                Some(post) => post(self.qp, &mut wr, &mut bad),
                None => {
                    return Err(TransferError::Unsupported(Missing::ProviderOp {
                        op: "post_send",
                    }))
                }
            }
        };
        if rc != 0 {
            return Err(errno_err("ibv_post_send", rc));
        }
        Ok(())
    }
}

impl Drop for RcQueuePair {
    fn drop(&mut self) {
        // Deregister the fd from tokio before the channel (its owner) goes.
        drop(self.events.take());
        // SAFETY: destroying what `create` made, QP first (no more DMA on
        // behalf of this QP once it returns), then its CQ (every event was
        // acknowledged when read), then the channel.
        unsafe {
            if !self.qp.is_null() {
                ffi::ibv_destroy_qp(self.qp);
            }
            ffi::ibv_destroy_cq(self.cq);
            ffi::ibv_destroy_comp_channel(self.channel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_without_a_device_is_an_error_not_a_panic() {
        log_devices_once();
        if device_names().is_empty() {
            assert!(matches!(
                RdmaDevice::open(None),
                Err(TransferError::Unsupported(Missing::RdmaDevice { .. }))
            ));
        }
    }
}

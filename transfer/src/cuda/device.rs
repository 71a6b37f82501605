//! `GpuDevice`: one CUDA context with a dedicated copy stream per direction
//! (host to device, device to host), so uploads, downloads and the engine's
//! kernels (on streams of their own) overlap on the copy engines; and
//! `GpuEvent`, an owned CUDA event.

use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaStream};

use super::cuda_err;
use crate::error::Missing;
use crate::TransferError;

fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library.
    unsafe { sys::is_culib_present() }
}

/// Number of CUDA devices, or `Unsupported` when there is no driver.
pub fn device_count() -> Result<usize, TransferError> {
    if !driver_present() {
        return Err(TransferError::Unsupported(Missing::CudaDriver));
    }
    CudaContext::device_count()
        .map(|n| n as usize)
        .map_err(cuda_err)
}

/// One GPU: its primary context and the two copy streams.
pub struct GpuDevice {
    ctx: Arc<CudaContext>,
    h2d: Arc<CudaStream>,
    d2h: Arc<CudaStream>,
}

impl GpuDevice {
    /// Open device `ordinal` (its primary context) and create the copy streams.
    pub fn open(ordinal: usize) -> Result<Arc<Self>, TransferError> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(TransferError::Unsupported(Missing::CudaDevice {
                ordinal,
                count,
            }));
        }
        let ctx = CudaContext::new(ordinal).map_err(cuda_err)?;
        let h2d = ctx.new_stream().map_err(cuda_err)?;
        let d2h = ctx.new_stream().map_err(cuda_err)?;
        Ok(Arc::new(GpuDevice { ctx, h2d, d2h }))
    }

    /// The context (for kernels: modules load into it).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Make the context current on the calling thread (every raw driver call
    /// needs it; cheap when it already is).
    pub fn bind(&self) -> Result<(), TransferError> {
        self.ctx.bind_to_thread().map_err(cuda_err)
    }

    /// The host-to-device copy stream.
    pub fn h2d(&self) -> &Arc<CudaStream> {
        &self.h2d
    }

    /// The device-to-host copy stream.
    pub fn d2h(&self) -> &Arc<CudaStream> {
        &self.d2h
    }

    /// A new stream of its own (an engine's compute, a bench's peer copies).
    pub fn new_stream(&self) -> Result<Arc<CudaStream>, TransferError> {
        self.ctx.new_stream().map_err(cuda_err)
    }

    /// A new stream of the highest priority the device has: when SMs free
    /// up, its blocks are scheduled before those of ordinary streams (the
    /// fabric's own small kernels, e.g. a promotion's hash, go through
    /// between an engine's kernels instead of queuing behind them).
    pub fn new_urgent_stream(&self) -> Result<Arc<CudaStream>, TransferError> {
        self.bind()?;
        let (_, greatest) = result::stream::get_priority_range().map_err(cuda_err)?;
        self.ctx
            .new_stream_with_priority(greatest)
            .map_err(cuda_err)
    }

    /// The device's name, e.g. "NVIDIA H100 80GB HBM3".
    pub fn name(&self) -> String {
        self.ctx.name().unwrap_or_else(|e| format!("unknown ({e})"))
    }

    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize), TransferError> {
        self.ctx.mem_get_info().map_err(cuda_err)
    }
}

/// An owned CUDA event (destroyed on drop). Records with timing off unless
/// made by [`GpuEvent::timed`].
pub struct GpuEvent {
    dev: Arc<GpuDevice>,
    event: sys::CUevent,
}

// SAFETY: a CUevent is a handle the driver lets any thread of the process use
// (with the context bound, which every method here does first).
unsafe impl Send for GpuEvent {}
unsafe impl Sync for GpuEvent {}

impl GpuEvent {
    /// An event for ordering only (no timing: cheaper to record and wait).
    pub fn new(dev: &Arc<GpuDevice>) -> Result<Self, TransferError> {
        Self::with_flags(dev, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
    }

    /// An event that can time (`elapsed_ms`).
    pub fn timed(dev: &Arc<GpuDevice>) -> Result<Self, TransferError> {
        Self::with_flags(dev, sys::CUevent_flags::CU_EVENT_DEFAULT)
    }

    fn with_flags(dev: &Arc<GpuDevice>, flags: sys::CUevent_flags) -> Result<Self, TransferError> {
        dev.bind()?;
        let event = result::event::create(flags).map_err(cuda_err)?;
        Ok(GpuEvent {
            dev: dev.clone(),
            event,
        })
    }

    /// Record the event on `stream`: it completes once the work queued there before it does.
    pub fn record(&self, stream: &CudaStream) -> Result<(), TransferError> {
        self.dev.bind()?;
        // SAFETY: a live event of this context and a live stream.
        unsafe { result::event::record(self.event, stream.cu_stream()) }.map_err(cuda_err)
    }

    /// Make `stream` wait for the event (as last recorded) before its later work.
    pub fn make_wait(&self, stream: &CudaStream) -> Result<(), TransferError> {
        self.dev.bind()?;
        // SAFETY: a live event of this context and a live stream.
        unsafe {
            result::stream::wait_event(
                stream.cu_stream(),
                self.event,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(cuda_err)
    }

    /// Block the calling thread until the event completes.
    pub fn wait(&self) -> Result<(), TransferError> {
        self.dev.bind()?;
        // SAFETY: a live event.
        unsafe { result::event::synchronize(self.event) }.map_err(cuda_err)
    }

    /// Milliseconds from `self` to `end` (both timed and completed).
    pub fn elapsed_ms(&self, end: &GpuEvent) -> Result<f32, TransferError> {
        self.dev.bind()?;
        // SAFETY: live events of one context.
        unsafe { result::event::elapsed(self.event, end.event) }.map_err(cuda_err)
    }
}

impl Drop for GpuEvent {
    fn drop(&mut self) {
        if self.dev.bind().is_ok() {
            // SAFETY: our event, destroyed once; nothing waits on it any more.
            let _ = unsafe { result::event::destroy(self.event) };
        }
    }
}

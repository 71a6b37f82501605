//! GPU device memory for the fabric (feature `cuda`): the device and its
//! copy streams, pinned host buffers, device segments, the pinned staging
//! pool every host <-> VRAM copy goes through, and the small NVRTC kernels
//! that consume blocks on the GPU.
//!
//! The CUDA driver (and NVRTC) are loaded at run time (cudarc
//! `dynamic-loading`), so this builds without a toolkit, and on a host
//! without the driver every call returns `Unsupported("no CUDA device ...")`
//! instead of panicking.
//!
//! Device memory is handled by raw device pointers (`CUdeviceptr`) inside
//! owned types that free on drop, not by cudarc's `CudaSlice`: one segment
//! is read and written by several streams at once (a copy per direction,
//! the engine's compute), and cudarc's per-slice event tracking would order
//! every use of the segment behind every other. The owners here order what
//! must be ordered with their own events (`staging`).
//!
//! Layout: `device` (context, the copy stream of each direction, events),
//! `pinned` (page-locked host buffers), `segment` (a device allocation),
//! `staging` (the pool of pinned slices and the pipelined copies through it),
//! `kernels` (NVRTC-compiled block digest and the overlap probe), `xxh3`
//! (the block checksum computed on the device), `pool` (the slot pool the
//! staging slices and the hash slots are shared through).

mod device;
pub mod kernels;
mod pinned;
mod pool;
mod segment;
mod staging;
mod xxh3;

pub use device::{device_count, GpuDevice, GpuEvent};
pub use pinned::{HostRegistration, PinnedBuf};
pub use segment::VramSegment;
pub use staging::StagingPool;
pub use xxh3::DeviceXxh3;

use crate::TransferError;

/// Compile CUDA C `source` to PTX with NVRTC, or `Unsupported(Nvrtc)` when
/// the library is not on the host (cudarc would panic on the first call).
pub(crate) fn compile(source: &str) -> Result<cudarc::nvrtc::Ptx, TransferError> {
    // SAFETY: only tries to dlopen the NVRTC library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(TransferError::Unsupported(crate::error::Missing::Nvrtc));
    }
    cudarc::nvrtc::compile_ptx(source).map_err(|e| TransferError::io_other("nvrtc", e))
}

/// A CUDA error as a transfer error (`Io` of kind other, "cuda: ...",
/// holding the driver's error).
pub(crate) fn cuda_err(e: impl std::error::Error + Send + Sync + 'static) -> TransferError {
    TransferError::io_other("cuda", e)
}

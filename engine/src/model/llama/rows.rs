//! Row-wise work spread over the compute pool ([`for_rows`]), the FFN's
//! row slice, and giving a large pass's freed buffers back to the OS.

use crate::kernels::Compute;

/// Rows per FFN slice.
pub(super) const FFN_ROWS: usize = 256;

pub(super) struct SendPtr(pub(super) *mut f32);
// SAFETY: tasks write disjoint rows/heads through it.
unsafe impl Sync for SendPtr {}

/// The body of [`for_rows`]: first row index, then those rows of each buffer.
type RowFn<'a> = dyn Fn(usize, &mut [f32], &mut [f32]) + Sync + 'a;

/// `f(r0, a_rows, b_rows)` for groups of `per_task` rows of `a` (rows of `wa`
/// floats) and `b` (rows of `wb`), groups spread over the pool. Row-wise
/// steps (norms, SwiGLU) of a batch-8 decode step took ~8% of it on the
/// calling thread alone, one row per call. Norms take
/// [`crate::kernels::NORM_ROWS`] rows per task ([`crate::kernels::rms_norm`]
/// interleaves them), so a decode batch of up to 8 rows is
/// one task, run on the calling thread.
pub(super) fn for_rows(
    cx: &Compute,
    per_task: usize,
    (a, wa): (&mut [f32], usize),
    (b, wb): (&mut [f32], usize),
    f: &RowFn<'_>,
) {
    let rows = a.len() / wa;
    assert!(
        a.len() == rows * wa && b.len() == rows * wb && per_task > 0,
        "for_rows shapes"
    );
    let (pa, pb) = (SendPtr(a.as_mut_ptr()), SendPtr(b.as_mut_ptr()));
    cx.pool.run(rows.div_ceil(per_task), &|task| {
        let (pa, pb) = (&pa, &pb);
        let r0 = task * per_task;
        let n = per_task.min(rows - r0);
        // SAFETY: rows r0..r0+n of each buffer are in bounds (checked above)
        // and only this task touches them.
        let (ra, rb) = unsafe {
            (
                std::slice::from_raw_parts_mut(pa.0.add(r0 * wa), n * wa),
                std::slice::from_raw_parts_mut(pb.0.add(r0 * wb), n * wb),
            )
        };
        f(r0, ra, rb)
    });
}

/// Forward passes of at least this many rows (prefill chunks) hand their
/// freed activation buffers back to the OS afterwards: glibc keeps freed heap
/// memory for reuse, and after a 2048-token prefill (~27 MB of buffers)
/// `bench engine` measured 1.6 MB more resident without this. Decode steps
/// (a few rows) skip it.
pub(super) const RETURN_SCRATCH_ROWS: usize = 256;

/// Give free heap pages back to the OS (glibc `malloc_trim`; a no-op elsewhere).
pub(super) fn return_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: malloc_trim only releases memory malloc holds as free.
        unsafe { malloc_trim(0) };
    }
}

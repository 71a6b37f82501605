//! What the kernels ask the memory system for before they need it.
//!
//! Two kinds of request. **Weight streams**: a matmul kernel asks for the
//! chunk [`PREFETCH_CHUNKS`] ahead of the one it consumes, spread over its
//! inner loop. **Side lines** ([`SideLines`]): memory a *later* step will
//! read, requested while a compute-bound matmul runs, so that the transfer
//! overlaps arithmetic instead of stalling the step that reads it. The
//! forward pass uses them for the next layer's KV during a decode batch's
//! attn_out, gate_up and down matmuls: attention over f32 KV is bound by
//! memory (a batch-8 decode step of the reference model reads ~60 MB of
//! KV), while those matmuls leave the memory system mostly idle. A prefetch
//! never faults, whatever the address, and changes no value: results are the
//! same bits with or without.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Chunks ahead of the one being consumed whose cache lines are requested:
/// without it a decode step waited on memory latency (decode batch 1 on a
/// Xeon with AVX-512: ~100 -> ~150 tok/s).
#[cfg(target_arch = "x86_64")]
const PREFETCH_CHUNKS: usize = 4;

/// Ask for the cache lines of the chunk [`PREFETCH_CHUNKS`] ahead of `c`
/// (`cb` bytes). Past the tile's end that is the next tile, usually this
/// thread's next task.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn prefetch_ahead(c: *const u8, cb: usize) {
    let ahead = c.wrapping_add(PREFETCH_CHUNKS * cb);
    for line in (0..cb).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8);
    }
}

/// Step `step` of `steps` of [`prefetch_ahead`]: the same lines, spread over
/// a chunk's inner loop so requests leave at the pace the kernel consumes
/// data. Issued in one burst, 20-34 lines filled the line-fill buffers and
/// the loop stalled behind its own prefetches (in a batch-8 decode step
/// ~20% of the Q4_1 and ~40% of the Q8_0 kernels' samples sat on them).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn prefetch_ahead_step(c: *const u8, cb: usize, step: usize, steps: usize) {
    let ahead = c.wrapping_add(PREFETCH_CHUNKS * cb);
    // Step s takes lines s, s + steps, ...: one or two lines, no division.
    let mut line = 64 * step;
    while line < cb {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8);
        line += 64 * steps;
    }
}

/// Spans of memory, all `span_bytes` long, that a later step will read; a
/// matmul given them spreads their cache lines over its tasks and requests
/// them into L2 as it goes (see the module doc).
#[derive(Debug, Default)]
pub struct SideLines {
    starts: Vec<*const u8>,
    span_lines: usize,
}

// SAFETY: the addresses are only handed to prefetch instructions, which never
// read or write through them observably and never fault.
unsafe impl Send for SideLines {}
unsafe impl Sync for SideLines {}

impl SideLines {
    /// No side lines.
    pub fn none() -> SideLines {
        SideLines::default()
    }

    /// An empty list of spans of `span_bytes` each.
    pub fn with_span_bytes(span_bytes: usize) -> SideLines {
        SideLines {
            starts: Vec::new(),
            span_lines: span_bytes.div_ceil(64),
        }
    }

    /// Add the span starting at `start`.
    pub fn push(&mut self, start: *const u8) {
        self.starts.push(start);
    }

    /// Cache lines in all spans.
    pub fn lines(&self) -> usize {
        self.starts.len() * self.span_lines
    }

    /// Split into parts of about `weights[i] / sum(weights)` of the lines
    /// each, for several matmuls in a row: part `i` holds the same slice of
    /// every span (so, like the whole, its first tasks get the first spans).
    pub fn split(&self, weights: &[usize]) -> Vec<SideLines> {
        let total: usize = weights.iter().sum::<usize>().max(1);
        let mut cum = 0;
        weights
            .iter()
            .map(|w| {
                let l0 = self.span_lines * cum / total;
                cum += w;
                let l1 = self.span_lines * cum / total;
                SideLines {
                    starts: self
                        .starts
                        .iter()
                        .map(|s| s.wrapping_add(64 * l0))
                        .collect(),
                    span_lines: l1 - l0,
                }
            })
            .collect()
    }

    /// The lines of task `task` of `tasks`: an even, contiguous share, so
    /// the first tasks (the first thread's lane of the pool) get the first spans.
    pub(crate) fn share(&self, task: usize, tasks: usize) -> SideCursor<'_> {
        let (from, to) = (
            self.lines() * task / tasks.max(1),
            self.lines() * (task + 1) / tasks.max(1),
        );
        let span_lines = self.span_lines.max(1);
        SideCursor {
            starts: &self.starts,
            span_lines,
            span: from / span_lines,
            line: from % span_lines,
            left: to - from,
        }
    }
}

/// One task's share of a [`SideLines`], requested a few lines at a time.
pub(crate) struct SideCursor<'a> {
    starts: &'a [*const u8],
    span_lines: usize,
    span: usize,
    line: usize,
    left: usize,
}

impl SideCursor<'_> {
    /// Lines not yet requested.
    pub(crate) fn left(&self) -> usize {
        self.left
    }

    /// Request the next `n` lines (fewer at the end) into L2.
    #[inline(always)]
    pub(crate) fn issue(&mut self, n: usize) {
        for _ in 0..n.min(self.left) {
            let Some(&start) = self.starts.get(self.span) else {
                self.left = 0;
                return;
            };
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch never faults and has no visible effect.
            unsafe {
                _mm_prefetch::<_MM_HINT_T1>(start.wrapping_add(64 * self.line) as *const i8)
            };
            #[cfg(not(target_arch = "x86_64"))]
            let _ = start;
            self.left -= 1;
            self.line += 1;
            if self.line == self.span_lines {
                self.line = 0;
                self.span += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shares cover every line exactly once, in order, whatever the task count.
    #[test]
    fn shares_partition_the_lines() {
        let mut side = SideLines::with_span_bytes(3 * 64);
        let base = [0u8; 1];
        for i in 0..5 {
            side.push(base.as_ptr().wrapping_add(1000 * i));
        }
        for tasks in [1, 2, 3, 7, 20] {
            let mut seen = Vec::new();
            for t in 0..tasks {
                let c = side.share(t, tasks);
                let (mut span, mut line) = (c.span, c.line);
                for _ in 0..c.left() {
                    seen.push((span, line));
                    line += 1;
                    if line == 3 {
                        (span, line) = (span + 1, 0);
                    }
                }
                let mut c = side.share(t, tasks);
                c.issue(usize::MAX);
                assert_eq!(c.left(), 0);
            }
            let want: Vec<(usize, usize)> =
                (0..5).flat_map(|s| (0..3).map(move |l| (s, l))).collect();
            assert_eq!(seen, want, "tasks={tasks}");
        }
        let parts = side.split(&[1, 5, 3]);
        assert_eq!(
            parts.iter().map(SideLines::lines).sum::<usize>(),
            side.lines()
        );
        assert_eq!(parts[0].starts[2], side.starts[2]);
        assert_eq!(
            parts[2].starts[2],
            side.starts[2].wrapping_add(64 * parts[1].span_lines)
        );
        assert_eq!(SideLines::none().lines(), 0);
        SideLines::none().share(0, 4).issue(3);
    }
}
